"""The `process` runtime: each rank of the embedded cluster is a local engine process.

The LaunchSpec's argv (`python3 -m sglang.launch_server ...`) runs unchanged except for the program, which the
inventory chooses (`sparkctl_engine`): `python -m sparkctl.sim`, sparkctl's emulator (the default; a vLLM spec runs its
vLLM dialect, `python -m sparkctl.sim serve ...`), or
`<sparkctl_engine_python> -m sglang.launch_server`, the real SGLang installed in that environment (on this
machine's CPU: testrig/realengine builds one). Whatever only a CPU needs (`--device cpu`, the thread binding)
comes from the profile and the inventory, never from here. Two paths are rewritten the way a container's mounts
would place them: ``/models/...`` is the node's ``host_paths.models`` (``~`` expanded), and the secrets mount is
the rank's tmpfs directory (below). The process
is detached (own session) so it outlives `sparkctl up`, its output goes to a log
file in the state directory through `sparkctl.nodes.logpipe` (secrets redacted line by line;
the recorded PID is that parent's), and the handle records the PID plus its kernel start
time so a recycled PID is never mistaken for our engine. Each boot attempt of a rank appends
to the rank log from the offset its handle records (`ProcessHandle.log_offset`).

Secret files (API key, HF token) never touch a disk: they live on tmpfs, under `secrets_home()`
(``$XDG_RUNTIME_DIR/sparkctl`` when that is set and a tmpfs, else ``/dev/shm/sparkctl-<uid>``), in
``<key of the state directory>/<deployment>/rank<N>/`` (directories 0700, files 0400: read-only even
for the owner, replaced by unlink and create), and are removed as soon as their engine has stopped
(`stop`), or, after a kill -9 of everything, by `cleanup_secrets` (settle, `down`).

The engine's environment (the caller's minus secrets, the emulator knobs, the rank's `env` from the profile) is
the engine's alone: the log pipe in front of it is sparkctl's own Python, started with the caller's environment
minus secrets and ``python -I``; it gets the engine's environment from ``engine-env.json`` in the same secrets
directory (0400), deletes it, and passes it to the engine only (`sparkctl.nodes.logpipe`).
"""
from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from sparkctl.jsontypes import JSONObject
from sparkctl.nodes import procfs
from sparkctl.nodes.enginegroup import (
    EngineGroup,
    Leftover,
    cgroup_of,
    join_cgroup,
    leftover_cgroups,
    new_cgroup,
    release_shm,
    shm_files,
)
from sparkctl.nodes.environ import helper_env
from sparkctl.nodes.logpipe import ENGINE_ENV_FILE
from sparkctl.nodes.node_facts import NodeFacts, host_model_path, model_paths
from sparkctl.nodes.runtime import Liveness, ProcessHandle, sim_env
from sparkctl.nodes.secretdirs import (
    local_secret_path,
    own_private_dir,
    remove_private_dir,
    secrets_home,
    secrets_root_for,
    write_secret_files,
)
from sparkctl.nodes.ssh import CommandResult
from sparkctl.redaction import redact, redact_argv
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.sglang.render import MODELS_MOUNT
from sparkctl.statefiles import open_state_file, private_dir, state_dir_error

log = logging.getLogger("sparkctl.nodes.process")


def read_lines(path: Path, offset: int, limit: int = -1) -> tuple[str, int]:
    """The complete lines of `path` from byte `offset` (at most `limit` bytes; a partial last line waits for the
    next read) and how many bytes they took; nothing when the file is not there (yet)."""
    try:
        fd = open_state_file(path, os.O_RDONLY)      # a planted symlink (logs/router.log -> elsewhere) is refused
    except FileNotFoundError:
        return "", 0
    with os.fdopen(fd, "rb") as fh:
        fh.seek(offset)
        data = fh.read(limit)
    cut = data.rfind(b"\n") + 1
    return data[:cut].decode("utf-8", "replace"), cut

