"""An interrupt at any line of an engine's start: nothing of the deployment outlives the `up` it interrupted.

A signal handler's exception (the CLI's `Interrupted`: Ctrl-C, SIGTERM, SIGHUP) lands in the main thread at a line
boundary, and the one a parallel `up` raises in each replica's thread (`nodes.fanout`,
`PyThreadState_SetAsyncExc`) lands at the worker's next line: either can fall between an engine's start and the
line that records it (CI once left replica 0's rank 0 running that way). Generated here over every line run
between rank 0's fork (`subprocess.Popen._execute_child`: the child exists before `Popen` returns) and its entry
in the list of what started (through `ProcessRuntime.start` and the start loop of `deploy.boot.boot`), while rank
1 runs recorded, plus the line after rank 1's fork: a trace function raises `Interrupted` in the traced frame
right before that line, as CPython delivers those exceptions. Afterwards the `up` has raised it, no process of the
deployment runs (none writes to its rank logs, none is left in a session a pipe led), and the record says
canceled. (Lines before the fork start nothing; after the entry, the recorded stop has always covered it.)
"""
from __future__ import annotations

import inspect
import signal
import subprocess
import sys
from types import CodeType, FrameType
from typing import Any

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.deploy import boot as boot_module
from sparkctl.deploy.commands import Deployer, UpOptions
from sparkctl.deploy.observe import leftovers, process_engines
from sparkctl.errors import Interrupted
from sparkctl.nodes.process import ProcessRuntime
from sparkctl.state.ledger import Ledger
from sparkctl.state.records import Status


def _loop_lines() -> tuple[int, int]:
    """The first and last line of boot()'s start loop (from `for spec` to the "rank N started" event)."""
    lines, first = inspect.getsourcelines(boot_module.boot)
    start = next(i for i, text in enumerate(lines) if text.strip().startswith("for spec in"))
    end = next(i for i, text in enumerate(lines) if "started ({handle.where})" in text)
    return first + start, first + end


def _is_target(code: CodeType, loop: tuple[int, int]) -> bool:
    if code is ProcessRuntime.start.__code__ or code is subprocess.Popen._execute_child.__code__:  # type: ignore[attr-defined]
        return True
    if code is boot_module.boot.__code__:
        return True
    return code.co_name == "intent" and code.co_filename.endswith("deploy/apply.py")


class LineTrap:
    """Counts the line events of the start path; raises `Interrupted` right before line number `at` (or never)."""

    def __init__(self, at: int | None) -> None:
        self.at, self.seen, self.where = at, 0, ""
        self.trail: list[str] = []
        self.loop = _loop_lines()

    def _in_scope(self, frame: FrameType) -> bool:
        if frame.f_code is boot_module.boot.__code__:
            return self.loop[0] <= frame.f_lineno <= self.loop[1]
        return True

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call" or not _is_target(frame.f_code, self.loop):
            return None
        return self.local

    def local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and self._in_scope(frame):
            self.trail.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
            if self.seen == self.at:
                self.where = f"{frame.f_code.co_name}:{frame.f_lineno}"
                self.seen += 1
                raise Interrupted(signal.SIGINT, "SIGINT")
            self.seen += 1
        return self.local


def _up(inv, trap: LineTrap) -> None:
    profile = load_profile("d5")
    old = sys.gettrace()
    sys.settrace(trap)
    try:
        Deployer(load_inventory(inv)).up(profile, UpOptions())
    finally:
        sys.settrace(old)


def _fork_line() -> int:
    """The line of `Popen._execute_child` that forks the child (`self.pid = _fork_exec(...)`)."""
    lines, first = inspect.getsourcelines(subprocess.Popen._execute_child)  # type: ignore[attr-defined]
    return first + next(i for i, text in enumerate(lines) if "_fork_exec(" in text)


def _window(trail: list[str]) -> list[int]:
    """The points to interrupt at: every line event from the last fork (rank 0's pipe: rank 1 runs, recorded, by
    then) until rank 0 is in `started`, and the first line after rank 1's fork (its only engine unrecorded)."""
    fork = f"_execute_child:{_fork_line()}"
    lines, first = inspect.getsourcelines(boot_module.boot)
    append = f"boot:{first + next(i for i, text in enumerate(lines) if 'started.append(' in text)}"
    forks = [i for i, w in enumerate(trail) if w == fork]      # a statement over several lines: seen twice each
    assert forks, trail
    appended = trail.index(append, forks[-1])
    return [forks[len(forks) // 2 - 1] + 1, *range(forks[-1] + 1, appended + 2)]


def test_an_interrupt_at_every_line_between_a_start_and_its_record_leaves_nothing_running(local_cluster, state_dir):
    inv = local_cluster
    count = LineTrap(None)
    _up(inv, count)                     # one clean pass: the lines the start path runs, in order (both ranks)
    points = _window(count.trail)
    assert len(points) > 15, (points, count.trail)
    Deployer(load_inventory(inv)).down()
    ledger = Ledger.for_cluster(load_inventory(inv).cluster.name)
    missed = []
    for at in points:
        trap = LineTrap(at)
        with pytest.raises(Interrupted):
            _up(inv, trap)
        running = process_engines(Deployer(load_inventory(inv)))
        record = ledger.load(ledger.index()["history"][-1])
        left = leftovers(Deployer(load_inventory(inv)))
        if running or left or record.status != Status.CANCELED:
            missed.append((trap.where, [e.handle.pid for e in running], [lo.describe() for lo in left],
                           record.status))
            Deployer(load_inventory(inv)).down()      # the next point starts clean whatever this one left
    assert not missed, f"interrupted at these lines, engines outlived the up: {missed}"
    assert {count.trail[i].split(":")[0] for i in points} >= {"_execute_child", "start", "boot"}
