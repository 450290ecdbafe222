"""testrig.wheel.checkout_build_lock: builds of one checkout's wheel never overlap, a killed holder never leaves the
lock held, and a wait is bounded."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from testrig.wheel import checkout_build_lock, lock_path

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def _held(tmp_path: Path, hold_s: float) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """(checkout, the process) while another process holds the checkout's build lock for up to `hold_s`; that process
    is gone after the block (waited for, or killed if the block left it running)."""
    checkout, marker = tmp_path / "checkout", tmp_path / "held"
    checkout.mkdir()
    code = textwrap.dedent(f"""
        import time, pathlib
        from testrig.wheel import checkout_build_lock
        with checkout_build_lock(pathlib.Path({str(checkout)!r})):
            pathlib.Path({str(marker)!r}).write_text("held")
            time.sleep({hold_s})
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the holder never took the lock"
            time.sleep(0.05)
        yield checkout, proc
    finally:
        if hold_s > 60 and proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def test_a_second_build_waits_for_the_first(tmp_path):
    with _held(tmp_path, 1.5) as (checkout, proc):
        t = time.monotonic()
        with checkout_build_lock(checkout):
            waited = time.monotonic() - t
        assert waited > 0.3, waited          # it was held: this one waited for the holder to finish
    assert proc.returncode == 0


def test_a_killed_holder_releases_it_and_a_wait_is_bounded(tmp_path):
    with _held(tmp_path, 600) as (checkout, proc):
        with pytest.raises(TimeoutError, match=str(lock_path(checkout))), checkout_build_lock(checkout, wait_s=0.5):
            pass
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        with checkout_build_lock(checkout, wait_s=10):    # the kernel released the dead holder's lock
            pass


def test_each_checkout_has_its_own_lock_outside_it(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert lock_path(a) != lock_path(b) and tmp_path not in lock_path(a).parents
