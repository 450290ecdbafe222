"""Host-side building blocks of the test rig: argv runs with timeouts, liveness probes (a PID, dockerd's socket,
sshd's banner), keys, atomic writes, log tails, and the error they raise. Root-only callers: testrig.cluster,
testrig.node_daemons, testrig.engine_image.
"""
from __future__ import annotations

import logging
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from sparkctl.errors import SparkctlError

log = logging.getLogger("sparkctl.testrig")


class ClusterError(SparkctlError):
    """The test cluster could not be brought up, used or torn down."""


class _Timer:
    """Context manager adding the elapsed seconds of a block to ``timings[name]``."""

    def __init__(self, timings: dict[str, float], name: str) -> None:
        self.timings, self.name = timings, name

    def __enter__(self) -> None:
        self.start = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.timings[self.name] = round(time.monotonic() - self.start, 2)


def _run(argv: Sequence[str], *, timeout: float = 60.0, check: bool = True, env: dict[str, str] | None = None,
         input: str | None = None, stdin: int | IO[Any] | None = None,
         log_to: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run an argv (never a shell string) with a timeout; on failure raise ClusterError with the output tail."""
    log.debug("run: %s", " ".join(argv))
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env,
                                input=input, stdin=stdin if input is None else None)
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"command timed out after {timeout:.0f}s: {' '.join(argv)}") from exc
    if log_to is not None:
        log_to.parent.mkdir(parents=True, exist_ok=True)
        log_to.write_text(f"$ {' '.join(argv)}\n{result.stdout}{result.stderr}")
    if check and result.returncode != 0:
        raise ClusterError(f"command failed (exit {result.returncode}): {' '.join(argv)}",
                           evidence=_last_lines(result.stdout + result.stderr))
    return result


def _keygen(path: Path, comment: str) -> None:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def _link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"   # a zombie is dead


def _docker_ping(sock: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(str(sock))
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            status_line = s.recv(64).split(b"\r\n", 1)[0]
            return status_line.startswith(b"HTTP/1.") and status_line.split()[1:2] == [b"200"]
    except OSError:
        return False


def _ssh_banner(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=2) as s:
            return s.recv(64).startswith(b"SSH-2.0-")
    except OSError:
        return False


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(0o600)
    tmp.rename(path)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return _last_lines(path.read_text(errors="replace"), lines)
    except OSError:
        return f"(no log at {path})"


def _last_lines(text: str, lines: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
