"""The `docker` runtime: one SGLang rank = one container on a Spark, driven over SSH.

**Docker CLI over the SSH connector, not the docker SDK over ``ssh://``.** Why:

* Host keys. docker-py's paramiko transport reads only ``~/.ssh/known_hosts`` and
  ``~/.ssh/config`` and rejects unknown hosts: it cannot use the inventory's known_hosts,
  its ``accept-new``/``pinned`` policy, its key file or port without patching private
  internals. The connector (`sparkctl.nodes.ssh`) does all of that once, for facts and
  the runtime alike, and names the node in every failure.
* The SDK over SSH is not lighter: it runs ``docker system dial-stdio`` on the node, so
  the docker CLI must be there anyway, and it opens its own SSH connection per client.
* Commands are data. Every container operation is an argv list (`ContainerConfig.argv`)
  that unit tests compare without a daemon, `render`-style, and that a user can paste.
* Secrets stay off command lines and out of ``docker inspect``: the API key and the HF token are
  files (`LaunchSpec.secret_files`: an SGLang ``--config`` YAML, a token file named by
  ``HF_TOKEN_PATH``) written over the SSH channel's stdin with ``install -m 0400 /dev/stdin PATH``
  into a 0700 directory on the node's tmpfs (``/dev/shm/sparkctl-secrets/<container>``), bind-mounted
  read-only at ``/run/sparkctl-secrets``; rewritten before every start (tmpfs does not survive a
  reboot) and removed with the container. The rest of the environment goes through
  ``--env-file /dev/stdin``.

Cost: one SSH channel per docker call (0.05-0.09 s on the test cluster, and 20-50 ms of the
node's CPU for the docker CLI); the preflight runs its commands as parallel channels on one
connection (two round-trips in all).

The container: ``sparkctl-<cluster>-rank<N>-<hash of deployment id>``, labels
``sparkctl.cluster/.deployment/.rank/.node/.profile-identity``, ``--network host``,
``--ipc host`` (the host's /dev/shm: ``--shm-size`` is ignored with a host IPC namespace,
so it is not passed), ``--init`` (reaps the engine's worker processes and forwards
SIGTERM), GPU per ``node.gpu_runtime`` (``--runtime nvidia`` / ``--gpus all`` / none),
``--ulimit memlock=-1 --ulimit stack=67108864`` (memlock overridable with
``$SPARKCTL_DOCKER_MEMLOCK`` for a daemon that may not raise it), ``--device /dev/infiniband`` when the
node has it, the LaunchSpec's mounts (models read-only) plus the JIT caches (TileLang,
Triton, FlashInfer, torch inductor) on host directories under ``host_paths.cache``, so a
recreated container starts warm, and ``--pull never`` (a missing image fails here instead
of a silent multi-GB pull).

Image: ``LaunchSpec.image``; when render left it empty, ``$SPARKCTL_ENGINE_IMAGE``.

Logs are read with ``docker logs --timestamps`` and an offset that is a byte count of the
log text handed out so far. Following is incremental: the runtime remembers where it
stopped (last timestamp + the lines of the last 2 s) and asks only for newer lines,
dropping the overlap, so no line is duplicated or lost; any other offset re-reads the
whole log and slices it. While a boot follows a rank (`follow` .. `unfollow`), its log
streams instead (`sparkctl.nodes.docker_follow`: one ``docker logs --follow`` over one
SSH channel) and reads come from memory at the same offsets; when the stream ends (the
container stopped, the link failed) reads go back to ``docker logs`` from that offset (a
bench's rank watch follows the same way). A restarted container's log starts at its new
start time (``log_since`` in the handle), so old "ready" lines never count for a new boot.

Limits (documented, not hidden): anyone with docker access on a node is root there and can read
the secret files (or exec into the engine); the engine prints its ServerArgs with the API key
into the Docker log on the node (sparkctl redacts it in everything it reads, prints or archives);
lines longer than 16 KiB are split by Docker's log driver into
several lines; removing a container deletes its Docker log unless ``log_dir`` is set (the
log is then archived there first).

Example::

    rt = DockerRuntime(inventory, inventory.node("spark-b"), cluster="desk")
    rt.image_id("sglang-gb10:ab12")        # "sha256:..." or None
    handle = rt.start(spec, "20260101T000000Z-d5-ab12")
    text, offset = rt.read_log(handle, 0)
"""
from __future__ import annotations

