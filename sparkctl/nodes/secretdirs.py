"""The process runtime's private directories on tmpfs: where a rank's secret files (and a vLLM rank's temporary
files) live while its engine runs, each created 0700 as this user's own real directory, never through a link."""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from pathlib import Path

from sparkctl.errors import StateDirError
from sparkctl.nodes import procfs
from sparkctl.sglang.launch import SECRETS_MOUNT
from sparkctl.statefiles import private_dir, state_dir_error


def secrets_home(environ: dict[str, str] | None = None) -> Path:
    """The tmpfs directory of this user's process-runtime secrets: ``$XDG_RUNTIME_DIR/sparkctl`` when that is
    set and a tmpfs, else ``/dev/shm/sparkctl-<uid>`` (not created here)."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg) and procfs.fs_type(xdg) == "tmpfs":
        return Path(xdg) / "sparkctl"
    return Path("/dev/shm") / f"sparkctl-{os.getuid()}"


def secrets_root_for(key: Path, environ: dict[str, str] | None = None) -> Path:
    """Where the secret files of one state directory's engines live: ``secrets_home()/<16 hex of sha256(key)>``
    (`key` names the state directory, e.g. the ledger root: clusters and tests never share or sweep each other's)."""
    digest = hashlib.sha256(str(Path(key).resolve()).encode()).hexdigest()[:16]
    return secrets_home(environ) / digest


def own_private_dir(path: Path) -> Path:
    """`path` created 0700 and checked to be this user's real directory (not a symlink, not another user's: the
    parent may be a shared tmpfs like /dev/shm)."""
    try:
        st: os.stat_result | None = path.lstat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise state_dir_error(path, exc) from None
    # Checked before anything is changed: a symlink or another user's directory planted there is refused, never
    # followed or tightened.
    if st is not None and (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid()):
        raise StateDirError(f"{path} is not a directory of this user (a symlink, a file or another user's)",
                            where=str(path), hint=f"remove {path} (it is not sparkctl's) and re-run")
    return private_dir(path)



def local_secret_path(value: str, secrets_dir: Path | None) -> str:
    """A SECRETS_MOUNT path of the LaunchSpec rewritten into the rank's local secrets directory."""
    if secrets_dir is not None and (value == SECRETS_MOUNT or value.startswith(SECRETS_MOUNT + "/")):
        return str(secrets_dir) + value[len(SECRETS_MOUNT):]
    return value


def remove_private_dir(path: Path) -> None:
    """Remove `path` and what it holds when it is this user's own directory (a symlink planted in its place is
    never followed: only the link goes)."""
    try:
        st = path.lstat()
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def write_secret_files(directory: Path, files: dict[str, str]) -> None:
    """Write `files` (name -> content) into `directory`: the directory 0700, each file 0400, created with those
    modes (never readable by others, not even for a moment); an existing file is replaced."""
    private_dir(directory)
    for name, content in files.items():
        path = directory / name
        try:
            path.unlink(missing_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(content)
        except OSError as exc:
            shutil.rmtree(directory, ignore_errors=True)     # never half a set of secrets
            raise state_dir_error(directory, exc) from None
