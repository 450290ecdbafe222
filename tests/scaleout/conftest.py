"""Fixtures for the scale-out tests: no router outlives its test (emulators: the `sim` fixture, tests/conftest.py)."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest


def _routers_of(state: str) -> list[int]:
    """sglang-router processes (process title `sglang::router`) whose output goes to a log under this state
    directory (setproctitle overwrites the process's argv and environ, so its stdout is what tells whose it is)."""
    from sparkctl.router.process import PROCESS_TITLE
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if not (d / "cmdline").read_bytes().startswith(PROCESS_TITLE.encode()):
                continue
            out = os.readlink(d / "fd" / "1")
        except OSError:
            continue
        if out.startswith(state.rstrip("/") + "/"):
            found.append(int(d.name))
    return found


@pytest.fixture(autouse=True)
def no_router_outlives_its_test(monkeypatch, tmp_path):
    """A router this test started (a state directory in the test's own tmp_path; a module's shared deployment is
    its fixture's) must be stopped by the test's own `down`: one left running is a leak sparkctl would leave on a
    user's machine too. Killed, then the test fails."""
    yield
    left = _routers_of(str(tmp_path))
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"router process(es) {left} outlived the test ({tmp_path})"
