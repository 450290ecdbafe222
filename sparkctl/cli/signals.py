"""SIGINT, SIGTERM and SIGHUP all mean "stop, clean up, restore": the CLI raises `Interrupted` for each.

`timeout`, systemd and CI runners send SIGTERM, a closed terminal SIGHUP; each takes the same path as Ctrl-C
(the failed `up` stops what it started and restores the previous deployment), and the CLI exits 128 + the
signal number (130 SIGINT, 143 SIGTERM, 129 SIGHUP), the shell convention. A second signal during that
cleanup exits at once without finishing it (as Terraform does on a second Ctrl-C); the ledger's intent
records let the next `up`, `rollback` or `down` settle what was left. SIGKILL cannot be handled: that is what
the intent records are for.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from sparkctl.errors import Interrupted

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_received: list[int] = []


def _handler(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    if _received:
        print(f"sparkctl: {name} during cleanup: exiting now; the next `sparkctl up`, `rollback` or `down` "
              f"settles what was left", file=sys.stderr, flush=True)
        os._exit(128 + signum)
    _received.append(signum)
    # Said at once (a raw write: safe inside a handler, unlike print), before the cleanup that may take a while
    with contextlib.suppress(OSError):    # no terminal left (the SIGHUP of a closed one): the stop goes on
        os.write(2, f"sparkctl: {name}: stopping; what this command started is stopped or restored (a second "
                    f"signal exits at once)\n".encode())
    raise Interrupted(signum, name)


@contextmanager
def installed() -> Iterator[None]:
    """Handle SIGINT, SIGTERM and SIGHUP like Ctrl-C while inside; the caller's handlers come back after (main
    thread only: elsewhere, e.g. sparkctl called from a worker thread, the handlers are left alone)."""
    _received.clear()
    try:
        previous = {sig: signal.signal(sig, _handler) for sig in HANDLED}
    except ValueError:
        previous = {}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def exit_code() -> int:
    """128 + the first signal received (130 when it was Python's own SIGINT handling)."""
    return 128 + (_received[0] if _received else signal.SIGINT)


def name() -> str:
    return signal.Signals(_received[0]).name if _received else "SIGINT"
