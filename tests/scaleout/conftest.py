"""Fixtures for the scale-out tests: emulator processes (the emulator tests' `SimProc`), killed in teardown."""
from __future__ import annotations

import json

import pytest

from sim.simhelpers import MODEL, SimProc, free_port  # noqa: F401 - re-exported for the tests here


@pytest.fixture
def sim(tmp_path):
    """``sim(extra_argv, knobs=..., host=..., port=...)`` starts an emulator; all are killed afterwards."""
    procs: list[SimProc] = []

    def start(argv: list[str] | None = None, *, knobs: dict | None = None, host: str = "127.0.0.1",
              port: int | None = None) -> SimProc:
        port = port or free_port(host)
        env = {"SPARKCTL_SIM_BOOT_S": "0.3"}
        env.update({f"SPARKCTL_SIM_{k.upper()}": json.dumps(v) for k, v in (knobs or {}).items()})
        p = SimProc(["--model-path", MODEL, "--host", host, "--port", str(port), *(argv or [])], env, host, port)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.close()
