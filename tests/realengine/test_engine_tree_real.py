"""Nothing of the real engine outlives its stop: real SGLang 0.5.23 TP=2 (two ranks on loopback, process runtime),
stopped at points of its boot and at each escalation.

Points (from the real ranks' own log lines, tests/fixtures/real-engine/0.5.23/tp2/):
* before the TCP store: both ranks started, rank 1 has not reached ``Init parallel begin.``; SIGTERM;
* inside the load barrier, rank 0 dying (what CI met: "TP rank 1 could finish the model loading, but there are
  other ranks that didn't finish loading") is tests/realengine/test_slow_rank_real.py, through `up` (rank 0 reads a
  model cut short and dies loading; rank 1 waits in the barrier; `up`'s stop leaves no process and no port): one
  real boot fewer than a point of its own here;
* after ready, stopped with no grace at all (the SIGKILL escalation straight away): the end of
  tests/realengine/test_slow_rank_real.py, on the deployment its last `up` made (one real boot fewer).
The graceful stop after ready is `down` in test_lifecycle_real.py (`test_down_leaves_no_process...`).

The check does not use the tracking under test: every process of both ranks' trees is listed (a walk of
/proc/PID/task/*/children from each log pipe) just before the stop, and afterwards none of those (pid, start time)
still runs, and the ranks' ports (API, the TCP store's 26000) are free.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.nodes.handles import ProcessHandle
from sparkctl.nodes.process import ProcessRuntime, local_port_free
from sparkctl.sglang.render import render
from testrig.embedded import write_real_engine_inventory
from testrig.sweep import port_holders, process_tree, still_running
from testrig.testenv import need_real_engine

pytestmark = pytest.mark.real_engine

POINTS = ("before-tcp-store",)


@pytest.fixture
def pair(tmp_path, monkeypatch):
    """start() -> (runtime, [rank 1 handle, rank 0 handle], ports): a real TP=2 pair started rank 1 first."""
    engine = need_real_engine()
    inv = load_inventory(write_real_engine_inventory(tmp_path / "inventory.yml", engine, prefix="t"))
    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    specs = sorted(render(load_profile("cpu-tiny"), inv, environ={}).specs, key=lambda s: -s.rank)
    rts: list[tuple[ProcessRuntime, ProcessHandle]] = []

    def start() -> tuple[list[tuple[ProcessRuntime, ProcessHandle]], list[tuple[str, int]]]:
        for spec in specs:
            node = inv.node(spec.node)
            rt = ProcessRuntime(tmp_path / "logs" / "dep-real", secrets_root=tmp_path / "secrets", engine="sglang",
                                engine_pythons={"sglang": str(engine.python)}, models_dir=node.host_paths.models)
            rts.append((rt, rt.start(spec, "dep-real")))
        return rts, [(a, p) for s in specs for a, p, _ in s.listen_ports()]
    yield start
    for rt, h in rts:
        rt.stop(h, timeout_s=2)


def _wait_log(handle: ProcessHandle, text: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in Path(handle.log).read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{text!r} never reached {handle.log}"
        time.sleep(0.2)


def _tree(handles: list[ProcessHandle]) -> list[tuple[int, int]]:
    return process_tree([h.pid for h in handles])


@pytest.mark.parametrize("point", POINTS)
def test_no_process_of_the_real_engine_outlives_its_stop(pair, point):
    rts, ports = pair()
    (rt1, r1), (rt0, r0) = rts
    assert point == "before-tcp-store"
    _wait_log(r1, "server_args=")
    assert "Init parallel begin" not in Path(r1.log).read_text(errors="replace")
    tree = _tree([r1, r0])
    rt0.stop(r0)
    rt1.stop(r1)
    left = still_running(tree)
    assert not left, f"{point}: left {left}"
    busy = [f"{a}:{p} ({'; '.join(port_holders(a, p))})" for a, p in ports if not local_port_free(a, p)]
    assert not busy, f"{point}: ports still held: {busy}"
    assert not rt0.leftovers([r0, r1]) and not rt1.leftovers([r0, r1])
