"""The state directory full or read-only: a changing command refuses before any effect (exit 6, the threshold
and why), and nothing is left running. Needs root for a small tmpfs (skipped off-root, failed under CI=true)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkctl.deploy.cluster import ROOM_BYTES


def _root_or_skip() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the state-directory tests need root (a small tmpfs) and CI runs them")
        pytest.skip("needs root to mount a small tmpfs as the state directory")


@pytest.fixture
def small_state(tmp_path, local_cluster, monkeypatch):
    _root_or_skip()
    mnt = tmp_path / "small"
    mnt.mkdir()
    size = ROOM_BYTES // 2
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mnt)], check=True)
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(mnt))
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_up_on_a_state_directory_without_room_refuses_before_changing_anything(cli, small_state):
    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
    assert code == 6 and "KiB free, below the" in err and "nothing was changed" in err, err
    assert "SPARKCTL_STATE_DIR" in err                     # the way out
    assert not list(small_state.rglob("deployments/*.json"))
    code, out, err = cli("status", "--json")               # read-only commands still answer
    assert code == 0 and json.loads(out)["active"] is None, err


def test_a_read_only_state_directory_is_exit_6_naming_it(cli, local_cluster, tmp_path, monkeypatch):
    _root_or_skip()
    mnt = tmp_path / "ro"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64m,mode=0700", "tmpfs", str(mnt)], check=True)
    try:
        monkeypatch.setenv("SPARKCTL_STATE_DIR", str(mnt))
        code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
        assert code == 6 and "state directory" in err and str(mnt) in err, err
        assert "Traceback" not in err
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
