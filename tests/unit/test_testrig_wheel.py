"""testrig.wheel.checkout_build_lock: builds of one checkout's wheel never overlap, a killed holder never leaves the
lock held, and a wait is bounded."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from testrig.wheel import checkout_build_lock, lock_path

REPO = Path(__file__).resolve().parents[2]


def _holder(checkout: Path, marker: Path, hold_s: float) -> subprocess.Popen[bytes]:
    code = textwrap.dedent(f"""
        import time, pathlib
        from testrig.wheel import checkout_build_lock
        with checkout_build_lock(pathlib.Path({str(checkout)!r})):
            pathlib.Path({str(marker)!r}).write_text("held")
            time.sleep({hold_s})
    """)
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, "the holder never took the lock"
        time.sleep(0.05)


def test_a_second_build_waits_for_the_first(tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    proc = _holder(checkout, tmp_path / "held", 1.5)
    try:
        _wait_for(tmp_path / "held")
        t = time.monotonic()
        with checkout_build_lock(checkout):
            waited = time.monotonic() - t
        assert waited > 0.3, waited          # it was held: this one waited for the holder to finish
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == 0


def test_a_killed_holder_releases_it_and_a_wait_is_bounded(tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    proc = _holder(checkout, tmp_path / "held", 600)
    try:
        _wait_for(tmp_path / "held")
        with pytest.raises(TimeoutError, match=str(lock_path(checkout))), checkout_build_lock(checkout, wait_s=0.5):
            pass
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        with checkout_build_lock(checkout, wait_s=10):    # the kernel released the dead holder's lock
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_each_checkout_has_its_own_lock_outside_it(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert lock_path(a) != lock_path(b) and tmp_path not in lock_path(a).parents
