"""Nothing of an engine outlives its stop, generated over how a child escapes and how the engine ends.

Each point starts a hostile engine (testrig/hostile_engine.py) through the process runtime: children in a process
group of their own, deaf to SIGTERM, orphaned by a double fork, in a session of their own, holding a port; the
engine then exits by itself (a failed boot), is stopped while serving, is stopped while deaf to SIGTERM (the
escalation to SIGKILL), or its log pipe is SIGKILLed first (by the OOM killer, say) and the next command stops what
is left. Afterwards no process carrying the point's mark remains anywhere on the machine (found by a scan of every
command line, not by the tracking under test) and the port is free.

The CI failure this generalises: a TP=2 boot's rank died at SGLang's load barrier, the runtime stopped the rank,
and `sglang::scheduler_TP0` (holding *:26000), the detokenizer and the resource tracker lived on under init.
"""
from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.nodes import procfs
from sparkctl.nodes.enginegroup import EngineGroup, cgroups_writable
from sparkctl.nodes.handles import ProcessHandle
from sparkctl.nodes.process import ProcessRuntime
from sparkctl.sglang.render import render
from testrig import hostile_engine
from testrig.embedded import write_embedded_inventory
from testrig.testenv import free_port

# How the engine ends -> whether the test stops it or it exits by itself.
ENDS = ("exits-by-itself", "stopped", "stopped-deaf", "pipe-killed")
POINTS = [(kind, end) for kind in (*hostile_engine.CHILD_KINDS, "all") for end in ENDS]


def _cgroups() -> bool:
    return cgroups_writable()


def _marked(mark: str) -> list[str]:
    """Every process on the machine whose command line carries `mark` (zombies excluded)."""
    out = []
    for pid in procfs.pids():
        args = procfs.cmdline(pid)
        stat = procfs.proc_stat(pid)
        if mark in args and stat is not None and stat[0] != "Z":
            out.append(f"{pid} {' '.join(args)[:120]}")
    return out


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    """A process runtime whose engine is the hostile one; yields start(kinds) -> (runtime, handle, mark, port)."""
    inv = load_inventory(write_embedded_inventory(tmp_path / "inventory.yml", {"boot_s": 0.3}))
    spec = render(load_profile("dflash-off"), inv, environ={}).specs[-1]
    python = hostile_engine.install(tmp_path)
    rt = ProcessRuntime(tmp_path / "logs" / "dep-h", secrets_root=tmp_path / "secrets", engine="sglang",
                        engine_pythons={"sglang": str(python)})
    made: list[tuple[ProcessRuntime, ProcessHandle, str]] = []

    def start(kinds: list[str]) -> tuple[ProcessRuntime, ProcessHandle, str, int]:
        mark, port = f"hostile-{uuid.uuid4().hex[:12]}", free_port()
        monkeypatch.setenv("HOSTILE_TREE", ",".join(kinds))
        monkeypatch.setenv("HOSTILE_MARK", mark)
        monkeypatch.setenv("HOSTILE_PORT", str(port))
        handle = rt.start(spec, "dep-h")
        made.append((rt, handle, mark))
        deadline = time.monotonic() + 30
        while "children started" not in Path(handle.log).read_text(errors="replace"):
            assert time.monotonic() < deadline, Path(handle.log).read_text(errors="replace")
            time.sleep(0.05)
        want = 0 if "main-exits" in kinds else sum(1 for k in kinds if k in hostile_engine.CHILD)
        while len(_marked(mark)) < want:       # the orphan's second process is in place too
            assert time.monotonic() < deadline, _marked(mark)
            time.sleep(0.05)
        return rt, handle, mark, port
    yield start
    for rt_, handle, mark in made:            # never leave a hostile tree behind, whatever the assertion said
        rt_.stop(handle, timeout_s=1)
        for line in _marked(mark):
            os.kill(int(line.split()[0]), signal.SIGKILL)
        if handle.cgroup:
            EngineGroup(0, None, handle.cgroup).wait_gone(5)
            EngineGroup(0, None, handle.cgroup).release()


@pytest.mark.parametrize(("kind", "end"), POINTS, ids=[f"{k}-{e}" for k, e in POINTS])
def test_no_process_of_an_engine_outlives_it(hostile, kind, end):
    kinds = list(hostile_engine.CHILD_KINDS) if kind == "all" else [kind]
    if "port" not in kinds:
        kinds.append("port")                   # every point also holds a port, as the scheduler held 26000
    if kind in ("setsid", "all") and end == "pipe-killed" and not _cgroups():
        # A process that left the engine's session, after the subreaper above it was SIGKILLed, is held by nothing
        # but a cgroup. CI runs as root with a writable cgroup v2: there it must be tested.
        if os.environ.get("CI") == "true":
            pytest.fail("no writable cgroup v2 under CI=true: the setsid-after-pipe-kill point cannot be tested")
        pytest.skip("no writable cgroup v2 here (not root?): a setsid-ed orphan of a SIGKILLed pipe is untracked")
    kinds.append({"exits-by-itself": "main-exits", "stopped-deaf": "main-deaf"}.get(end, "main-serves"))
    rt, handle, mark, port = hostile(kinds)
    if "shm" in kinds and end != "exits-by-itself":
        assert Path(f"/dev/shm/{mark}-shm").exists(), "the hostile child never mapped its shared memory"
    t0 = time.monotonic()
    if end == "exits-by-itself":
        deadline = time.monotonic() + 30
        while rt.liveness(handle).alive:        # the pipe stops what the engine left, then exits itself
            assert time.monotonic() < deadline, _marked(mark)
            time.sleep(0.05)
        assert not _marked(mark), "the pipe exited but the engine's children live on"
        assert "stopped" in Path(handle.log).read_text() and "processes it left" in Path(handle.log).read_text()
    elif end == "pipe-killed":
        hostile_engine.kill_pipe(rt, handle)
        left = rt.leftovers([handle])           # what `status`, preflight and doctor name
        assert left and left[0].deployment == "dep-h" and left[0].rank == handle.rank, left
        assert "rank" in left[0].describe() and "dep-h" in left[0].describe()
        rt.stop(handle, timeout_s=3)
    else:
        rt.stop(handle, timeout_s=3)
    took = time.monotonic() - t0
    assert not _marked(mark), f"left after {end}: {_marked(mark)}"
    assert _port_free(port), f"port {port} still held after {end}"
    shm = Path(f"/dev/shm/{mark}-shm")
    assert not shm.exists(), f"{shm} (mapped by the engine's child) outlived the engine after {end}"
    assert not procfs.running(handle.pid, handle.start_ticks)
    assert rt.leftovers([handle]) == []
    if handle.cgroup:
        assert not Path(handle.cgroup).exists(), "the engine's cgroup stays after its stop"
    assert took < 15, f"{end} took {took:.1f} s: every stop is bounded (3 s grace + 5 s kill)"


def test_a_cgroup_names_a_leftover_that_no_record_knows(hostile):
    """A controller killed before it recorded the handle, then the pipe killed: the engine's cgroup still says whose
    processes these are."""
    if not _cgroups():
        if os.environ.get("CI") == "true":
            pytest.fail("no writable cgroup v2 under CI=true")
        pytest.skip("no writable cgroup v2 here")
    rt, handle, mark, _ = hostile(["group", "setsid", "main-serves"])
    hostile_engine.kill_pipe(rt, handle)
    left = rt.leftovers([])
    assert [(lo.deployment, lo.rank) for lo in left] == [("dep-h", handle.rank)], left
    assert left[0].stop() == []
    assert not _marked(mark)
