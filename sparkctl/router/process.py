"""The router as a local process (the embedded cluster): started from an argv list in its own session, its output to
a log file (mode 0600), ready when /liveness answers, stopped by its PID (SIGTERM, then SIGKILL at the bound)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sparkctl.errors import StateDirError
from sparkctl.nodes import procfs
from sparkctl.nodes.enginegroup import EngineGroup
from sparkctl.nodes.environ import helper_env
from sparkctl.nodes.process import local_port_free
from sparkctl.router import RouterError, strip_colour
from sparkctl.router.spec import MODULE, RouterSpec
from sparkctl.statefiles import open_state_file, private_dir
from sparkctl.tls import tls_context


def router_python() -> str:
    """The interpreter that has sglang_router (sparkctl's own, where the `router` extra installs it)."""
    return sys.executable


@dataclass
class RouterProcess:
    spec: RouterSpec
    pid: int
    log_path: Path
    ticks: int | None = None              # the process's start time (/proc/PID/stat): a reused PID is not ours
    _popen: subprocess.Popen | None = None
    kept = False                          # a process is never taken over: start always starts one

    runtime = "process"

    def to_dict(self) -> dict:
        return {"runtime": self.runtime, "pid": self.pid, "ticks": self.ticks, "log": str(self.log_path),
                "argv": self.spec.args()}

    @property
    def where(self) -> str:
        return f"pid {self.pid}"

    def log_tail(self, lines: int = 20) -> str:
        return _tail(self.log_path, lines)

    @classmethod
    def from_dict(cls, spec: RouterSpec, d: dict) -> RouterProcess:
        """The router a previous controller started (read from its record): stop and liveness by PID + start time.
        A damaged entry is a RouterError naming what is wrong (never a KeyError, never a guessed PID)."""
        pid, ticks, log = d.get("pid"), d.get("ticks"), d.get("log")
        if type(pid) is not int or type(ticks) is not int or not isinstance(log, str):
            raise RouterError(f"the recorded router entry is damaged (pid={pid!r}, ticks={ticks!r}, log={log!r})",
                              hint="stop the router by hand if it runs (`pgrep -af sglang_router`), then move the "
                                   "replicated deployment's record (replicated.json) aside")
        return cls(spec, pid, Path(log), ticks)

    @classmethod
    def start(cls, spec: RouterSpec, log_path: Path, *, ready_timeout_s: float = 30.0,
              python: str | None = None) -> RouterProcess:
        ports_free(spec)
        private_dir(log_path.parent)
        fd = open_state_file(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        env = helper_env(extra={"NO_COLOR": "1"})     # no proxy (it talks to local workers), no secret
        ours = set(procfs.children(os.getpid()))
        proc: RouterProcess | None = None
        try:
            try:
                popen = subprocess.Popen(spec.process_argv(python or router_python()), stdin=subprocess.DEVNULL,
                                         stdout=fd, stderr=subprocess.STDOUT, start_new_session=True, env=env)
            finally:
                os.close(fd)
            proc = cls(spec, popen.pid, log_path, procfs.start_ticks(popen.pid), popen)
            proc.wait_live(ready_timeout_s)
        except BaseException:
            # One handler from the fork to live, so no line between them is outside it (an interrupt between
            # knowing the child and waiting on it once left a router nobody recorded). Before `proc` is known the
            # child may not have exec'd yet (its command line is still ours, so no scan for routers finds it): the
            # child this start forked (procfs.forked_since, as an engine's start) is killed and reaped here. After,
            # not live or interrupted while waiting: stopped, its whole session.
            if proc is None:
                for pid in procfs.forked_since(ours, MODULE[-1]):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, 0)
            else:
                proc.stop(timeout_s=3)
            raise
        return proc

    def alive(self) -> bool:
        """Ours and running. A router found from a record must prove it: its start time matches and its command
        line runs sglang_router, so a stale or damaged record never gets another process signalled."""
        if self._popen is not None:
            return self._popen.poll() is None
        if self.ticks is None or self.pid <= 1:
            return False
        return procfs.running(self.pid, self.ticks) and _runs_router(procfs.cmdline(self.pid))

    def wait_live(self, timeout_s: float) -> None:
        import httpx  # here: `up` of one group imports this module (the replicas' plan) and never asks a router
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if not self.alive():
                raise RouterError(f"router (pid {self.pid}) exited while starting", where=str(self.log_path),
                                  evidence=_tail(self.log_path))
            try:
                live = httpx.get(self.spec.url + "/liveness", timeout=1.0, trust_env=False, verify=tls_context())
                if live.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RouterError(f"router (pid {self.pid}) not live on {self.spec.url} within {timeout_s:g}s",
                          where=str(self.log_path), evidence=_tail(self.log_path))

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM to the router's process group, SIGKILL at the bound to every process of its session (the
        launcher and whatever it started, re-parented or not: sparkctl.nodes.enginegroup); returns once none
        remains."""
        group = EngineGroup(self.pid, self.ticks)
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
        elif self.ticks is None:        # an unproven record: nothing is signalled
            self._reap()
            return
        left = group.wait_gone(timeout_s, reap=self._reap)
        if left:
            group.kill(reap=self._reap)
        self._reap()

    def _reap(self) -> None:
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=0.01)


# sglang-router 0.3.2's launch_router.py sets its process title to this (setproctitle): /proc/PID/cmdline reads
# "sglang::router" once it runs, `python -m sglang_router.launch_router ...` before that.
PROCESS_TITLE = "sglang::router"


def _runs_router(cmdline: list[str]) -> bool:
    return bool(cmdline) and (cmdline[0].startswith(PROCESS_TITLE) or any(MODULE[1] in a for a in cmdline))


def _tail(path: Path, n: int = 20) -> str:
    try:
        with os.fdopen(open_state_file(path, os.O_RDONLY), "rb") as fh:     # never through a planted symlink
            text = fh.read().decode("utf-8", "replace")
    except (OSError, StateDirError):
        return ""
    return strip_colour("\n".join(text.splitlines()[-n:]))


def ports_free(spec: RouterSpec) -> None:
    """The router's port and metrics port are free here, or RouterError naming who holds them: a foreign router
    on the port would answer our liveness probe while ours dies on its bind, and take our replicas."""

    for what, host, port in (("port", spec.host, spec.port), ("metrics port", spec.metrics_host, spec.prometheus_port)):
        if local_port_free(host, port):
            continue
        holder = procfs.listener_of(port)
        who = (f"pid {holder[0]} ({' '.join(holder[1])[:200] or 'no command line'})" if holder
               else "a process this user cannot see")
        raise RouterError(f"the router's {what} {host}:{port} is already held by {who}", where=f"{host}:{port}",
                          hint=f"stop that program, or set router.{'port' if what == 'port' else 'prometheus_port'} "
                               f"in the profile to a free port")
