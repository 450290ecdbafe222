"""One build of sparkctl's own wheel at a time on this machine.

`pip wheel <checkout>` has setuptools build inside the checkout (its ``build/`` directory and the egg-info beside the
sources), so two builds at once race there: a test cluster's engine image and the install tier's wheel, on two
pytest-xdist workers, once met as ``error: [Errno 2] No such file or directory`` while setuptools copied
``build/lib/sparkctl/...`` into ``build/bdist...`` that the other build had just removed (a whole run's four-node
tests errored at their cluster's bring-up). Every build of the checkout's wheel holds `checkout_build_lock()`.
"""
from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testrig.flock import exclusive

REPO = Path(__file__).resolve().parents[1]


def lock_path(checkout: Path = REPO) -> Path:
    """The lock file of one checkout (in the temp directory, never in the checkout: a build's files stay its own)."""
    key = hashlib.sha256(str(checkout.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"sparkctl-wheel-build-{key}.lock"


@contextmanager
def checkout_build_lock(checkout: Path = REPO, *, wait_s: float = 900.0) -> Iterator[None]:
    """Held while a wheel of `checkout` builds: any other build of it on this machine waits, at most `wait_s`
    (a build's own pip run is bounded at 600 s), then TimeoutError naming the lock (testrig.flock)."""
    with exclusive(lock_path(checkout), wait_s):
        yield
