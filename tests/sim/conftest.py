"""Fixtures for the emulator tests: every process started is killed in teardown."""
from __future__ import annotations

import json

import pytest

from simhelpers import MODEL, SimProc, free_port

from testrig.priority import raised_priority


@pytest.fixture
def sim(tmp_path):
    """``sim(extra_argv, knobs=..., host=..., env=...)`` starts an emulator; all are killed afterwards."""
    procs: list[SimProc] = []

    def start(argv: list[str] | None = None, *, knobs: dict | None = None, host: str = "127.0.0.1",
              port: int | None = None, env: dict[str, str] | None = None, model: str = MODEL,
              config: dict | None = None) -> SimProc:
        port = port or free_port(host)
        e = {"SPARKCTL_SIM_BOOT_S": "0.3"}
        for k, v in (knobs or {}).items():
            e[f"SPARKCTL_SIM_{k.upper()}"] = json.dumps(v)
        if config is not None:
            path = tmp_path / f"sim-{len(procs)}.json"
            path.write_text(json.dumps(config))
            e["SPARKCTL_SIM_CONFIG"] = str(path)
        e.update(env or {})
        full = ["--model-path", model, "--host", host, "--port", str(port), *(argv or [])]
        p = SimProc(full, e, host, port)
        procs.append(p)
        return p

    with raised_priority():              # the client side of the timing tests measures in this thread
        yield start
    for p in procs:
        p.close()

