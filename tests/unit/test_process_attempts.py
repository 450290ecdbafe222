"""Logs per boot attempt (process runtime): a restart of the same deployment (a restore, a rollback's restart)
reads only its own attempt's lines, so a fatal line an earlier attempt left (a traceback, half a line of a
SIGKILLed engine) never fails the new boot; and an engine killed by SIGKILL leaves no traceback of the pipe."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.deploy.boot import boot
from sparkctl.deploy.progress import Reporter
from sparkctl.nodes.process import ProcessRuntime
from sparkctl.sglang.render import render
from sparkctl.testing.embedded import write_embedded_inventory

FAST = {"boot_s": 0.3, "decode_tps": 4000, "peer_timeout_s": 2}
STALE = "Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


@pytest.fixture
def setup(tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    inv = load_inventory(write_embedded_inventory(tmp_path / "inventory.yml", FAST))
    specs = render(load_profile("d5"), inv, environ={}).specs
    rt = ProcessRuntime(tmp_path / "logs" / "dep-1", inv.cluster.sim, secrets_root=tmp_path / "secrets")
    started = []
    yield rt, specs, started
    for _, h in started:
        rt.stop(h, timeout_s=3)


def _boot(rt, specs, started):
    return boot(specs, lambda node: rt, "dep-1", Reporter(quiet=True), timeout_s=60, started=started)


def test_a_restart_reads_only_its_own_attempt(setup):
    rt, specs, started = setup
    first = _boot(rt, specs, started)
    for h in first.handles:
        rt.stop(h, timeout_s=5)
    for h in first.handles:           # what a crashed attempt can leave: a traceback, the last line cut short
        with open(h.log, "a") as fh:
            fh.write(STALE)
    second = _boot(rt, specs, started)              # would fail at once on the stale OOM without the offset
    for old, new in zip(sorted(first.handles, key=lambda h: h.rank), sorted(second.handles, key=lambda h: h.rank)):
        assert new.log == old.log and new.log_offset > old.log_offset
        whole = Path(new.log).read_text()
        assert whole.endswith("\n") and (STALE + "\n") in whole     # the cut line was ended, not glued to ours
        mine, _ = rt.read_log(new, 0)
        assert "Traceback" not in mine and "OutOfMemoryError" not in mine
        assert "server_args=ServerArgs(" in mine
        theirs, _ = rt.read_log(old, 0)
        assert "OutOfMemoryError" in theirs          # an earlier attempt's handle still reads its own lines


def test_an_engine_killed_by_sigkill_leaves_no_pipe_traceback(setup):
    rt, specs, started = setup
    result = _boot(rt, specs, started)
    h0 = next(h for h in result.handles if h.rank == 0)
    engine = int(Path(f"/proc/{h0.pid}/task/{h0.pid}/children").read_text().split()[0])
    os.kill(engine, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while rt.liveness(h0).alive and time.monotonic() < deadline:
        time.sleep(0.05)
    live = rt.liveness(h0)
    assert not live.alive and live.exit_code == -signal.SIGKILL, live
    text, _ = rt.read_log(h0, 0)
    assert "Traceback" not in text and "logpipe" not in text