import logging
import os
import re
import shlex
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkctl.errors import LedgerError, NodeError
from sparkctl.nodes import docker_facts, facts, procfs
from sparkctl.nodes.container import (
    MEMLOCK_ENV,
    SECRETS_HOST_ROOT,
    ContainerConfig,
    container_config,
    container_name,
    resolve_image,
)
from sparkctl.nodes.docker_follow import QUIET_CHECK_S, LogStream
from sparkctl.nodes.docker_logs import LOG_LOOKBACK_NS, LogEntry, _Cursor, _since_arg, _ts_ns, parse_log_lines
from sparkctl.nodes.node_facts import NodeFacts, gather_over_ssh
from sparkctl.nodes.runtime import DockerHandle, Liveness, sim_env
from sparkctl.nodes.ssh import CommandResult, SSHConnector, connector_for
from sparkctl.redaction import redact, redact_argv
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.statefiles import write_text_atomic

if TYPE_CHECKING:
    from sparkctl.config.inventory import Inventory, Node

log = logging.getLogger("sparkctl.nodes.docker")

# A rank's start is two commands on its node, each one round trip (they were four): the cache directories made and
# the old container of that name read; then `docker run` and the read of what it started. Values are positional
# parameters of `sh -c` ("$@"), never parsed by the shell.
MKDIR_FAILED = 97
MKDIR_THEN_INSPECT = (f'n=$1; shift; mkdir -p -- "$@" || exit {MKDIR_FAILED}; '
                      f'exec {shlex.join(docker_facts.container_state("-").argv[:-1])} "$n"')   # the one inspect
RUN_THEN_INSPECT = ('id=$("$@") || exit; echo "$id"; '
                    f'exec {shlex.join(docker_facts.container_state("-").argv[:-1])} "$id"')

@dataclass(frozen=True)
class Prepared:
    """What `DockerRuntime.prepare` read for one start: the container's name and the state of the one of that name
    already there (None: none), its cache directories made."""

    container: str
    old: docker_facts.ContainerState | None


