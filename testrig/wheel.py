"""One build of sparkctl's own wheel at a time on this machine.

`pip wheel <checkout>` has setuptools build inside the checkout (its ``build/`` directory and the egg-info beside the
sources), so two builds at once race there: a test cluster's engine image and the install tier's wheel, on two
pytest-xdist workers, once met as ``error: [Errno 2] No such file or directory`` while setuptools copied
``build/lib/sparkctl/...`` into ``build/bdist...`` that the other build had just removed (a whole run's four-node
tests errored at their cluster's bring-up). Every build of the checkout's wheel holds `checkout_build_lock()`.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def lock_path(checkout: Path = REPO) -> Path:
    """The lock file of one checkout (in the temp directory, never in the checkout: a build's files stay its own)."""
    key = hashlib.sha256(str(checkout.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"sparkctl-wheel-build-{key}.lock"


@contextmanager
def checkout_build_lock(checkout: Path = REPO, *, wait_s: float = 900.0) -> Iterator[None]:
    """Held while a wheel of `checkout` builds: any other build of it on this machine waits, at most `wait_s`
    (a build's own pip run is bounded at 600 s), then TimeoutError naming the lock. An flock: the kernel releases it
    when its holder dies, so a killed build never leaves it held."""
    path = lock_path(checkout)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another build of {checkout}'s wheel held {path} for {wait_s:g} s") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)