def _reap_child(pid: int) -> None:
    """Collect `pid`'s exit status if it has ended (a child this process forked and knows only by its pid)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


class ProcessRuntime:
    """Runs ranks as local processes of the emulator. Example::

        rt = ProcessRuntime(log_dir=Path("/tmp/logs"), sim_knobs={"boot_s": 3})
        handle = rt.start(spec, "dep-1")
    """

    runtime = "process"
    needs_image = False       # the emulator runs in place
    poll_interval_s = 0.1
    # How long liveness reuses a rank's list of descendants (the processes whose state it reads on every call).
    # Walking the tree reads every thread's children file: ~70 reads and ~1.5 ms of CPU per real SGLang rank, ten
    # times a second per rank during a boot, on the same cores the engines boot on. The states themselves are read
    # on every call; a process the engine starts later is in the list within this long.
    tree_ttl_s = 1.0

    def __init__(self, log_dir: Path, sim_knobs: JSONObject | None = None, *,
                 secrets_root: Path | None = None, engine: str = "emulator",
                 engine_pythons: Mapping[str, str] | None = None, models_dir: str = MODELS_MOUNT) -> None:
        """`secrets_root` names whose secrets these are (the state directory's, e.g. ``ledger.root / "secrets"``;
        default: the one holding `log_dir`): the files themselves live on tmpfs, at `secrets_root_for` of it.
        `engine` "emulator" runs sparkctl's emulator, anything else the rank's engine (LaunchSpec.engine) with its
        Python from `engine_pythons` (``python -m sglang.launch_server``, ``python -m vllm.entrypoints.cli.main
        serve``); `models_dir` is where /models/... is here."""
        self.log_dir = log_dir
        self.sim_knobs = dict(sim_knobs or {}) if engine == "emulator" else {}
        self.secrets_root = secrets_root_for(secrets_root or log_dir.parent.parent / "secrets")
        self.engine = engine
        self.engine_pythons = {name: os.path.expanduser(p) for name, p in (engine_pythons or {}).items()}
        self.models_dir = os.path.expanduser(models_dir)
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._trees: dict[tuple[int, int | None], tuple[float, list[int]]] = {}

    def _tree(self, handle: ProcessHandle) -> list[int]:
        """The rank's descendants, walked again at most every `tree_ttl_s` (keyed by PID and start time)."""
        key, now = (handle.pid, handle.start_ticks), time.monotonic()
        cached = self._trees.get(key)
        if cached is None or now - cached[0] >= self.tree_ttl_s:
            cached = (now, procfs.descendants(handle.pid))
            self._trees[key] = cached
        return cached[1]

    def tmp_dir(self, deployment_id: str, rank: int) -> Path:
        """The rank's TMPDIR when its engine is vLLM (0700, on the secrets' tmpfs, removed with its secrets): a short
        path, because vLLM binds its ZMQ IPC sockets there (`ipc://$TMPDIR/<uuid>`, at most 107 bytes:
        vllm/utils/network_utils.py), named by a digest of the rank's secrets directory."""
        digest = hashlib.sha256(str(self.secrets_dir(deployment_id, rank)).encode()).hexdigest()[:12]
        return self.secrets_root.parent / f"t{digest}"

    def secrets_dir(self, deployment_id: str, rank: int) -> Path:
        """The rank's private directory standing in for SECRETS_MOUNT, on tmpfs (0700, files 0400; removed once
        the engine has stopped)."""
        return self.secrets_root / deployment_id / f"rank{rank}"

    def _command(self, spec: LaunchSpec, secrets_dir: Path | None = None) -> list[str]:
        """The spec's launch with this node's Python: `python3 -m MODULE [serve] ARGS` becomes the inventory's
        engine Python (the emulator: this Python running sparkctl.sim, which speaks SGLang's argv, and vLLM's after
        `serve`)."""
        module = spec.argv[2]
        head = 4 if module == "vllm.entrypoints.cli.main" else 3      # vLLM's is `... main serve ARGS`
        args = [self._mounted(local_secret_path(a, secrets_dir)) for a in spec.argv[head:]]
        if self.engine != "emulator":
            return [self.engine_pythons.get(spec.engine) or "python3", "-m", *spec.argv[2:head], *args]
        return [sys.executable, "-m", "sparkctl.sim", *spec.argv[3:head], *args]     # vLLM's: `sim serve ARGS`

    def _mounted(self, value: str) -> str:
        """A /models/... path of the LaunchSpec where this node keeps it (host_paths.models), as a mount would."""
        return host_model_path(value, self.models_dir) or value

    def prepare(self, spec: LaunchSpec, deployment_id: str) -> None:
        """Nothing to read ahead: `start` forks here (its `prepared` is ignored)."""

    def follow(self, handle: ProcessHandle, bound_s: float) -> None:
        """Nothing to open: the rank's log is a local file, its liveness /proc."""

    def unfollow(self) -> None:
        """Nothing was opened."""

    def launch_argv(self, spec: LaunchSpec, deployment_id: str) -> list[str]:
        """The command `start` runs: the LaunchSpec's SGLang arguments, given to the inventory's engine (the secret
        flags' values redacted, by position: a number equal to a secret stays)."""
        return redact_argv(self._command(spec), spec.secret_options)

    def start(self, spec: LaunchSpec, deployment_id: str, prepared: object = None) -> ProcessHandle:
        private_dir(self.log_dir)
        log_path = self.log_dir / f"rank{spec.rank}.log"
        # The caller's environment, minus any variable holding one of the rank's secrets (HF_TOKEN, the API key's
        # variable): the engine gets those from its secret files only.
        own = {k: v for k, v in os.environ.items() if v not in spec.secret_values}
        env = dict(own)
        # Knobs the caller's environment sets (tests, fault injection) win over the inventory's.
        if self.engine == "emulator":
            env.update({k: v for k, v in sim_env(self.sim_knobs).items() if k not in os.environ})
            env.setdefault("SPARKCTL_SIM_VLLM_VERSION" if spec.engine == "vllm" else "SPARKCTL_SIM_SGLANG_VERSION",
                           spec.sglang_version)
        sdir = self.secrets_dir(deployment_id, spec.rank)
        env.update({k: local_secret_path(v, sdir) for k, v in spec.env.items()})
        env["PYTHONUNBUFFERED"] = "1"
        if spec.engine == "vllm":
            # vLLM's single-node rendezvous is a file in tempfile.gettempdir() (`vllm_dist_<hex>`,
            # vllm/utils/network_utils.py:154) that it never removes: the rank's temporary files live in a private
            # directory of its own, which goes with its secrets once the engine has stopped (a container's /tmp goes
            # with the container).
            env["TMPDIR"] = str(self.tmp_dir(deployment_id, spec.rank))
        # The engine's output reaches the log through sparkctl.nodes.logpipe, which redacts secrets line by line.
        # Its stdout is the rank log from the moment it exists (it appends there itself, and its own errors land
        # there too): a later command finds a running engine by the rank log it writes (sparkctl.deploy.observe).
        # The pipe is sparkctl's own code: it runs with a helper's environment (sparkctl.nodes.environ), isolated
        # (`-I`: no PYTHON* variable, no user site, no cwd on sys.path), never with the rank's; the engine's environment
        # (the profile's env included) reaches the engine alone through a 0400 file the pipe reads and deletes.
        pipe_env = helper_env()
        pipe = [sys.executable, "-I", "-m", "sparkctl.nodes.logpipe", str(log_path), str(sdir), "--"]
        # One log per rank and deployment, one attempt after the other: this attempt starts at `log_offset` (after
        # a newline ending whatever a killed attempt left half-written), and the handle reads from there only.
        try:
            fd = open_state_file(log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            raise state_dir_error(log_path, exc) from None
        # The whole engine is tracked: the pipe leads a new session (every process below it keeps that session id)
        # and, where this node lets us make one, it joins a cgroup of its own before it starts the engine, so every
        # process of the engine is born inside (sparkctl.nodes.enginegroup).
        cgroup = None
        before = set(procfs.children(os.getpid()))
        try:
            try:
                cgroup = new_cgroup(self.state_key, deployment_id, spec.rank)
                offset = attempt_start(fd, log_path)
                own_private_dir(secrets_home())
                write_secret_files(sdir, {**spec.secret_files, ENGINE_ENV_FILE: json.dumps(env)})
                if spec.engine == "vllm":
                    own_private_dir(self.tmp_dir(deployment_id, spec.rank))
                proc = subprocess.Popen(pipe + self._command(spec, sdir), stdin=subprocess.DEVNULL, stdout=fd,
                                        stderr=fd, env=pipe_env, start_new_session=True, close_fds=True,
                                        preexec_fn=(lambda: join_cgroup(str(cgroup))) if cgroup else None)
            finally:
                os.close(fd)
            self._children[proc.pid] = proc
            return ProcessHandle(node=spec.node, rank=spec.rank, pid=proc.pid,
                                 start_ticks=procfs.start_ticks(proc.pid), log=str(log_path), log_offset=offset,
                                 deployment=deployment_id, spec=spec.redacted().model_dump(mode="json"),
                                 cgroup=str(cgroup) if cgroup else None)
        except BaseException:
            # Interrupted between the fork and the handle's return (inside Popen, or before the caller has the
            # handle): the log pipe may have exec'd (then it names the secret directory, which keeps it) and start
            # the engine nobody recorded. Its whole session (and cgroup) is killed and reaped first, then the rest.
            for pid in procfs.forked_since(before, str(log_path)):
                EngineGroup(pid, None, str(cgroup) if cgroup else None).kill(reap=functools.partial(_reap_child, pid))
            self._drop_secrets(deployment_id, spec.rank)
            if cgroup is not None:
                EngineGroup(0, None, str(cgroup)).release()
            raise

    @property
    def state_key(self) -> str:
        """16 hex digits naming this state directory (its secrets' and engine cgroups' directory name)."""
        return self.secrets_root.name

    def group(self, handle: ProcessHandle) -> EngineGroup:
        """Every process of the handle's engine (its session; its cgroup, when it has one: the handle's, or, for a
        handle rebuilt from what runs, the one its log pipe is in)."""
        cgroup = handle.cgroup or (cgroup_of(handle.pid) if self._ours(handle) else None)
        return EngineGroup(handle.pid, handle.start_ticks, cgroup)

    def leftovers(self, handles: list[ProcessHandle]) -> list[Leftover]:
        """Processes of this state directory's engines that outlived them: of each recorded handle whose log pipe is
        gone, what still runs in its session or cgroup; and every engine cgroup of this state directory that holds
        processes but belongs to no running handle (named by the deployment and rank in its name)."""
        out: list[Leftover] = []
        seen: set[tuple[int, int | None]] = set()
        sessions: dict[int, list[tuple[int, int]]] | None = None   # every process by session: read once, if needed
        for h in handles:
            if (h.pid, h.start_ticks) in seen or self._ours(h):    # a running pipe: a running engine
                continue
            seen.add((h.pid, h.start_ticks))
            group = EngineGroup(h.pid, h.start_ticks, h.cgroup)
            if sessions is None:
                sessions = procfs.sessions()
            members = group.members(sessions)
            if members:
                out.append(Leftover(h.deployment, h.rank, group, tuple(members)))
        named = {lo.group.cgroup for lo in out}          # a cgroup already named by its record's handle
        return out + [lo for lo in leftover_cgroups(self.state_key) if lo.group.cgroup not in named]

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
            stopped = procfs.stopped_in_tree(pid, self._tree(handle))
            if stopped is not None:
                who = f"pid {stopped[0]}" + ("" if stopped[0] == pid else f", under pid {pid}")
                return Liveness(False, f"stopped ({who} is in state {stopped[1]}: SIGSTOP, Ctrl-Z or a tracer; "
                                       f"`kill -CONT {stopped[0]}` resumes it, `sparkctl up` replaces it)")
            return Liveness(True, f"running (pid {pid})")
        return Liveness(False, f"not running (pid {pid} gone)")

    def read_log(self, handle: ProcessHandle, offset: int = 0) -> tuple[str, int]:
        """This attempt's log text from `offset` (counted from the attempt's start, `handle.log_offset`)."""
        text, used = read_lines(Path(handle.log), handle.log_offset + offset)
        return redact(text, ()), offset + used   # logpipe redacted the values

    def stop(self, handle: ProcessHandle, *, timeout_s: float = 15.0) -> None:
        """Stop the whole engine: SIGTERM through its log pipe (which passes it on, and stops what the engine leaves
        once it exits), then SIGKILL to every process of it still there after `timeout_s`; returns once none of it
        remains (or, for a process that a SIGKILL cannot end yet, after `enginegroup.KILL_S` more, with a warning).
        Once it is gone, its secret files and cgroup go too (a restart makes them again)."""
        self._stop(handle, timeout_s)
        if not self._ours(handle):
            self._drop_secrets(handle.deployment, handle.rank)

    def _stop(self, handle: ProcessHandle, timeout_s: float) -> None:
        group = self.group(handle)
        reap = lambda: self._reap(handle)     # noqa: E731 - the pipe is our child when this runtime started it
        shm = shm_files([m.pid for m in group.members()])    # what it maps in /dev/shm: released once it is gone
        if self._ours(handle):
            pid = handle.pid
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
                os.killpg(pid, signal.SIGCONT)  # a stopped (SIGSTOPped) engine acts on SIGTERM only once continued
            left = group.wait_gone(timeout_s, reap=reap)
        else:
            # The pipe is gone (it exited, or was killed): whatever its engine left in the session or cgroup is
            # stopped the same way, with a shorter grace (nothing of it serves any more).
            reap()
            left = group.members()
            if left:
                group.signal(signal.SIGTERM)
                group.signal(signal.SIGCONT)
                left = group.wait_gone(min(timeout_s, 5.0), reap=reap)
        if left:
            left = group.kill(reap=reap)     # the pipe too: it leads the session
        reap()
        if not left:
            group.release()
            release_shm(shm)

    def _drop_secrets(self, deployment_id: str, rank: int) -> bool:
        """Remove a rank's secret directory unless a running engine still uses it (a newer attempt of the same
        rank, started by another command); True when it is gone."""
        sdir = self.secrets_dir(deployment_id, rank)
        if not sdir.exists():
            remove_private_dir(self.tmp_dir(deployment_id, rank))
            return True
        if procfs.processes_naming(str(sdir)):
            return False
        shutil.rmtree(sdir, ignore_errors=True)
        remove_private_dir(self.tmp_dir(deployment_id, rank))
        for empty in (sdir.parent, self.secrets_root):   # the deployment's, then the state directory's, once empty
            try:
                empty.rmdir()
            except OSError:
                break
        return not sdir.exists()

    def cleanup_secrets(self) -> list[str]:
        """Remove every secret directory of this state directory whose engine is gone (after a kill -9 of the
        controller and its engines, a reboot-less crash...): what settle and `down` call. Returns the removed
        directories; a directory a running engine uses is kept."""
        removed: list[str] = []
        try:
            deployments = sorted(p for p in self.secrets_root.iterdir() if p.is_dir())
        except OSError:
            return removed
        for dep in deployments:
            for rank_dir in sorted(dep.glob("rank*")):
                if rank_dir.name[4:].isdigit() and self._drop_secrets(dep.name, int(rank_dir.name[4:])):
                    removed.append(str(rank_dir))
            with contextlib.suppress(OSError):
                dep.rmdir()
        with contextlib.suppress(OSError):
            self.secrets_root.rmdir()
        if removed:
            log.info("removed %d secret directories of stopped engines under %s", len(removed), self.secrets_root)
        return removed

    def _reap(self, handle: ProcessHandle) -> None:
        child = self._children.get(handle.pid)
        if child is not None:
            child.poll()

    def remove(self, handle: ProcessHandle) -> None:
        """Stop the engine for good (its secrets go with it; its log stays)."""
        self.stop(handle)

    def gather(self, spec: LaunchSpec) -> NodeFacts:
        """Local facts: can the engine run (the emulator imports; the real engine's Python has SGLang, and the
        model and drafter are here), are the rank's ports free here (judged in deploy/)."""
        nf = NodeFacts(spec.node, self.runtime, engine=self.engine if self.engine == "emulator" else spec.engine)
        if self.engine != "emulator":
            nf.engine_error = engine_missing(self.engine_pythons.get(spec.engine), spec.engine)
            nf.local_paths = {what: (host, os.path.isfile(os.path.join(host, "config.json")))
                              for what, path in model_paths(spec.argv)
                              for host in [self._mounted(path)]}
        else:
            try:
                import sparkctl.sim  # noqa: F401
            except ImportError as exc:
                nf.engine_error = str(exc)
        nf.ports_free = {(addr, port): local_port_free(addr, port) for addr, port, _ in spec.listen_ports()}
        for (addr, port), free in nf.ports_free.items():
            holder = None if free else procfs.listener_of(port, addr)
            if holder is not None:
                nf.port_holders[(addr, port)] = (holder[0], procfs.title(holder[0]))
        nf.outputs["mem"] = read_local_meminfo(spec.node)
        return nf


# engine -> (package, a file of it the launch needs, what it is called in messages)
_ENGINE_FILES = {"sglang": ("sglang", "launch_server.py", "sglang.launch_server"),
                 "vllm": ("vllm", os.path.join("entrypoints", "cli", "main.py"), "vllm.entrypoints.cli.main")}


def engine_missing(python: str | None, engine: str = "sglang") -> str | None:
    """Why the engine cannot run from `python` (no such Python, or no such engine in its environment), or None.
    Looks the module up without importing it (SGLang's and vLLM's imports take seconds)."""
    if not python:
        return "no engine Python is set (inventory sparkctl_engine_python)"
    if not os.access(python, os.X_OK):
        return f"{python} does not exist or is not executable"
    package, needed, module = _ENGINE_FILES[engine]
    # find_spec of a top-level name imports nothing (of `sglang.launch_server` it would import sglang: seconds)
    probe = (f"import importlib.util, os, sys; s = importlib.util.find_spec({package!r}); "
             f"sys.exit(0 if s and any(os.path.isfile(os.path.join(d, {needed!r})) "
             "for d in (s.submodule_search_locations or ())) else 3)")
    try:
        res = subprocess.run([python, "-I", "-c", probe], stdin=subprocess.DEVNULL, capture_output=True,
                             timeout=30, env=helper_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} cannot run: {exc}"
    if res.returncode == 3:
        return f"{python} has no {module} ({engine} is not installed in its environment)"
    if res.returncode != 0:
        last = (res.stderr.decode("utf-8", "replace").strip().splitlines() or [f"exit {res.returncode}"])[-1]
        return f"{python} fails to look up {package}: {last[:300]}"
    return None
def read_local_meminfo(node: str, path: str = "/proc/meminfo") -> CommandResult:
    """This machine's /proc/meminfo as a command result (the embedded cluster's nodes are this machine): read, not
    run, so a missing or unreadable file is a result with exit 1 and the reason, never an exception."""
    try:
        return CommandResult(node, ["cat", path], 0, Path(path).read_text(encoding="utf-8", errors="replace"), "",
                             0.0)
    except OSError as exc:
        return CommandResult(node, ["cat", path], 1, "", f"{path}: {exc.strerror or exc}", 0.0)


def attempt_start(fd: int, path: Path) -> int:
    """The byte offset where a new attempt's lines start in the log open at `fd` (O_APPEND): its size, after a
    newline that ends a line a killed attempt left half-written. StateDirFullError/StateDirError if it cannot."""
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            try:
                os.write(fd, b"\n")
                size += 1
            except OSError as exc:   # no room for it: the attempt still starts at `size` (its reader begins there)
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
    except OSError as exc:
        raise state_dir_error(path, exc) from None
    return size


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
