"""The `process` runtime: each rank of the embedded cluster is a local emulator process.

The LaunchSpec's argv (`python3 -m sglang.launch_server ...`) runs unchanged except
for the program: `python -m sparkctl.sim`, sparkctl's SGLang emulator. The process
is detached (own session) so it outlives `sparkctl up`, its output goes to a log
file in the state directory, and the handle records the PID plus its kernel start
time so a recycled PID is never mistaken for our engine.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sparkctl.nodes import procfs
from sparkctl.nodes.node_facts import NodeFacts
from sparkctl.nodes.runtime import Liveness, ProcessHandle, sim_env
from sparkctl.sglang.launch import LaunchSpec


_proc_stat = procfs.proc_stat
_proc_start_ticks = procfs.start_ticks


class ProcessRuntime:
    """Runs ranks as local processes of the emulator. Example::

        rt = ProcessRuntime(log_dir=Path("/tmp/logs"), sim_knobs={"boot_s": 3})
        handle = rt.start(spec, "dep-1")
    """

    kind = "process"
    needs_image = False       # the emulator runs in place
    poll_interval_s = 0.1

    def __init__(self, log_dir: Path, sim_knobs: dict[str, Any] | None = None) -> None:
        self.log_dir = log_dir
        self.sim_knobs = dict(sim_knobs or {})
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def _command(self, spec: LaunchSpec) -> list[str]:
        return [sys.executable, "-m", "sparkctl.sim", *spec.argv[3:]]

    def launch_argv(self, spec: LaunchSpec, deployment_id: str) -> list[str]:
        """The command `start` runs: the LaunchSpec's SGLang arguments, given to sparkctl's emulator (redacted)."""
        return [spec.redact_text(a) for a in self._command(spec)]

    def start(self, spec: LaunchSpec, deployment_id: str) -> ProcessHandle:
        self.log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        log_path = self.log_dir / f"rank{spec.rank}.log"
        env = dict(os.environ)
        # Knobs the caller's environment sets (tests, fault injection) win over the inventory's.
        env.update({k: v for k, v in sim_env(self.sim_knobs).items() if k not in os.environ})
        env.setdefault("SPARKCTL_SIM_SGLANG_VERSION", spec.sglang_version)
        env.update(spec.env)
        env["PYTHONUNBUFFERED"] = "1"
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(self._command(spec), stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env=env,
                                    start_new_session=True, close_fds=True)
        finally:
            os.close(fd)
        self._children[proc.pid] = proc
        return ProcessHandle(node=spec.node, rank=spec.rank, pid=proc.pid, start_ticks=_proc_start_ticks(proc.pid),
                             log=str(log_path), deployment=deployment_id, spec=spec.redacted())

    def _ours(self, handle: ProcessHandle) -> bool:
        """The handle's process still runs (same PID *and* start time: a recycled PID is not ours; a zombie is dead)."""
        stat = _proc_stat(handle.pid)
        return (stat is not None and stat[1] == handle.start_ticks and stat[0] != "Z"
                and any("sparkctl" in a for a in procfs.cmdline(handle.pid)))   # and it runs sparkctl's engine

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
        try:
            with open(handle.log, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except FileNotFoundError:
            return "", offset
        # Only hand out complete lines; a partial last line waits for the next read.
        cut = data.rfind(b"\n") + 1
        return data[:cut].decode("utf-8", "replace"), offset + cut

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

    def gather(self, spec: LaunchSpec) -> NodeFacts:
        """Local facts: does the emulator import, are the rank's ports free here (judged in deploy/)."""
        nf = NodeFacts(spec.node, self.kind)
        try:
            import sparkctl.sim  # noqa: F401
        except ImportError as exc:
            nf.engine_error = str(exc)
        nf.ports_free = {(addr, port): local_port_free(addr, port) for addr, port, _ in spec.listen_ports()}
        return nf


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
