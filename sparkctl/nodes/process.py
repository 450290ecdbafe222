"""The `process` runtime: each rank of the embedded cluster is a local emulator process.

The LaunchSpec's argv (`python3 -m sglang.launch_server ...`) runs unchanged except
for the program: `python -m sparkctl.sim`, sparkctl's SGLang emulator. The process
is detached (own session) so it outlives `sparkctl up`, its output goes to a log
file in the state directory through `sparkctl.nodes.logpipe` (secrets redacted line by line;
the recorded PID is that parent's), and the handle records the PID plus its kernel start
time so a recycled PID is never mistaken for our engine. Secret files (API key, HF token)
are written to ``<state>/secrets/<deployment>/rank<N>/`` (0700, files 0400) and removed
with the engine (`remove`).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sparkctl.nodes import procfs
from sparkctl.nodes.node_facts import NodeFacts
from sparkctl.nodes.runtime import Liveness, ProcessHandle, sim_env
from sparkctl.sglang.launch import SECRETS_MOUNT, LaunchSpec, redact
from sparkctl.state.files import private_dir, state_dir_error




class ProcessRuntime:
    """Runs ranks as local processes of the emulator. Example::

        rt = ProcessRuntime(log_dir=Path("/tmp/logs"), sim_knobs={"boot_s": 3})
        handle = rt.start(spec, "dep-1")
    """

    kind = "process"
    needs_image = False       # the emulator runs in place
    poll_interval_s = 0.1

    def __init__(self, log_dir: Path, sim_knobs: dict[str, Any] | None = None, *,
                 secrets_root: Path | None = None) -> None:
        self.log_dir = log_dir
        self.sim_knobs = dict(sim_knobs or {})
        self.secrets_root = secrets_root or log_dir.parent / "secrets"
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def secrets_dir(self, deployment_id: str, rank: int) -> Path:
        """The rank's private directory standing in for SECRETS_MOUNT (0700, files 0400; gone with the engine)."""
        return self.secrets_root / deployment_id / f"rank{rank}"

    def _command(self, spec: LaunchSpec, secrets_dir: Path | None = None) -> list[str]:
        return [sys.executable, "-m", "sparkctl.sim", *(_local(a, secrets_dir) for a in spec.argv[3:])]

    def launch_argv(self, spec: LaunchSpec, deployment_id: str) -> list[str]:
        """The command `start` runs: the LaunchSpec's SGLang arguments, given to sparkctl's emulator (redacted)."""
        return [spec.redact_text(a) for a in self._command(spec)]

    def start(self, spec: LaunchSpec, deployment_id: str) -> ProcessHandle:
        private_dir(self.log_dir)
        log_path = self.log_dir / f"rank{spec.rank}.log"
        # The caller's environment, minus any variable holding one of the rank's secrets (HF_TOKEN, the API key's
        # variable): the engine gets those from its secret files only.
        env = {k: v for k, v in os.environ.items() if v not in spec.secret_values}
        # Knobs the caller's environment sets (tests, fault injection) win over the inventory's.
        env.update({k: v for k, v in sim_env(self.sim_knobs).items() if k not in os.environ})
        env.setdefault("SPARKCTL_SIM_SGLANG_VERSION", spec.sglang_version)
        sdir = self.secrets_dir(deployment_id, spec.rank)
        if spec.secret_files:
            write_secret_files(sdir, spec.secret_files)
        env.update({k: _local(v, sdir) for k, v in spec.env.items()})
        env["PYTHONUNBUFFERED"] = "1"
        # The engine's output reaches the log through sparkctl.nodes.logpipe, which redacts secrets line by line.
        # Its stdout is the rank log from the moment it exists (it appends there itself, and its own errors land
        # there too): a later command finds a running engine by the rank log it writes (sparkctl.deploy.observe).
        pipe = [sys.executable, "-m", "sparkctl.nodes.logpipe", str(log_path), str(sdir), "--"]
        # One log per rank and deployment, one attempt after the other: this attempt starts at `log_offset` (after
        # a newline ending whatever a killed attempt left half-written), and the handle reads from there only.
        try:
            fd = os.open(log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            raise state_dir_error(log_path, exc) from None
        try:
            offset = attempt_start(fd, log_path)
            proc = subprocess.Popen(pipe + self._command(spec, sdir), stdin=subprocess.DEVNULL, stdout=fd, stderr=fd,
                                    env=env, start_new_session=True, close_fds=True)
        finally:
            os.close(fd)
        self._children[proc.pid] = proc
        return ProcessHandle(node=spec.node, rank=spec.rank, pid=proc.pid, start_ticks=procfs.start_ticks(proc.pid),
                             log=str(log_path), log_offset=offset, deployment=deployment_id, spec=spec.redacted())

    def _ours(self, handle: ProcessHandle) -> bool:
        """The handle's process still runs (same PID *and* start time: a recycled PID is not ours; a zombie is dead)."""
        return (handle.start_ticks is not None and procfs.running(handle.pid, handle.start_ticks)
                and procfs.runs_sparkctl(handle.pid))   # and it runs sparkctl's engine

    def liveness(self, handle: ProcessHandle) -> Liveness:
        pid = handle.pid
        child = self._children.get(pid)
        if child is not None:
            code = child.poll()
            if code is not None:
                return Liveness(False, f"exited with code {code}", code)
        if self._ours(handle):
            return Liveness(True, f"running (pid {pid})")
        return Liveness(False, f"not running (pid {pid} gone)")

    def read_log(self, handle: ProcessHandle, offset: int = 0) -> tuple[str, int]:
        """This attempt's log text from `offset` (counted from the attempt's start, `handle.log_offset`)."""
        try:
            with open(handle.log, "rb") as fh:
                fh.seek(handle.log_offset + offset)
                data = fh.read()
        except FileNotFoundError:
            return "", offset
        # Only hand out complete lines; a partial last line waits for the next read.
        cut = data.rfind(b"\n") + 1
        return redact(data[:cut].decode("utf-8", "replace"), ()), offset + cut   # logpipe redacted the values

    def stop(self, handle: ProcessHandle, *, timeout_s: float = 15.0) -> None:
        if not self._ours(handle):
            self._reap(handle)
            return
        pid = handle.pid
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                self._reap(handle)
                if not self._ours(handle):
                    return
                time.sleep(0.05)
        self._reap(handle)

    def _reap(self, handle: ProcessHandle) -> None:
        child = self._children.get(handle.pid)
        if child is not None:
            child.poll()

    def remove(self, handle: ProcessHandle) -> None:
        self.stop(handle)
        sdir = self.secrets_dir(handle.deployment, handle.rank)
        shutil.rmtree(sdir, ignore_errors=True)
        try:
            sdir.parent.rmdir()          # the deployment's directory, once its last rank is gone
        except OSError:
            pass

    def gather(self, spec: LaunchSpec) -> NodeFacts:
        """Local facts: does the emulator import, are the rank's ports free here (judged in deploy/)."""
        nf = NodeFacts(spec.node, self.kind)
        try:
            import sparkctl.sim  # noqa: F401
        except ImportError as exc:
            nf.engine_error = str(exc)
        nf.ports_free = {(addr, port): local_port_free(addr, port) for addr, port, _ in spec.listen_ports()}
        return nf


def attempt_start(fd: int, path: Path) -> int:
    """The byte offset where a new attempt's lines start in the log open at `fd` (O_APPEND): its size, after a
    newline that ends a line a killed attempt left half-written. StateDirFullError/StateDirError if it cannot."""
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            os.write(fd, b"\n")
            size += 1
    except OSError as exc:
        raise state_dir_error(path, exc) from None
    return size


def _local(value: str, secrets_dir: Path | None) -> str:
    """A SECRETS_MOUNT path of the LaunchSpec rewritten into the rank's local secrets directory."""
    if secrets_dir is not None and (value == SECRETS_MOUNT or value.startswith(SECRETS_MOUNT + "/")):
        return str(secrets_dir) + value[len(SECRETS_MOUNT):]
    return value


def write_secret_files(directory: Path, files: dict[str, str]) -> None:
    """Write `files` (name -> content) into `directory`: the directory 0700, each file 0400, created with those
    modes (never readable by others, not even for a moment); an existing file is replaced."""
    private_dir(directory)
    for name, content in files.items():
        path = directory / name
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content)


def local_port_free(address: str, port: int) -> bool:
    """True when nothing listens on (address, port) here (a bind test; TIME_WAIT does not count)."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True
