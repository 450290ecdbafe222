"""CPU-bound neighbours for a test tier: a busy machine on demand (issue 31, "a slow node is not a broken one").

Why: CI on a shared 2-core machine once failed a real-engine TP=2 boot that passes on a quiet one. The real-engine
tier must pass beside other load, so a run can ask for that load: ``SPARKCTL_TEST_CPU_BURNERS=N`` (0-16) starts N
processes that each spin one core (``python -c 'while True: pass'``) for the whole session; tests/realengine's
conftest reads it. Unset or 0: none.

How the stop is guaranteed: each burner is a child of the test process with ``PR_SET_PDEATHSIG`` = SIGKILL (the
kernel kills it if pytest dies, even by SIGKILL) in a session of its own; ``cpu_burners`` SIGKILLs each by its pid
and reaps it when the block ends, whatever ended it. Nothing is found or killed by name.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

ENV = "SPARKCTL_TEST_CPU_BURNERS"
MAX_BURNERS = 16
_PR_SET_PDEATHSIG = 1
_SPIN = "while True: pass"


class BurnerSettingError(ValueError):
    """``SPARKCTL_TEST_CPU_BURNERS`` holds something other than a whole number 0-16."""


def burners_requested(environ: dict[str, str] | None = None) -> int:
    """How many burners the environment asks for (0 when unset or empty); a bad value is an error naming it."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not raw:
        return 0
    if not raw.isdigit() or int(raw) > MAX_BURNERS:
        raise BurnerSettingError(f"{ENV}={raw[:40]!r}: expected a whole number of CPU-bound processes, "
                                 f"0 to {MAX_BURNERS} (e.g. {ENV}=2)")
    return int(raw)


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@contextlib.contextmanager
def cpu_burners(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` processes spinning one core each while the block runs; every one is killed and reaped after it."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen([sys.executable, "-c", _SPIN], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True, preexec_fn=_die_with_parent))
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for proc in procs:
            proc.wait(timeout=30)
