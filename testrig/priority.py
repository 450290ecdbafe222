"""Run timing-measured processes ahead of CPU hogs (a shared, loaded test machine).

Tests that compare an emulator's timing with what a client measures (tests/bench_card, tests/sim)
measure the emulator's schedule *plus* how long the kernel left either process waiting for a CPU.
On a 2-core machine with load 6-12 that wait was 20-90 ms per request, and the known-answer checks
failed on it. Raising the scheduling priority of the emulator processes and of the measuring test
process removes that wait (a benchmark harness does the same); without the privilege (a non-root
laptop) nothing changes and the tests run as before.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

NICE = -10


def raise_priority(pid: int = 0, nice: int = NICE) -> bool:
    """Set ``pid``'s (0: the calling thread's) nice value; False when not permitted."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except (PermissionError, OSError):
        return False
    return True


def preexec_raise_priority() -> None:
    """``subprocess.Popen(preexec_fn=...)``: the child (and the threads it starts) run at NICE."""
    raise_priority(0)


@contextlib.contextmanager
def raised_priority(nice: int = NICE) -> Iterator[bool]:
    """The calling thread, and threads it starts meanwhile, at ``nice``; the previous value restored after."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    ok = raise_priority(0, nice)
    try:
        yield ok
    finally:
        if ok:
            raise_priority(0, before)