# ------------------------------------------------------------------------------------------------ runtime
class DockerRuntime:
    """Runtime protocol for one node's engine container (see module docstring). Example::

        rt = DockerRuntime(inv, inv.node("spark-a"), cluster=inv.cluster.name)
        h = rt.start(spec, dep_id); rt.liveness(h); rt.stop(h); h = rt.start(spec, dep_id); rt.remove(h)
    """

    runtime = "docker"
    needs_image = True
    POLL_S = 1.0            # a read_log/liveness without a stream: an SSH session and docker CLI runs on the node
    STREAM_POLL_S = 0.2     # while every followed log streams (docker_follow), a poll reads memory

    def __init__(self, inventory: Inventory, node: Node, *, cluster: str, connector: SSHConnector | None = None,
                 log_dir: Path | None = None, environ: dict[str, str] | None = None) -> None:
        self.inventory = inventory
        self.node = node
        self.cluster = cluster
        self.ssh = connector or connector_for(inventory, node)
        self.log_dir = log_dir
        self.environ = dict(os.environ if environ is None else environ)
        self._cursors: dict[str, _Cursor] = {}
        self._lock = threading.Lock()
        self._infiniband: bool | None = None
        self._streams: dict[str, LogStream] = {}   # container id -> its log, streamed while a boot follows it
        self.secret_values: set[str] = set()    # redacted from every log line read (grows with each start)
        self.launch_image: Any = None    # deploy.image_stage.LaunchImage, bound by the image stage of `up`

    # -- helpers -----------------------------------------------------------------------------------------------
    def _docker(self, *args: str, check: bool = True, timeout: float = 60.0, stdin: str | None = None,
                merge_stderr: bool = False, secrets: frozenset[str] = frozenset()) -> CommandResult:
        return self.ssh.run(["docker", *args], check=check, timeout=timeout, stdin=stdin, merge_stderr=merge_stderr,
                            secrets=secrets)

    def _inspect(self, ref: str, *, make_dirs: list[str] | tuple[str, ...] = ()) -> docker_facts.ContainerState | None:
        """The container `ref`'s state, or None when there is none. `make_dirs`: host directories created first, in
        the same command (`mkdir -p`; a start's cache directories: one round trip for both)."""
        fact = docker_facts.container_state(ref)
        if make_dirs:
            res = self.ssh.run(["sh", "-c", MKDIR_THEN_INSPECT, "sh", ref, *make_dirs])
            if res.returncode == MKDIR_FAILED:
                res.check()
        else:
            res = self.ssh.run(list(fact.argv))
        if res.returncode != 0:
            if "no such" in res.stderr.lower():
                return None
            res.check()
        return fact.parse(res.stdout)

    def has_infiniband(self) -> bool:
        """/dev/infiniband on the node (cached: devices do not come and go between commands)."""
        if self._infiniband is None:
            self._infiniband = self.ssh.run(list(facts.dir_entries("/dev/infiniband").argv)).returncode == 0
        return self._infiniband

    def _handle(self, spec_rank: int, deployment_id: str, cfg_name: str, state: docker_facts.ContainerState, image: str,
                log_since: str | None) -> DockerHandle:
        return DockerHandle(node=self.node.name, rank=spec_rank, cluster=self.cluster, container=cfg_name,
                            container_id=state.id, image=image, image_id=state.image_id, deployment=deployment_id,
                            log_since=log_since, started_at=state.started_at)

    # -- Runtime protocol --------------------------------------------------------------------------------------
    def _config(self, spec: LaunchSpec, deployment_id: str) -> ContainerConfig:
        launch = self.launch_image     # a launch image: its entrypoint builds the argv from the per-rank env
        extra = sim_env(self.inventory.cluster.sim)
        if launch is not None:
            extra.update(launch.environment(spec))
        return container_config(spec, self.node, cluster=self.cluster, deployment_id=deployment_id,
                                image=launch.tag if launch is not None else resolve_image(spec, self.environ),
                                infiniband=self.has_infiniband(), memlock=self.environ.get(MEMLOCK_ENV) or "-1",
                                extra_env=extra, command=[] if launch is not None else None)

    def launch_argv(self, spec: LaunchSpec, deployment_id: str) -> list[str]:
        """The `docker run` argv `start` runs for this rank when no stopped container of the same launch exists
        (secrets are files mounted at /run/sparkctl-secrets; the environment goes over stdin)."""
        return redact_argv(self._config(spec, deployment_id).argv, spec.secret_options)   # by field: numbers stay

    def prepare(self, spec: LaunchSpec, deployment_id: str) -> Prepared:
        """What `start` of this rank reads and makes first, done ahead (boot: every rank at once, before the first
        start) and handed to that start: its cache directories made and the old container of its name read.
        Nothing is started or removed."""
        cfg = self._config(spec, deployment_id)
        return Prepared(cfg.name, self._inspect(cfg.name, make_dirs=cfg.host_dirs))

    def start(self, spec: LaunchSpec, deployment_id: str, prepared: object = None) -> DockerHandle:
        """Start the rank's container (detached). Reuses a stopped container of the same deployment when it runs
        exactly this launch (rollback's fast path); otherwise replaces it. `prepared`: what `prepare` read for this
        start (else it is read now)."""
        cfg = self._config(spec, deployment_id)
        image = cfg.image
        secrets = spec.secret_values
        self.secret_values.update(secrets)
        if isinstance(prepared, Prepared) and prepared.container == cfg.name:
            old = prepared.old
        else:
            old = self._inspect(cfg.name, make_dirs=cfg.host_dirs)
        if old is not None:
            if old.status == "exited" and self._same_launch(old, cfg, spec):
                log.info("[%s] reusing stopped container %s (same launch)", self.node.name, cfg.name)
                self._write_secrets(cfg, spec)
                self._docker("start", old.id, secrets=secrets)
                state = self._inspect(old.id)
                if state is None:
                    raise NodeError(f"container {cfg.name} vanished right after start", where=f"[{self.node.name}]")
                return self._handle(spec.rank, deployment_id, cfg.name, state, image, state.started_at)
            log.info("[%s] replacing container %s (%s)", self.node.name, cfg.name, old.describe())
            self._docker("rm", "--force", old.id)
        self._write_secrets(cfg, spec)
        # `docker run`, then `docker container inspect` of what it started, as one command (one round trip)
        res = self.ssh.run(["sh", "-c", RUN_THEN_INSPECT, "sh", *cfg.argv], stdin=cfg.env_file, secrets=secrets,
                           timeout=120)
        if res.returncode != 0:
            low = res.stderr.lower()
            if "no such image" in low:
                hint = "the image is not on this node: run the image stage (sparkctl up builds/copies it)"
            elif "rlimit type 8" in low:
                hint = (f"the docker daemon on {self.node.name} may not grant memlock=unlimited: run dockerd with "
                        f"LimitMEMLOCK=infinity (docker.service's default); on a host that cannot (a sandbox without "
                        f"CAP_SYS_RESOURCE) set {MEMLOCK_ENV} to the daemon's limit in bytes")
            else:
                hint = "read the docker error below"
            self._docker("rm", "--force", cfg.name, check=False)   # docker run leaves the created container behind
            self._remove_secrets(cfg.name)
            raise NodeError(f"docker run failed for rank {spec.rank} ({cfg.name}), exit {res.returncode}",
                            where=f"[{self.node.name}] docker", hint=hint, evidence=res.output[-2000:])
        state = docker_facts.parse_container_inspect(res.stdout)
        if state is None:
            raise NodeError(f"container {cfg.name} not found right after docker run", where=f"[{self.node.name}]",
                            evidence=res.output[-800:] or None)
        return self._handle(spec.rank, deployment_id, cfg.name, state, image, None)

    def _write_secrets(self, cfg: ContainerConfig, spec: LaunchSpec) -> None:
        """The rank's secret files on the node: content over stdin (never in an argv), dir 0700, files 0400."""
        if not cfg.secrets_dir:
            return
        self.ssh.run(["install", "-d", "-m", "0700", "--", SECRETS_HOST_ROOT, cfg.secrets_dir], check=True)
        for name, content in sorted(spec.secret_files.items()):
            self.ssh.run(["install", "-m", "0400", "/dev/stdin", f"{cfg.secrets_dir}/{name}"], stdin=content,
                         secrets=spec.secret_values, check=True)

    def _remove_secrets(self, container: str) -> None:
        self.ssh.run(["rm", "-rf", "--", f"{SECRETS_HOST_ROOT}/{container}"], check=False)

    def _same_launch(self, old: docker_facts.ContainerState, cfg: ContainerConfig, spec: LaunchSpec) -> bool:
        """Same labels (identity), command and environment (compared in memory; secrets never leave it)."""
        if any(old.labels.get(k) != v for k, v in cfg.labels.items()):
            return False
        if list(old.cmd) != list(cfg.command):
            return False
        return {f"{k}={v}" for k, v in cfg.env.items()} <= set(old.env)

    @property
    def poll_interval_s(self) -> float:
        """How often boot polls (the Runtime protocol): STREAM_POLL_S while every log it follows streams."""
        with self._lock:
            streams = list(self._streams.values())
        return self.STREAM_POLL_S if streams and all(s.live for s in streams) else self.POLL_S

    def follow(self, handle: DockerHandle, bound_s: float) -> None:
        """Stream the container's log (`docker_follow.LogStream`) until `unfollow`, for at most `bound_s`: while it
        streams, `read_log` reads it from memory and `liveness` asks the node only after a quiet spell."""
        cid = handle.container_id
        with self._lock:
            if cid in self._streams:
                return
        since = _ts_ns(handle.log_since) if handle.log_since else 0
        stream = LogStream(self.ssh, cid, since, bound_s, lambda text: redact(text, self.secret_values))
        with self._lock:
            self._streams[cid] = stream

    def unfollow(self) -> None:
        """End every stream `follow` opened (the channel closes; the node's `docker logs` ends at its stdin EOF)."""
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.stop(wait=False)         # every channel closing at once, then each thread joined
        for stream in streams:
            stream.stop()

    def _streaming(self, cid: str) -> LogStream | None:
        with self._lock:
            stream = self._streams.get(cid)
        return stream if stream is not None and stream.live else None

    def liveness(self, handle: DockerHandle) -> Liveness:
        """One SSH round trip: the container's state and its processes (`docker_facts.container_liveness`). While
        its log streams (`follow`) and has not been quiet for `QUIET_CHECK_S`, the container runs (the stream ends
        when it stops) and nothing is asked; a quiet one is asked once per `QUIET_CHECK_S` (a SIGSTOP or a pause
        is silent)."""
        stream = self._streaming(handle.container_id)
        if stream is not None:
            now = time.monotonic()
            if stream.last_check_alive and (now - stream.last_line_at < QUIET_CHECK_S
                                            or now - stream.last_checked_at < QUIET_CHECK_S):
                return Liveness(True, f"container {handle.container} running")
            stream.last_checked_at = now
        live = self._liveness(handle)
        if stream is not None:
            stream.last_check_alive = live.alive     # a rank found stopped is asked again at every call
        return live

    def _liveness(self, handle: DockerHandle) -> Liveness:
        seen = self._observe(handle.container_id)
        state = seen.state
        if state is None:
            return Liveness(False, f"container {handle.container} is gone (removed)")
        if state.running and state.status == "paused":    # docker inspect: Running and Paused both true
            return Liveness(False, f"container {handle.container} paused (`docker unpause {handle.container}` "
                                   f"resumes it, `sparkctl up` replaces it)")
        if state.running:
            stopped = _first_stopped(seen.processes)
            if stopped is not None:
                return Liveness(False, f"stopped (process {stopped.pid} ({stopped.command}) of running container "
                                       f"{handle.container} is in state {stopped.state}: SIGSTOP, Ctrl-Z or a tracer; "
                                       f"`kill -CONT {stopped.pid}` on {self.node.name} resumes it, `sparkctl up` "
                                       f"replaces it)")
            return Liveness(True, f"container {handle.container} running")
        return Liveness(False, f"container {handle.container} {state.status} ({state.exit_code})"
                               + (" OOM-killed" if state.oom_killed else "")
                               + (f": {state.error}" if state.error else ""), state.exit_code)

    def _stopped_process(self, handle: DockerHandle) -> docker_facts.ContainerProcess | None:
        """The first stopped process of a running container (`docker top` alone: what `stop` needs), or None; None
        too when `docker top` cannot answer (the container is not running)."""
        fact = docker_facts.container_processes(handle.container_id)
        res = self.ssh.run(list(fact.argv))
        return _first_stopped(fact.parse(res.stdout)) if res.returncode == 0 else None

    def _observe(self, ref: str) -> docker_facts.ContainerLiveness:
        fact = docker_facts.container_liveness(ref)
        res = self.ssh.run(list(fact.argv))
        if res.returncode != 0:
            if "no such" in res.stderr.lower():
                return docker_facts.ContainerLiveness(None, [])
            res.check()
        return fact.parse(res.stdout)

    def read_log(self, handle: DockerHandle, offset: int = 0) -> tuple[str, int]:
        """Complete log lines from byte ``offset`` of this run's log, and the next offset (see module docstring)."""
        cid = handle.container_id
        stream = self._streaming(cid)
        if stream is not None:
            return stream.read(offset)
        base_ns = _ts_ns(handle.log_since) if handle.log_since else 0
        with self._lock:
            cur = self._cursors.get(cid)
        if cur is not None and cur.offset == offset and offset > 0:
            since = max(base_ns, cur.last_ns - LOG_LOOKBACK_NS)
            entries = self._fetch_log(cid, since)
            if entries is None:
                return "", offset
            seen = [e for e in cur.window if e.ts_ns >= since]
            if entries[:len(seen)] == seen:
                new = entries[len(seen):]
                text = "".join(e.text for e in new)
                self._advance(cid, cur, new, offset + len(text.encode()))
                return text, offset + len(text.encode())
            log.debug("[%s] log overlap mismatch for %s: re-reading the whole log", self.node.name, cid[:12])
        entries = self._fetch_log(cid, base_ns or None)
        if entries is None:
            return "", offset
        data = "".join(e.text for e in entries).encode()
        if offset >= len(data):
            return "", offset
        text = data[offset:].decode("utf-8", "replace")
        end = len(data)
        # Rebuild the cursor from the full read so the next call with `end` is incremental.
        cursor = _Cursor(offset=end, last_ns=entries[-1].ts_ns if entries else base_ns)
        cursor.window = [e for e in entries if e.ts_ns >= cursor.last_ns - LOG_LOOKBACK_NS]
        with self._lock:
            self._cursors[cid] = cursor
        return text, end

    def _advance(self, cid: str, cur: _Cursor, new: list[LogEntry], offset: int) -> None:
        if new:
            cur.last_ns = max(cur.last_ns, max(e.ts_ns for e in new))
            cur.window = [e for e in cur.window + new if e.ts_ns >= cur.last_ns - LOG_LOOKBACK_NS]
        cur.offset = offset
        with self._lock:
            self._cursors[cid] = cur

    def _fetch_log(self, cid: str, since_ns: int | None) -> list[LogEntry] | None:
        args = ["logs", "--timestamps"] + (["--since", _since_arg(since_ns)] if since_ns else []) + [cid]
        # 2>&1 on the node: the engine's stdout and stderr in the order Docker stored them.
        res = self._docker(*args, check=False, merge_stderr=True, timeout=120)
        if res.returncode != 0:
            if "no such container" in res.stdout.lower():
                return None
            raise NodeError(f"docker logs failed for {cid[:12]} (exit {res.returncode})",
                            where=f"[{self.node.name}] docker", evidence=res.output[-2000:])
        # The engine prints its ServerArgs (api_key='...'): nothing sparkctl reads from a log keeps a secret.
        return parse_log_lines(redact(res.stdout, self.secret_values))

    def stop(self, handle: DockerHandle, *, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; the container stays (stopped) for a fast restart, its secret
        files on the node go (`start` writes them again before a restart).

        A container whose process is stopped (SIGSTOP, Ctrl-Z, a tracer) would keep SIGTERM pending for the whole
        timeout: it gets SIGCONT first (`docker kill --signal CONT` reaches PID 1, the `--init` process, which
        forwards it to its child, the engine), as the process runtime's `stop` does."""
        if self._stopped_process(handle) is not None:
            self._docker("kill", "--signal", "CONT", handle.container_id, check=False)
        res = self._docker("stop", "--time", str(max(0, int(round(timeout_s)))), handle.container_id,
                           check=False, timeout=timeout_s + 60)
        if res.returncode != 0 and "no such container" not in res.stderr.lower():
            res.check()
        self._remove_secrets(handle.container)

    def cleanup_secrets(self) -> list[str]:
        """Remove the secret directories on this node of this cluster's containers that are not running (a
        container killed with the controller, removed by hand, a node that lost its engines): what settle and
        `down` call. Three SSH round-trips; returns ``"[node] /dev/shm/sparkctl-secrets/<container>"`` per
        directory removed. Directories of other clusters are never touched."""
        prefix = re.escape(container_name(self.cluster, 0, "")).split("rank0", 1)[0]
        ours = re.compile(prefix + r"rank\d+-[0-9a-f]{10}")
        res = self.ssh.run(["find", SECRETS_HOST_ROOT, "-mindepth", "1", "-maxdepth", "1", "-type", "d",
                            "-printf", "%f\\n"], check=False)
        if res.returncode != 0:          # no secrets directory on this node at all
            return []
        dirs = [d for d in res.stdout.split() if ours.fullmatch(d)]
        if not dirs:
            return []
        running = {h.container for h, alive in self.labelled() if alive}
        stale = [f"{SECRETS_HOST_ROOT}/{d}" for d in dirs if d not in running]
        if stale:
            self.ssh.run(["rm", "-rf", "--", *stale], check=True)
        return [f"[{self.node.name}] {p}" for p in stale]

    def remove(self, handle: DockerHandle) -> None:
        """Remove the container for good (idempotent); its log is archived to ``log_dir`` first when set."""
        if self.log_dir is not None:
            try:
                text, _ = self.read_log(handle.model_copy(update={"log_since": None}), 0)
                if text:
                    write_text_atomic(self.log_dir / f"rank{handle.rank}-{handle.container}.log", text)
            except (NodeError, LedgerError) as exc:   # the state directory full or read-only: removed all the same
                log.warning("[%s] could not archive the log of %s: %s", self.node.name, handle.container, exc)
        res = self._docker("rm", "--force", handle.container_id, check=False)
        if res.returncode != 0 and "no such container" not in res.stderr.lower():
            res.check()
        self._remove_secrets(handle.container)
        with self._lock:
            self._cursors.pop(handle.container_id, None)

    def labelled(self) -> list[tuple[DockerHandle, bool]]:
        """Every container on this node labelled ``sparkctl.cluster=<cluster>`` (running or not), as handles:
        what sparkctl started here, whatever the ledger says (`down`, settle and `repair` read this)."""
        fmt = '{{.ID}}\t{{.Names}}\t{{.State}}\t{{.Label "sparkctl.deployment"}}\t{{.Label "sparkctl.rank"}}'
        res = self._docker("ps", "-a", "--no-trunc", "--filter", f"label=sparkctl.cluster={self.cluster}",
                           "--format", fmt, check=True)
        out = []
        for line in res.stdout.splitlines():
            parts = line.split("\t")
            if len(parts) != 5 or not parts[4].isdigit():
                continue
            cid, name, state, dep, rank = parts
            out.append((DockerHandle(node=self.node.name, rank=int(rank), cluster=self.cluster, container=name,
                                     container_id=cid, deployment=dep), state == "running"))
        return out

    # -- image -------------------------------------------------------------------------------------------------
    def image_id(self, image: str) -> str | None:
        fact = docker_facts.image_id(image)
        res = self.ssh.run(list(fact.argv))
        return fact.parse(res.stdout) if res.returncode == 0 else None

    # -- preflight ---------------------------------------------------------------------------------------------
    def gather(self, spec: LaunchSpec) -> NodeFacts:
        """Read-only facts of this node over SSH (two round-trips of parallel commands); judged in deploy/."""
        nf = gather_over_ssh(self.ssh, self.node, [p for p in self.inventory.nodes if p.name != self.node.name], spec)
        if "ib" in nf.outputs:
            self._infiniband = nf.outputs["ib"].returncode == 0
        return nf


def _first_stopped(processes: list[docker_facts.ContainerProcess]) -> docker_facts.ContainerProcess | None:
    """The first process in state T/t (the same rule as the process runtime's `procfs.stopped_in_tree`)."""
    return next((p for p in processes if p.state in procfs.STOPPED_STATES), None)
