"""Files the user names (``bench history --chart``, ``bench --out``, tune's winner profile): theirs, written as given.

The other kind of path, sparkctl's own state directory, goes through `sparkctl.statefiles` (private modes, no
links followed). Here no path the user has is chmod-ed: a new file is created 0600 (a card or a profile is the
user's to share; sparkctl does not decide that for them, as before), an existing file keeps its mode when it is
replaced, and the directory it goes into is used
as it is, and is never created, tightened or otherwise changed. The write is atomic (a temporary file in the same
directory, fsync, rename, fsync of the directory), so a crash leaves the old file or the new one.

Refused before anything is written, each with the path's own name (`OutputPathError`, exit 2):

* a directory where a file is to go;
* a parent directory that is missing, not a directory, or not writable by this user;
* an existing file (or a symlink, which is never followed) unless ``overwrite`` is asked (``--force``).

Example::

    write_user_file(Path("/tmp/x.svg"), svg.encode(), overwrite=False, option="--chart")
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from sparkctl.errors import OutputPathError
from sparkctl.statefiles import replace_durably

__all__ = ["check_user_target", "write_user_file", "write_user_text"]


def _refuse(path: Path, why: str, option: str | None, hint: str) -> OutputPathError:
    where = f"{option} {path}" if option else str(path)
    return OutputPathError(why, where=where, hint=hint)


def _nearest(path: Path) -> Path:
    p = path
    while not os.path.lexists(p) and p != p.parent:
        p = p.parent
    return p


def check_user_target(path: Path, *, overwrite: bool, option: str | None = None, create_parent: bool = False) -> None:
    """Refuse (OutputPathError naming `path`) what `write_user_file` would refuse, without writing anything: call
    it before long work (a tune, a bench) whose result goes there. `create_parent`: a missing directory is fine
    when its nearest existing ancestor is a directory this user can write in (it is created then, umask modes)."""
    path = Path(path)
    force = f"give {option} another path, or add --force to replace it" if option else "remove it or choose another"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _refuse(path, f"cannot be read: {exc.strerror or exc}", option, "choose another path") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise _refuse(path, "is a directory, not a file", option,
                          f"name a file inside it, e.g. {path / 'out'}" + (f" ({option} takes a file path)"
                                                                          if option else ""))
        if stat.S_ISLNK(st.st_mode) and not overwrite:
            raise _refuse(path, "is a symlink (sparkctl does not write through links)", option, force)
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
            raise _refuse(path, "exists and is not a regular file", option, "choose another path")
        if not overwrite:
            raise _refuse(path, "exists (not replaced without --force)", option, force)
    parent = path.parent
    if create_parent and not os.path.lexists(parent):
        parent = _nearest(parent)
    try:
        pst = os.stat(parent)
    except FileNotFoundError:
        raise _refuse(path, f"its directory {parent} does not exist", option,
                      f"create it first (mkdir -p {parent}); sparkctl does not create directories it does not own")\
            from None
    except OSError as exc:
        raise _refuse(path, f"its directory {parent} cannot be used: {exc.strerror or exc}", option,
                      "choose another path") from None
    if not stat.S_ISDIR(pst.st_mode):
        raise _refuse(path, f"{parent} is not a directory", option, "choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _refuse(path, f"is not writable: this user cannot create files in {parent}", option,
                      "choose a directory you can write to")


def write_user_file(path: Path, data: bytes, *, overwrite: bool, option: str | None = None,
                    create_parent: bool = False) -> Path:
    """Write `data` to the user-named `path` as given (atomic, fsynced, the directory fsynced too), never changing
    the directory's mode or owner. OutputPathError (exit 2) naming the path when it is a directory, not writable,
    or exists and `overwrite` is False. `create_parent`: a missing directory is created with the user's umask
    (never tightened). Returns `path`."""
    path = Path(path)
    check_user_target(path, overwrite=overwrite, option=option, create_parent=create_parent)
    if create_parent and not os.path.lexists(path.parent):
        try:
            path.parent.mkdir(parents=True)
        except OSError as exc:
            raise _refuse(path, f"its directory cannot be created: {exc.strerror or exc}", option,
                          "create it first, or choose a directory you can write to") from None
    old_mode = None
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            old_mode = stat.S_IMODE(st.st_mode)
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.sparkctl-tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise _refuse(path, f"cannot be written: {exc.strerror or exc}", option,
                      "choose a directory you can write to") from None
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if old_mode is not None:
                os.fchmod(fd, old_mode)          # a replaced file keeps its mode; the directory is never touched
            os.fsync(fd)
        finally:
            os.close(fd)
        replace_durably(tmp, path, dir_may_refuse=True)   # a directory we may not open is the user's
    except OSError as exc:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        raise _refuse(path, f"cannot be written: {exc.strerror or exc}", option,
                      "free space on its file system" if full else "choose another path") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return path


def write_user_text(path: Path, text: str, *, overwrite: bool, option: str | None = None,
                    create_parent: bool = False) -> Path:
    """`write_user_file` of UTF-8 text."""
    return write_user_file(path, text.encode("utf-8"), overwrite=overwrite, option=option,
                           create_parent=create_parent)
