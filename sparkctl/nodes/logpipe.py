"""Run an engine with its output redacted into a log file: ``python -m sparkctl.nodes.logpipe LOG SECRETS_DIR -- CMD``.

The process runtime's engine log lives in sparkctl's state directory, and SGLang (like the emulator) prints its
``server_args=ServerArgs(..., api_key='KEY', ...)`` at start-up. So the engine does not write the file itself:
this small parent reads its stdout+stderr line by line, passes each line through `sparkctl.redaction.redact`
(the values of the rank's secret files, plus the ``api_key='...'`` pattern) and appends it to LOG (0600).

It is the process the runtime records (the leader of a new session); the engine runs in a process group of its
own, so a signal to the pipe's group reaches the engine once, through the pipe, and never twice (a second SIGTERM
would cut a graceful shutdown short: Python restores default handlers while it exits). Every way it can end is
handled, and none writes a traceback into the log:

* the engine exits with a code: the pipe exits with the same code;
* the engine dies by a signal (a negative return code): the pipe ends by the same signal (SIGKILL and the like
  cannot have a handler: the default disposition is restored only where it can be; core dumps are off), so
  the runtime sees the same end as if it had run the engine itself;
* the engine cannot be started (missing program, not executable): one line saying so in the log, exit 127
  (not found) or 126 (found, not runnable), like a shell;
* SIGTERM/SIGINT/SIGHUP to the pipe (to its group, or to the pipe alone): passed on to the engine once, and the
  pipe keeps draining until the engine exits, then ends the same way;
* SIGKILL of the pipe: the kernel kills the engine too (PR_SET_PDEATHSIG); nothing more is written (what the
  engine started lives on in the pipe's session and cgroup: the runtime's stop finds it there,
  `sparkctl.nodes.enginegroup`);
* the engine's own processes (SGLang's schedulers, detokenizer, resource tracker) never outlive it: the pipe is a
  child subreaper, so an orphan of the engine is re-parented to the pipe, and once the engine has exited the pipe
  stops every process left in its tree and session (SIGTERM, SIGKILL after `SWEEP_GRACE_S`), reaps them, and only
  then exits. Their output still reaches the log until they are gone (a reader thread drains the pipe, so an
  orphan holding the engine's stdout never keeps the pipe from seeing the engine's end);
* the log cannot be written (the state directory is full): lines are dropped, not the engine; once writing
  works again one line says how many were lost.

Secret values are read from SECRETS_DIR (never from argv or env). So is the engine's environment: the runtime
starts this pipe with its own environment (minus secrets) and ``python -I``, never with the rank's (the profile's
``env`` is the engine's to have, not sparkctl's: a ``PYTHONPATH`` or ``LD_PRELOAD`` there must not run code in
the pipe), and hands the engine's over in ``SECRETS_DIR/engine-env.json`` (a JSON mapping, 0400), which the pipe
reads, deletes, and gives the engine alone. Without that file the engine gets the pipe's own environment; a file
that is not a mapping of strings is one line in the log and exit 126.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import yaml

from sparkctl.nodes.enginegroup import EngineGroup, release_shm, shm_files
from sparkctl.nodes.procfs import descendants, start_ticks
from sparkctl.redaction import redact

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
SWEEP_GRACE_S = 5.0      # what the engine left gets this long after SIGTERM before SIGKILL
DRAIN_S = 2.0            # after the sweep, how long the last output may take to reach the log
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_NOT_FOUND, EXIT_NOT_RUNNABLE = 127, 126
ENGINE_ENV_FILE = "engine-env.json"     # in SECRETS_DIR: the engine's environment (read once, then deleted)


class EngineEnvError(Exception):
    """SECRETS_DIR/engine-env.json cannot be read or is not a JSON mapping of strings to strings."""


def take_engine_env(directory: Path) -> dict[str, str] | None:
    """The engine's environment from `directory`/engine-env.json, the file deleted once read (it lives only
    between the runtime's start and the engine's); None when there is none. EngineEnvError when it is unusable."""
    path = directory / ENGINE_ENV_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise EngineEnvError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "rb") as fh:
            data = fh.read()
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
    try:
        env = json.loads(data)
    except ValueError as exc:
        raise EngineEnvError(f"{path} is not JSON: {exc}") from None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise EngineEnvError(f"{path} is not a mapping of variable names to string values")
    return env


def secret_values(directory: Path) -> set[str]:
    """Every secret value held in `directory`: YAML files' scalar values, other files' stripped content."""
    out: set[str] = set()
    try:
        paths = list(directory.iterdir()) if directory.is_dir() else []
    except OSError:
        return out
    for path in paths:
        if path.name == ENGINE_ENV_FILE:      # the engine's environment, not a secret
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        if path.suffix in (".yaml", ".yml"):
            try:
                data = yaml.safe_load(text) or {}
            except yaml.YAMLError:
                data = {}
            out.update(str(v) for v in (data.values() if isinstance(data, dict) else []) if v not in (None, ""))
        elif text.strip():
            out.add(text.strip())
    return out


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the engine may outlive a killed parent
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _become_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: orphans go to init; the runtime's stop sweeps
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _left_behind() -> list[int]:
    """Every process still in the pipe's tree (orphans of the engine come to the subreaper) and, when the pipe leads
    its session (as the runtime starts it), in its session: what the engine left when it exited."""
    me = os.getpid()
    pids = set(descendants(me))
    if os.getsid(0) == me:
        pids.update(m.pid for m in EngineGroup(me, start_ticks(me)).members())
    pids.discard(me)
    return sorted(pids)


def _reap_any() -> None:
    """Collect every child that has ended (orphans of the engine are the subreaper's children)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def sweep(grace_s: float = SWEEP_GRACE_S) -> list[int]:
    """Stop what the engine left: SIGTERM to each, SIGKILL to what is there after `grace_s`, reaped; the PIDs
    signalled."""
    left = _left_behind()
    if not left:
        return []
    shm = shm_files(left)           # what they map in /dev/shm: released once they are gone
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in _left_behind():
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap_any()
            if not _left_behind():
                release_shm(shm)
                return left
            time.sleep(0.05)
    _reap_any()
    return left


class _Log:
    """Appends to the rank log; a failed write drops the line (counted), never the engine."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.lost = 0
        self.why = ""
        self.closed = False      # set once the pipe is done: a line the reader still holds goes nowhere

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            if self.lost:
                self.fh.write(f"[sparkctl logpipe: {self.lost} lines lost: {self.why}]\n".encode())
                self.lost = 0
            self.fh.write(data)
        except OSError as exc:
            self.lost += 1
            self.why = exc.strerror or str(exc)


def end_like(code: int) -> int:
    """End this process the way the engine ended: exit `code`, or die by signal ``-code``. Returns the exit code to
    use when dying by that signal is not possible (a signal that does not kill by default): 128 + signal."""
    if code >= 0:
        return code
    sig = -code
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))    # SIGSEGV/SIGABRT: the engine's end, not a core of ours
    with contextlib.suppress(OSError, ValueError):
        signal.signal(sig, signal.SIG_DFL)                 # SIGKILL/SIGSTOP cannot be changed: they need not be
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
    except (OSError, ValueError):
        pass
    return 128 + sig


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m sparkctl.nodes.logpipe LOG SECRETS_DIR -- CMD...", file=sys.stderr)
        return 2
    log_path, sdir = Path(argv[0]), Path(argv[1])
    try:
        engine_env, env_error = take_engine_env(sdir), ""
    except EngineEnvError as exc:
        engine_env, env_error = None, str(exc)
    secrets = secret_values(sdir)
    command = argv[3:]
    child: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: object) -> None:
        # The engine's only door for signals (its own process group). Until it has started there is nothing to
        # pass it to: the runtime's stop escalates to SIGKILL, and PR_SET_PDEATHSIG takes the engine along.
        if child and child[0].poll() is None:
            with contextlib.suppress(OSError):
                child[0].send_signal(signum)
    for sig in FORWARDED:
        signal.signal(sig, forward)     # a handler (not SIG_IGN): the engine gets default dispositions
    _become_subreaper()
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        print(f"sparkctl logpipe: cannot open the log {log_path}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_NOT_RUNNABLE
    with os.fdopen(fd, "wb", buffering=0) as fh:
        log = _Log(fh)
        if env_error:
            log.write(f"sparkctl logpipe: cannot start {command[0]!r}: {env_error} (exit {EXIT_NOT_RUNNABLE})\n"
                      .encode())
            return EXIT_NOT_RUNNABLE
        try:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                                    process_group=0, env=engine_env)
        except OSError as exc:
            code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_RUNNABLE
            log.write(f"sparkctl logpipe: cannot start {command[0]!r}: {exc.strerror or exc} (exit {code})\n"
                      .encode())
            return code
        child.append(proc)
        assert proc.stdout is not None
        lock = threading.Lock()
        reader = threading.Thread(target=_drain, args=(proc.stdout, log, secrets, lock), daemon=True)
        reader.start()
        code = proc.wait()
        left = sweep()
        reader.join(DRAIN_S)
        with lock:
            if left:
                log.write(f"[sparkctl logpipe: the engine exited ({code}); stopped {len(left)} processes it left: "
                          f"{' '.join(map(str, left))}]\n".encode())
            log.closed = True
    return end_like(code)


def _drain(stream: IO[bytes], log: _Log, secrets: set[str], lock: threading.Lock) -> None:
    """The engine's output (its processes' too), line by line, redacted into the log, until every writer is gone."""
    while True:
        try:
            line = stream.readline()
        except (InterruptedError, ValueError, OSError):   # pragma: no cover - PEP 475 retries; a closed stream
            return
        if not line:
            return
        text = line.decode("utf-8", "surrogateescape")
        with lock:
            log.write(redact(text, secrets).encode("utf-8", "surrogateescape"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
