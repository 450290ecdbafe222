"""The state directory without room, on a real small tmpfs: every write point of sparkctl/statefiles.py (and the
ledger's index and lock, which write through it) hit with no space, no inodes and a read-only remount.

The write points are generated, not listed: a run with room records every file-system change the operation
makes (Python's audit events: open for writing, mkdir, chmod, replace, remove), then the operation is re-run
once per point and fault, the fault made real just before that point (the tmpfs filled with a filler file, its
inodes used up, or the mount turned read-only). After each: the error is StateDirFullError or StateDirError
(never a raw OSError), every target holds its old or its new content (never half), no temporary file is left,
and the same operation converges once room is back.

Needs root (mount); skipped off-root with the reason, failed under CI=true.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sparkctl import statefiles
from sparkctl.errors import LedgerError, StateDirError, StateDirFullError
from sparkctl.state.ledger import Ledger
from sparkctl.statefiles import ROOM_BYTES, check_room, private_dir, write_json_atomic, write_text_atomic
from testrig.testenv import small_tmpfs

SIZE = 64 * 1024
INODES = 48


@pytest.fixture
def tmpfs(tmp_path: Path):
    with small_tmpfs(tmp_path / "mnt", SIZE, inodes=INODES) as mnt:
        yield mnt


# ------------------------------------------------------------------------------------------------ faults
def _fill_blocks(mnt: Path) -> None:
    fd = os.open(mnt / ".filler-blocks", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (b"\0" * 4096, b"\0"):
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)


def _fill_inodes(mnt: Path) -> None:
    d = mnt / ".filler-inodes"
    d.mkdir(exist_ok=True)
    i = 0
    while True:
        try:
            os.close(os.open(d / str(i), os.O_WRONLY | os.O_CREAT, 0o600))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            return
        i += 1


def _read_only(mnt: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True, capture_output=True)


FAULTS: dict[str, tuple[Callable[[Path], None], type[LedgerError]]] = {
    "no-space": (_fill_blocks, StateDirFullError),
    "no-inodes": (_fill_inodes, StateDirFullError),
    "read-only": (_read_only, StateDirError),
}


def _release(mnt: Path) -> None:
    subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)
    (mnt / ".filler-blocks").unlink(missing_ok=True)
    shutil.rmtree(mnt / ".filler-inodes", ignore_errors=True)


def _reset(mnt: Path) -> None:
    _release(mnt)
    for p in mnt.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


# ------------------------------------------------------------------------------------------------ write points
_MUTATING = {"os.mkdir", "os.chmod", "os.replace", "os.rename", "os.remove", "os.rmdir", "os.truncate"}


@dataclass
class _Points:
    """Counts the file-system changes under `root` while armed; runs `fault` just before change number `at`."""

    root: str = ""
    armed: bool = False
    busy: bool = False
    seen: list[str] = field(default_factory=list)
    at: int | None = None
    fault: Callable[[], None] | None = None

    def __call__(self, event: str, args: tuple) -> None:
        if not self.armed or self.busy:
            return
        if event == "open":
            path, mode, flags = args
            writes = (any(c in mode for c in "wax+") if isinstance(mode, str)
                      else bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)))
            if not writes:
                return
        elif event not in _MUTATING:
            return
        else:
            path = args[0]
        if isinstance(path, int):
            return
        path = os.fsdecode(os.fspath(path))
        if not os.path.abspath(path).startswith(self.root):
            return
        if self.at == len(self.seen) and self.fault is not None:
            self.busy = True
            try:
                self.fault()
            finally:
                self.busy = False
        self.seen.append(f"{event} {os.path.relpath(path, self.root)}")


_POINTS = _Points()
_HOOKED = False


def _points() -> _Points:
    global _HOOKED
    if not _HOOKED:                    # audit hooks cannot be removed: one per process, idle unless armed
        sys.addaudithook(_POINTS)
        _HOOKED = True
    return _POINTS


# ------------------------------------------------------------------------------------------------ operations
OLD = {"id": "old", "blob": "o" * 3000}
NEW = {"id": "new", "blob": "n" * 20000}      # several pages: a data write can fail part-way


def _new_tree(mnt: Path) -> dict[Path, object]:
    write_json_atomic(mnt / "state" / "c1" / "deployments" / "d1.json", NEW)
    private_dir(mnt / "state" / "c1" / "logs" / "d1")
    write_text_atomic(mnt / "state" / "c1" / "logs" / "d1" / "note.txt", "hello\n")
    return {mnt / "state" / "c1" / "deployments" / "d1.json": NEW,
            mnt / "state" / "c1" / "logs" / "d1" / "note.txt": "hello\n"}


def _overwrite(mnt: Path) -> dict[Path, object]:
    write_json_atomic(mnt / "state" / "rec.json", NEW)
    return {mnt / "state" / "rec.json": NEW}


def _overwrite_setup(mnt: Path) -> None:
    write_json_atomic(mnt / "state" / "rec.json", OLD)


def _ledger_index_under_lock(mnt: Path) -> dict[Path, object]:
    ledger = Ledger(mnt / "state" / "c1")
    with ledger.lock("up"):
        ledger.sync_index()          # cluster.json is derived from the records (issue 15): written under the lock
    return {ledger.index_path: ledger.index()}


OPERATIONS = {
    "new-tree": (_new_tree, None, ("no-space", "no-inodes", "read-only")),
    "overwrite": (_overwrite, _overwrite_setup, ("no-space", "no-inodes", "read-only")),
    # the lock file is open for writing while the index is written: a read-only remount would be refused (EBUSY)
    "ledger-index-under-lock": (_ledger_index_under_lock, None, ("no-space", "no-inodes")),
}


def _content(path: Path) -> object:
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else text


def _tmp_files(mnt: Path) -> list[Path]:
    return [p for p in mnt.rglob("*.tmp")]


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_every_write_point_under_every_fault_fails_clean_and_converges(tmpfs, name):
    op, setup, faults = OPERATIONS[name]
    points = _points()
    points.root = str(tmpfs)
    # A run with room: the write points this operation makes.
    _reset(tmpfs)
    if setup:
        setup(tmpfs)
    points.seen, points.at, points.fault, points.armed = [], None, None, True
    try:
        expected = op(tmpfs)
    finally:
        points.armed = False
    listed = list(points.seen)
    assert len(listed) >= 3, listed
    outcomes: dict[str, int] = {}
    for fault_name in faults:
        fault, error_type = FAULTS[fault_name]
        for at in range(len(listed)):
            _reset(tmpfs)
            if setup:
                setup(tmpfs)
            before = {p: _content(p) for p in expected if p.exists()}
            points.seen, points.at, points.fault, points.armed = [], at, (lambda f=fault: f(tmpfs)), True
            raised: BaseException | None = None
            try:
                op(tmpfs)
            except BaseException as exc:   # noqa: BLE001 - the type is what is checked
                raised = exc
            finally:
                points.armed = False
            case = f"{fault_name} at point {at} ({listed[at]})"
            assert raised is None or isinstance(raised, error_type), (case, repr(raised))
            if raised is not None:
                assert raised.where and "fix" in raised.render(), case
            outcomes[f"{fault_name}:{'error' if raised else 'ok'}"] = outcomes.get(
                f"{fault_name}:{'error' if raised else 'ok'}", 0) + 1
            _release(tmpfs)
            for path, new in expected.items():        # old or new, never half
                if path.exists():
                    assert _content(path) in (before.get(path), new), case
                else:
                    assert path not in before, case
            if fault_name != "read-only":
                assert _tmp_files(tmpfs) == [], case
            assert op(tmpfs) == expected, case           # room is back: the same operation converges
            assert all(_content(p) == v for p, v in expected.items()), case
            assert _tmp_files(tmpfs) == [], case          # a temp file left under read-only is swept now
    # every fault made the operation fail at least at one point (the injection really bit)
    for fault_name in faults:
        assert outcomes.get(f"{fault_name}:error"), (fault_name, outcomes)


def test_check_room_refuses_with_what_it_saw_the_threshold_and_why(tmpfs):
    state = tmpfs / "state" / "c1"          # need not exist yet: its nearest existing parent is measured
    with pytest.raises(StateDirFullError) as info:
        check_room(state)                   # 64 KiB free < ROOM_BYTES
    err = info.value
    text = err.render()
    assert err.exit_code == 6 and err.need_bytes == ROOM_BYTES and 0 < (err.free_bytes or 0) <= SIZE
    assert re.search(r"\d+\.\d KiB and \d+ inodes free", text), text
    assert "needs at least 16.0 MiB and 256 inodes" in text and statefiles.ROOM_WHY in text
    assert "SPARKCTL_STATE_DIR" in text and str(state) in text
    check_room(state, need_bytes=8 * 1024, need_inodes=8)                    # room for what the caller says it writes
    _fill_blocks(tmpfs)
    with pytest.raises(StateDirFullError, match=r": 0 B and \d+ inodes free"):
        check_room(state, need_bytes=1, need_inodes=1)
    _release(tmpfs)
    _fill_inodes(tmpfs)
    with pytest.raises(StateDirFullError, match=r" and 0 inodes free"):
        check_room(state, need_bytes=1, need_inodes=1)
    _release(tmpfs)
    _read_only(tmpfs)
    with pytest.raises(StateDirError, match="Read-only file system"):
        check_room(state, need_bytes=1, need_inodes=1)
    _release(tmpfs)


def test_a_full_disk_in_the_cli_is_exit_6_not_an_internal_error(tmpfs, cli, local_cluster, monkeypatch):
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(tmpfs / "state"))
    private_dir(tmpfs / "state")
    _fill_blocks(tmpfs)
    _fill_inodes(tmpfs)
    code, out, err = cli("up", "--profile", "d5", "--yes")
    _release(tmpfs)
    assert code == 6, err
    assert "internal error" not in err and "Traceback" not in err and "state directory" in err
