"""An exclusive lock between processes of this machine, waited for with a deadline (standard library only: the
real-engine build imports it with any python3, before sparkctl's venv exists). An flock: the kernel releases it
when its holder dies, so a killed holder never leaves it held. Linux only, as is this rig."""
from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(path: Path, timeout: float, *, poll_s: float = 0.2) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created 0600 if missing, never through a symlink) for the block; wait at
    most `timeout` s for it, then TimeoutError naming the file."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} was held by another process for more than {timeout:g} s") from None
                time.sleep(poll_s)
        yield
    finally:
        os.close(fd)
