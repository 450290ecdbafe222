"""State directory modes and failures: directories 0700 (sparkctl's own tightened), a loose root warned about,
an unusable state directory a clear error (exit 6) instead of an internal error, the debug log private."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sparkctl.errors import StateDirError
from sparkctl.state.ledger import Ledger, check_state_root
from sparkctl.statefiles import private_dir, write_json_atomic


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_private_dir_creates_every_missing_level_0700_and_tightens_its_own(tmp_path):
    old = os.umask(0o022)
    try:
        leaf = private_dir(tmp_path / "root" / "cluster" / "logs")
    finally:
        os.umask(old)
    assert [_mode(p) for p in (tmp_path / "root", leaf.parent, leaf)] == [0o700, 0o700, 0o700]
    os.chmod(leaf, 0o755)
    private_dir(leaf)
    assert _mode(leaf) == 0o700


def test_ledger_files_are_0600_in_0700_directories_under_a_umask_022(tmp_path):
    old = os.umask(0o022)
    try:
        ledger = Ledger(tmp_path / "state" / "c1")
        write_json_atomic(ledger.index_path, {"active": None, "history": []})
        with ledger.lock("test"):
            pass
    finally:
        os.umask(old)
    assert _mode(tmp_path / "state") == 0o700 and _mode(ledger.root) == 0o700
    assert _mode(ledger.index_path) == 0o600 and _mode(ledger.root / "lock") == 0o600


def test_a_loose_state_root_is_warned_about_not_changed(tmp_path):
    tmp_path.chmod(0o755)
    warning = check_state_root(tmp_path)
    assert warning and "0755" in warning and f"chmod 700 {tmp_path}" in warning
    assert _mode(tmp_path) == 0o755
    tmp_path.chmod(0o700)
    assert check_state_root(tmp_path) is None


def test_an_unusable_state_dir_is_a_clear_error_not_an_internal_one(cli, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(blocker / "state"))
    with pytest.raises(StateDirError):
        private_dir(blocker / "state" / "x")
    code, out, err = cli("up", "--profile", "d5", "--yes")
    assert code == 6, err
    assert "the state directory is not usable: Not a directory" in err and str(blocker / "state") in err
    assert "fix: " in err and "SPARKCTL_STATE_DIR" in err and "internal error" not in err


def test_internal_errors_write_a_private_debug_log_in_the_state_dir(cli, tmp_path, monkeypatch, state_dir):
    from sparkctl.cli import main as cli_main

    def boom(*_a, **_k):
        raise RuntimeError("boom")
    monkeypatch.setattr("sparkctl.config.profile.load_profile", boom)
    code, out, err = cli("render", "--profile", "d5")
    log = state_dir / "debug.log"
    assert code == 70 and f"traceback written to {log}" in err
    assert "RuntimeError: boom" in log.read_text() and _mode(log) == 0o600 and _mode(state_dir) == 0o700
    assert cli_main._debug_log_path() == log


@pytest.mark.parametrize("content", ["{not json", "[]", "\x00\xff"])
@pytest.mark.parametrize("command", [("status",), ("down", "--yes"), ("up", "--profile", "d5", "--yes")])
def test_a_damaged_replicated_record_is_a_ledger_error_naming_it(cli, state_dir, content, command):
    """The replicated deployment's record is read before the commands that go through it: damaged, it is exit 6
    naming the file and `repair`, never an internal error and never read as "nothing replicated"."""
    from sparkctl.config.inventory import resolve_inventory
    from sparkctl.state.ledger import Ledger
    root = Ledger.for_cluster(resolve_inventory(None).cluster.name).root
    root.mkdir(parents=True, exist_ok=True)
    (root / "replicated.json").write_bytes(content.encode("latin-1"))
    code, out, err = cli(*command)
    assert code == 6, err
    assert "replicated.json" in err and "repair" in err and "internal error" not in err
