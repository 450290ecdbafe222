"""An interrupt at any line of an engine's start: nothing of the deployment outlives the `up` it interrupted.

A signal handler's exception (the CLI's `Interrupted`: Ctrl-C, SIGTERM, SIGHUP) lands in the main thread at a line
boundary, and the one a parallel `up` raises in each replica's thread (`nodes.fanout`,
`PyThreadState_SetAsyncExc`) lands at the worker's next line: either can fall between an engine's start and the
line that records it (CI once left replica 0's rank 0 running that way). Generated here over every line run
between rank 0's fork (`subprocess.Popen._execute_child`: the child exists before `Popen` returns) and its entry
in the list of what started (through `ProcessRuntime.start` and the start loop of `deploy.boot._boot`), while rank
1 runs recorded, plus the line after rank 1's fork: a trace function raises `Interrupted` in the traced frame
right before that line, as CPython delivers those exceptions. Afterwards the `up` has raised it, no process of the
deployment runs (none writes to its rank logs, none is left in a session a pipe led), and the record says
canceled. (Lines before the fork start nothing; after the entry, the recorded stop has always covered it.)
"""
from __future__ import annotations

import subprocess

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.deploy import boot as boot_module
from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.commands import Deployer, UpOptions
from sparkctl.deploy.observe import leftovers, process_engines
from sparkctl.errors import Interrupted
from sparkctl.nodes.handles import ProcessHandle
from sparkctl.nodes.process import ProcessRuntime
from sparkctl.state.ledger import Ledger
from sparkctl.state.records import Status
from testrig.linetrap import LineTrap, Target, source_line

EXECUTE_CHILD = subprocess.Popen._execute_child  # type: ignore[attr-defined]


def _trap(at: int | None = None) -> LineTrap:
    loop = (source_line(boot_module._boot, "for spec, ahead in"),
            source_line(boot_module._boot, "started ({handle.where})"))
    return LineTrap([Target.code(ProcessRuntime.start.__code__), Target.code(EXECUTE_CHILD.__code__),
                     Target.code(boot_module._boot.__code__, loop), Target.named("intent", "deploy/apply.py")], at)


def _up(inv, trap: LineTrap) -> None:
    with trap.armed():
        Deployer(load_inventory(inv)).up(load_profile("d5"), UpOptions())


def _window(trail: list[str]) -> list[int]:
    """The points to interrupt at: every line event from the last fork (rank 0's pipe: rank 1 runs, recorded, by
    then) until rank 0 is in `started`, and the first line after rank 1's fork (its only engine unrecorded)."""
    fork = f"_execute_child:{source_line(EXECUTE_CHILD, '_fork_exec(')}"
    append = f"_boot:{source_line(boot_module._boot, 'started.append(')}"
    forks = [i for i, w in enumerate(trail) if w == fork]      # a statement over several lines: seen twice each
    assert forks, trail
    appended = trail.index(append, forks[-1])
    return [forks[len(forks) // 2 - 1] + 1, *range(forks[-1] + 1, appended + 2)]


def test_an_interrupt_at_every_line_between_a_start_and_its_record_leaves_nothing_running(local_cluster, state_dir):
    inv = local_cluster
    count = _trap()
    _up(inv, count)                     # one clean pass: the lines the start path runs, in order (both ranks)
    points = _window(count.trail)
    assert len(points) > 15, (points, count.trail)
    Deployer(load_inventory(inv)).down()
    ledger = Ledger.for_cluster(load_inventory(inv).cluster.name)
    missed = []
    for at in points:
        trap = _trap(at)
        with pytest.raises(Interrupted):
            _up(inv, trap)
        running = process_engines(Cluster(load_inventory(inv)))
        record = ledger.load(ledger.index()["history"][-1])
        left = leftovers(Cluster(load_inventory(inv)))
        if running or left or record.status != Status.CANCELED:
            pids = [e.handle.pid for e in running if isinstance(e.handle, ProcessHandle)]   # all are processes
            missed.append((trap.where, pids, [lo.describe() for lo in left], record.status))
            Deployer(load_inventory(inv)).down()      # the next point starts clean whatever this one left
    assert not missed, f"interrupted at these lines, engines outlived the up: {missed}"
    assert {count.trail[i].split(":")[0] for i in points} >= {"_execute_child", "start", "_boot"}
