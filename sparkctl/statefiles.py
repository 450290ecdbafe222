"""sparkctl's own files: private directories (0700) and atomic writes (temp file, fsync, rename; mode 0600).

The ledger, the runtimes (rank logs, secret files) and the test tools all write through these, so a crash leaves
the old or the new file, never half of one, and nothing sparkctl keeps is readable by others.

Failures are sorted here, once: no space, no inodes or a quota (ENOSPC, EDQUOT) is a `StateDirFullError`; any
other OS error (read-only file system, permissions, a file in the way) a `StateDirError`; both exit 6 and name
the directory and the fix, never a raw OSError. A failed write leaves the target as it was and removes its
temporary file (a file system turned read-only under the write is the one case where the temporary file cannot
be removed; it is named ``.<target>.<pid>.tmp`` and the next write of the same target by any process sweeps it).

`check_room` is the check before a command changes the cluster: it refuses with `StateDirFullError` when the
state directory's file system has less than `ROOM_BYTES` free (or fewer than `ROOM_INODES` inodes).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path

from sparkctl.errors import LedgerError, StateDirError, StateDirFullError

# Room a command that changes the cluster needs in the state directory before it starts: 16 MiB.
# Measured: one `up` of the embedded cluster (emulator boot, 2 ranks) leaves 78 KB in 10 files and directories
# (`du -sb $SPARKCTL_STATE_DIR` after `sparkctl up --profile d5 --yes`): a 16 KB record, rank logs of 19 and 23 KB.
# Real SGLang rank logs of a boot are 10-35 KB (shared/reference/captures/sglang: startup, a few requests,
# shutdown); every atomic rewrite holds the old and the new copy at once; an archived docker log of a pruned
# deployment grows by a line per request batch (~150 bytes). A deploy's own writes stay under 1 MiB; 16 MiB
# leaves room for a long-served log archived at prune (~100k lines) and is small enough never to stand in the
# way on a file system that still works.
ROOM_BYTES = 16 * 1024 * 1024
ROOM_WHY = ("room for one deploy: its record and index rewrites, two rank logs and the archived log of a "
            "pruned deployment, with a wide margin")
# Files and directories one deploy creates: 10 measured as above (plus a temp file per write); 256 is the margin.
ROOM_INODES = 256
_FULL = (errno.ENOSPC, errno.EDQUOT)


def _human(n: int) -> str:
    """``16777216`` -> ``'16.0 MiB'``: binary units, as `df -h` and the room bounds are written (rich's units)."""
    from rich.filesize import pick_unit_and_suffix
    unit, suffix = pick_unit_and_suffix(n, ["B", "KiB", "MiB", "GiB", "TiB"], 1024)
    return f"{n} B" if unit == 1 else f"{n / unit:.1f} {suffix}"


def _existing(path: Path) -> Path:
    """`path` or its nearest existing ancestor (statvfs needs a path that exists)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _room(path: Path) -> tuple[int | None, int | None]:
    """(bytes free to this user, inodes free or None when the file system has no inode limit) at `path`."""
    try:
        st = os.statvfs(_existing(path))
    except OSError:
        return None, None
    return st.f_bavail * st.f_frsize, (st.f_favail if st.f_files else None)


_FULL_HINT = ("free space on the file system that holds it (old engine logs under <state>/<cluster>/logs/ and bench "
              "runs under runs/ can go), or point SPARKCTL_STATE_DIR at a larger one")


def state_dir_full_error(path: Path, exc: OSError | None = None, *, need_bytes: int | None = None,
                         need_inodes: int | None = None, why: str | None = None) -> StateDirFullError:
    """The error for a state directory without room: what was seen (free space and inodes), the threshold, the fix."""
    free, inodes = _room(path)
    seen = "unknown" if free is None else _human(free)
    if inodes is not None:
        seen += f" and {inodes} inodes"
    if exc is not None:
        head = f"the state directory is full: {exc.strerror or exc} ({seen} free)"
    else:
        head = (f"the state directory has too little room: {seen} free, sparkctl needs at least "
                f"{_human(need_bytes or ROOM_BYTES)} and {need_inodes or ROOM_INODES} inodes ({why or ROOM_WHY})")
    where = (exc.filename if exc is not None and exc.filename else None) or str(path)
    return StateDirFullError(head, where=str(where), hint=_FULL_HINT, free_bytes=free,
                             need_bytes=need_bytes if exc is None else None)


def state_dir_error(path: Path, exc: OSError) -> LedgerError:
    """The error for an OS error on a state file: `StateDirFullError` for no space/inodes/quota, else
    `StateDirError` (read-only, permissions, a file in the way), naming the file and the fix."""
    if exc.errno in _FULL:
        return state_dir_full_error(path, exc)
    why = exc.strerror or str(exc)
    where = exc.filename or str(path)
    return StateDirError(f"the state directory is not usable: {why}", where=str(where),
                         hint="make it writable by this user, or point SPARKCTL_STATE_DIR at a directory you own "
                              "(e.g. export SPARKCTL_STATE_DIR=$HOME/.local/state/sparkctl)")


def check_room(path: Path, *, need_bytes: int | None = None, need_inodes: int | None = None) -> None:
    """Refuse (StateDirFullError, exit 6) unless the file system holding `path` has `need_bytes` free (default
    `ROOM_BYTES`, see there why) and `need_inodes` inodes (default `ROOM_INODES`; not checked on a file system
    without an inode limit); StateDirError when it is read-only or not writable.
    Call it before a command changes the cluster. Example::

        check_room(ledger.root)                       # before `up`, `rollback`, `down`, `repair`, `bench --compare`
    """
    need = ROOM_BYTES if need_bytes is None else need_bytes
    need_in = ROOM_INODES if need_inodes is None else need_inodes
    probe = _existing(path)
    try:
        st = os.statvfs(probe)
    except OSError as exc:
        raise state_dir_error(path, exc) from None
    if st.f_flag & os.ST_RDONLY:
        raise state_dir_error(path, OSError(errno.EROFS, os.strerror(errno.EROFS), str(probe)))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise state_dir_error(path, OSError(errno.EACCES, os.strerror(errno.EACCES), str(probe)))
    free = st.f_bavail * st.f_frsize
    inodes = st.f_favail if st.f_files else None
    if free < need or (inodes is not None and inodes < need_in):
        why = ROOM_WHY if need_bytes is None else "what the caller said this command writes"
        raise state_dir_full_error(path, need_bytes=need, need_inodes=need_in, why=why)


def _owner(st: os.stat_result) -> str:
    try:
        import pwd
        return f"uid {st.st_uid} ({pwd.getpwuid(st.st_uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {st.st_uid}"


def _me() -> str:
    try:
        import pwd
        return f"uid {os.getuid()} ({pwd.getpwuid(os.getuid()).pw_name})"
    except (KeyError, ImportError):
        return f"uid {os.getuid()}"


def default_state_root() -> Path:
    """Where sparkctl keeps its state: $SPARKCTL_STATE_DIR, else $XDG_STATE_HOME/sparkctl (~/.local/state/sparkctl)."""
    env = os.environ.get("SPARKCTL_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "sparkctl"


def _state_root() -> Path:
    return Path(os.path.abspath(default_state_root()))


def foreign_error(path: Path, st: os.stat_result, what: str) -> StateDirError:
    """The refusal of a path in the state directory that sparkctl did not make: a symlink, or something owned
    by another user (named with its owner)."""
    return StateDirError(f"{what}, owned by {_owner(st)}; sparkctl runs as {_me()} and does not follow or "
                         "change what it did not make", where=str(path),
                         hint=f"look at {path}: remove it if it is not yours, or point SPARKCTL_STATE_DIR at a "
                              "directory this user owns (e.g. $HOME/.local/state/sparkctl)")


def check_state_path(path: Path) -> None:
    """Refuse (StateDirError naming the path and its owner, exit 6) a path under the state directory that goes
    through something sparkctl did not make: a state root owned by another user, or below it a symlink (a planted
    ``<cluster>``, ``logs``, ``logs/router.log``) or a file or directory of another user. The root itself may be a
    link the user made (it is theirs to choose); nothing below it is followed. Paths outside the state directory
    (the process runtime's tmpfs, a test's own directory) are checked only for their last existing component's
    owner before sparkctl changes its mode."""
    path = Path(os.path.abspath(path))
    root = _state_root()
    try:
        rel = path.relative_to(root)
    except ValueError:
        return
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return                                   # created by sparkctl, 0700
    except OSError as exc:
        raise state_dir_error(root, exc) from None
    if st.st_uid != os.getuid():
        raise foreign_error(root, st, "the state directory is another user's")
    p = root
    for part in rel.parts:
        p = p / part
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise state_dir_error(p, exc) from None
        if stat.S_ISLNK(st.st_mode):
            raise foreign_error(p, st, f"a symlink (to {os.readlink(p)!r}) in the state directory")
        if st.st_uid != os.getuid():
            raise foreign_error(p, st, "in the state directory but another user's")


def open_state_file(path: Path, flags: int, mode: int = 0o600) -> int:
    """`os.open` of a file in sparkctl's state directory without following links: every directory on the way is
    checked (`check_state_path`), the file itself opened O_NOFOLLOW (a planted symlink, e.g. ``logs/router.log``
    pointing at a file of another user, is refused naming it and its owner, never read or appended to).
    FileNotFoundError as is; StateDirError otherwise as `state_dir_error`."""
    check_state_path(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except FileNotFoundError:
        raise                           # the caller decides what a missing file means (a log not written yet)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            try:
                raise foreign_error(path, os.lstat(path), f"a symlink (to {os.readlink(path)!r}) in the state "
                                                          "directory") from None
            except OSError:
                pass
        raise state_dir_error(path, exc) from None
    st = os.fstat(fd)
    if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise foreign_error(path, st, "in the state directory but another user's" if st.st_uid != os.getuid()
                            else "in the state directory but not a regular file")
    return fd


def private_dir(path: Path) -> Path:
    """`path` as a private directory of sparkctl: created (with any missing parents) mode 0700, an existing one
    with looser modes tightened to 0700 (call it only for sparkctl's own directories). StateDirError (or
    StateDirFullError), naming the directory and the fix, when it cannot be created or changed; StateDirError
    naming path and owner when it is (or goes through) something sparkctl did not make (`check_state_path`):
    a directory of another user is never tightened, a symlink never followed."""
    check_state_path(path)
    try:
        st = os.lstat(path)
    except OSError:
        st = None
    if st is not None and (stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid()) and stat.S_IMODE(st.st_mode) & 0o077:
        raise foreign_error(path, st, "a symlink" if stat.S_ISLNK(st.st_mode) else "another user's directory")
    try:
        missing = []
        p = path
        while not p.exists() and p != p.parent:
            missing.append(p)
            p = p.parent
        for d in reversed(missing):
            d.mkdir(mode=0o700, exist_ok=True)
            os.chmod(d, 0o700)                       # mkdir's mode is masked by the umask
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            os.chmod(path, 0o700)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied", str(path))
    except OSError as exc:
        raise state_dir_error(path, exc) from None
    return path


def _tmp_name(path: Path, pid: int) -> Path:
    return path.with_name(f".{path.name}.{pid}.tmp")


def _sweep_stale_tmp(path: Path) -> None:
    """Remove temporary files of `path` left by processes that are gone (a write cut short by a read-only
    remount or a kill -9)."""
    prefix = f".{path.name}."
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):-len(".tmp")] if name.startswith(prefix) and name.endswith(".tmp") else ""
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):
                os.unlink(path.parent / name)


def fsync_dir(directory: Path) -> None:
    """fsync a directory (after a rename into it); file systems that cannot (EINVAL) are left as they are."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def replace_durably(src: Path | str, dst: Path, *, dir_may_refuse: bool = False) -> None:
    """``os.replace(src, dst)``, then fsync `dst`'s directory, so the rename itself reaches the disk (a power cut
    keeps the old name or the new one). Every rename in sparkctl goes through here: the state directory's atomic
    writes, user-named outputs (sparkctl.userfiles), log rotation, the wheel cache (tests/unit/test_replace.py).
    OSError as os.replace raises it; a directory that cannot be fsynced (EINVAL) is left as it is, and with
    `dir_may_refuse` (a user's directory, which sparkctl may write but not open) so is one that cannot be opened:
    the rename is done either way."""
    os.replace(src, dst)
    if dir_may_refuse:
        with contextlib.suppress(OSError):
            fsync_dir(dst.parent)
    else:
        fsync_dir(dst.parent)


def write_bytes_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write `data` to `path` atomically (temp file, fsync, rename) with `mode`; a crash leaves old or new, never
    half; a failure (StateDirFullError / StateDirError) leaves the old file and no temporary file."""
    private_dir(path.parent)
    tmp = _tmp_name(path, os.getpid())
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    except OSError as exc:
        raise state_dir_error(path.parent, exc) from None
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, mode)
        replace_durably(tmp, path)
    except OSError as exc:
        raise state_dir_error(path, exc) from None
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        except OSError:
            pass                     # read-only now: swept by the next write of this target
    _sweep_stale_tmp(path)


def write_text_atomic(path: Path, text: str, mode: int = 0o600) -> None:
    """Write text to path atomically (temp file, fsync, rename) with `mode`; a crash leaves old or new, never half."""
    write_bytes_atomic(path, text.encode("utf-8"), mode)


def write_json_atomic(path: Path, data: object) -> None:
    """Write JSON to path atomically with mode 0600."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
