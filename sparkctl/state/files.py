"""sparkctl's own files: private directories (0700) and atomic writes (temp file, fsync, rename; mode 0600).

The ledger, the runtimes (rank logs, secret files) and the test tools all write through these, so a crash leaves
the old or the new file, never half of one, and nothing sparkctl keeps is readable by others.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from sparkctl.errors import StateDirError


def private_dir(path: Path) -> Path:
    """`path` as a private directory of sparkctl: created (with any missing parents) mode 0700, an existing one
    with looser modes tightened to 0700 (call it only for sparkctl's own directories). StateDirError, naming the
    directory and the fix, when it cannot be created or changed (permissions, read-only file system)."""
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


def state_dir_error(path: Path, exc: OSError) -> StateDirError:
    why = exc.strerror or str(exc)
    where = exc.filename or str(path)
    return StateDirError(f"the state directory is not usable: {why}", where=str(where),
                         hint="make it writable by this user, or point SPARKCTL_STATE_DIR at a directory you own "
                              "(e.g. export SPARKCTL_STATE_DIR=$HOME/.local/state/sparkctl)")


def write_text_atomic(path: Path, text: str, mode: int = 0o600) -> None:
    """Write text to path atomically (temp file, fsync, rename) with `mode`; a crash leaves old or new, never half."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    except OSError as exc:
        raise state_dir_error(path.parent, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to path atomically with mode 0600."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
