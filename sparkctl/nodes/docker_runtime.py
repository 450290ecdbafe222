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
* Secrets stay off command lines: the environment goes through ``--env-file /dev/stdin``
  (fed over the SSH channel), so HF_TOKEN is never in an argv, a process list or a log.

Cost: one SSH channel per docker call (~0.2 s on the test cluster, dominated by the
remote session start); the preflight runs its commands as parallel channels on one
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
whole log and slices it. A restarted container's log starts at its new start time
(``log_since`` in the handle), so old "ready" lines never count for a new boot.

Limits (documented, not hidden): ``docker inspect`` on the node shows the container's
environment and command line, so anyone with docker access on a node can read HF_TOKEN
and an ``--api-key`` that render puts in the argv (the engine's own command line shows
the key in ``ps`` too); lines longer than 16 KiB are split by Docker's log driver into
several lines; removing a container deletes its Docker log unless ``log_dir`` is set (the
log is then archived there first).

Example::

    rt = DockerRuntime(inventory, inventory.node("spark-b"), cluster="desk")
    rt.image_id("sglang-gb10:ab12")        # "sha256:..." or None
    handle = rt.start(spec, "20260101T000000Z-d5-ab12")
    text, offset = rt.read_log(handle, 0)
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkctl.errors import ConfigError, NodeError
from sparkctl.nodes import facts
from sparkctl.nodes.node_facts import NodeFacts, gather_over_ssh
from sparkctl.nodes.runtime import DockerHandle, Liveness, sim_env
from sparkctl.nodes.ssh import CommandResult, SSHConnector, connector_for
from sparkctl.sglang.launch import LaunchSpec

if TYPE_CHECKING:
    from sparkctl.config.inventory import Inventory, Node

log = logging.getLogger("sparkctl.nodes.docker")

IMAGE_ENV = "SPARKCTL_ENGINE_IMAGE"
MEMLOCK_ENV = "SPARKCTL_DOCKER_MEMLOCK"        # override memlock=-1 (a daemon without CAP_SYS_RESOURCE)
CONTAINER_HOME = "/root"                      # the SGLang images run as root
LOG_LOOKBACK_NS = 2_000_000_000               # overlap re-read when following (see module docstring)
# JIT caches the engine fills at first use: (directory under host_paths.cache, path in the container, env var)
JIT_CACHES = (
    ("tilelang", f"{CONTAINER_HOME}/.tilelang", None),
    ("triton", f"{CONTAINER_HOME}/.triton", None),
    ("flashinfer", f"{CONTAINER_HOME}/.cache/flashinfer", None),
    ("torchinductor", f"{CONTAINER_HOME}/.cache/torchinductor", "TORCHINDUCTOR_CACHE_DIR"),
)
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ------------------------------------------------------------------------------------------------ pure part
def container_name(cluster: str, rank: int, deployment_id: str) -> str:
    """``sparkctl-<cluster>-rank<N>-<10 hex of sha256(deployment id)>`` (Docker's name charset)."""
    safe = re.sub(r"[^a-zA-Z0-9_.-]+", "-", cluster).strip("-.") or "cluster"
    short = hashlib.sha256(deployment_id.encode()).hexdigest()[:10]
    return f"sparkctl-{safe}-rank{rank}-{short}"


def spec_identity(spec: LaunchSpec, image: str) -> str:
    """Content hash of what this rank runs (redacted argv/env, image, mounts): same hash = same launch."""
    data = {**spec.redacted(), "image": image}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def resolve_image(spec: LaunchSpec, environ: dict[str, str] | None = None) -> str:
    """The engine image: ``spec.image``, else ``$SPARKCTL_ENGINE_IMAGE``; ConfigError when neither is set."""
    env = os.environ if environ is None else environ
    image = spec.image or env.get(IMAGE_ENV)
    if not image:
        raise ConfigError(f"no engine image for rank {spec.rank} ({spec.node})", where=f"[{spec.node}] docker",
                          hint=f"set the image in the profile (render fills LaunchSpec.image), or export "
                               f"{IMAGE_ENV}=REPO:TAG")
    return image


def _check_path(path: str, what: str, node: str) -> str:
    if not path.startswith("/") or any(c in path for c in ",\n\r\0"):
        raise ConfigError(f"{what} {path!r} must be an absolute path without commas or newlines",
                          where=f"[{node}] docker", hint="fix host_paths / the model path")
    return path.rstrip("/") or "/"


def _covered(target: str, targets: list[str]) -> bool:
    return any(target == t or target.startswith(t.rstrip("/") + "/") for t in targets)


@dataclass(frozen=True)
class ContainerConfig:
    """Everything `docker run` gets for one rank: the argv (no secrets) and the env file (may hold secrets)."""

    name: str
    image: str
    argv: list[str]
    env: dict[str, str]
    labels: dict[str, str]
    mounts: list[dict[str, Any]]
    host_dirs: list[str]                 # writable host directories to create before the container starts
    secret_values: frozenset[str] = frozenset()

    @property
    def env_file(self) -> str:
        """``KEY=VALUE`` lines for ``--env-file /dev/stdin`` (values verbatim: Docker does not unquote them)."""
        return "".join(f"{k}={v}\n" for k, v in sorted(self.env.items()))

    def redacted_env(self) -> dict[str, str]:
        out = {}
        for k, v in sorted(self.env.items()):
            for s in self.secret_values:
                if s:
                    v = v.replace(s, "***")
            out[k] = v
        return out


def container_config(spec: LaunchSpec, node: "Node", *, cluster: str, deployment_id: str, image: str,
                     infiniband: bool = False, identity: str | None = None, memlock: str = "-1",
                     extra_env: dict[str, str] | None = None) -> ContainerConfig:
    """Build the `docker run` parameters for one rank (pure: no daemon, no SSH). Example::

        cfg = container_config(spec, node, cluster="desk", deployment_id="d1", image="sglang-gb10:1")
        cfg.argv   # ['docker', 'run', '--detach', '--name', 'sparkctl-desk-rank0-...', ..., 'python3', '-m', ...]
    """
    name = container_name(cluster, spec.rank, deployment_id)
    labels = {"sparkctl.cluster": cluster, "sparkctl.deployment": deployment_id, "sparkctl.rank": str(spec.rank),
              "sparkctl.node": node.name, "sparkctl.profile-identity": identity or spec_identity(spec, image)}
    mounts: list[dict[str, Any]] = []
    host_dirs: list[str] = []
    for m in spec.mounts:
        src = _check_path(str(m["source"]), "mount source", node.name)
        dst = _check_path(str(m["target"]), "mount target", node.name)
        ro = bool(m.get("read_only"))
        mounts.append({"source": src, "target": dst, "read_only": ro})
        if not ro:
            host_dirs.append(src)
    env: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
    if node.gpu_runtime == "nvidia":
        env.update(NVIDIA_VISIBLE_DEVICES="all", NVIDIA_DRIVER_CAPABILITIES="compute,utility")
    cache = _check_path(node.host_paths.cache, "host_paths.cache", node.name)
    targets = [m["target"] for m in mounts]
    for sub, target, env_var in JIT_CACHES:
        if env_var:
            env[env_var] = target
        if _covered(target, targets):      # e.g. render mounts host_paths.cache at ~/.cache already
            continue
        mounts.append({"source": f"{cache}/{sub}", "target": target, "read_only": False})
        host_dirs.append(f"{cache}/{sub}")
    env.update(extra_env or {})            # e.g. emulator knobs of a cluster whose engine is the emulator
    env.update(spec.env)                   # the LaunchSpec wins over our defaults
    for k, v in env.items():
        if not _ENV_KEY.match(k) or any(c in v for c in "\n\r\0"):
            raise ConfigError(f"environment variable {k!r} cannot be passed to a container (bad name, or a newline "
                              f"in its value)", where=f"[{node.name}] docker", hint="fix the profile's env")
    argv = ["docker", "run", "--detach", "--pull", "never", "--name", name]
    for k, v in labels.items():
        argv += ["--label", f"{k}={v}"]
    argv += ["--network", "host", "--ipc", "host", "--init"]
    if node.gpu_runtime == "nvidia":
        argv += ["--runtime", "nvidia"]
    elif node.gpu_runtime == "gpus-all":
        argv += ["--gpus", "all"]
    if not re.fullmatch(r"-1|\d+(:\d+)?", memlock):
        raise ConfigError(f"{MEMLOCK_ENV}={memlock!r} is not a memlock limit", hint="use -1 (unlimited) or bytes")
    argv += ["--ulimit", f"memlock={memlock}", "--ulimit", "stack=67108864"]
    if infiniband:
        argv += ["--device", "/dev/infiniband"]
    for m in mounts:
        argv += ["--mount", f"type=bind,source={m['source']},target={m['target']}" + (",readonly" if m["read_only"]
                                                                                         else "")]
    # A hash of the whole (redacted) run command: a stopped container is reused only for exactly this launch.
    shown = [spec.redact_text(a) for a in argv + [image, *spec.argv]]
    labels["sparkctl.config-hash"] = hashlib.sha256(json.dumps(shown).encode()).hexdigest()[:16]
    argv[argv.index("--network"):argv.index("--network")] = ["--label", f"sparkctl.config-hash={labels['sparkctl.config-hash']}"]
    argv += ["--env-file", "/dev/stdin", image, *spec.argv]
    return ContainerConfig(name=name, image=image, argv=argv, env=env, labels=labels, mounts=mounts,
                           host_dirs=sorted(set(host_dirs)), secret_values=spec.secret_values)


# ------------------------------------------------------------------------------------------------ log timestamps
def _ts_ns(ts: str) -> int:
    """RFC 3339 with nanoseconds (``2026-01-01T10:00:00.123456789Z``) -> ns since the epoch."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)", ts)
    if not m:
        raise ValueError(f"not a docker log timestamp: {ts!r}")
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    base = datetime.fromisoformat(m.group(1) + tz)
    return int(base.timestamp()) * 1_000_000_000 + int((m.group(2) or "0").ljust(9, "0"))


def _since_arg(ns: int) -> str:
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


@dataclass(frozen=True)
class LogEntry:
    ts_ns: int
    text: str            # the line, ending in "\n"


def parse_log_lines(output: str) -> list[LogEntry]:
    """Split ``docker logs --timestamps`` output into entries; a line without a timestamp joins the previous one."""
    entries: list[LogEntry] = []
    for ln in output.split("\n"):
        head, sep, rest = ln.partition(" ")
        try:
            ts = _ts_ns(head)
        except ValueError:
            if entries and ln:
                last = entries[-1]
                entries[-1] = LogEntry(last.ts_ns, last.text + ln + "\n")
            continue
        entries.append(LogEntry(ts, rest + "\n"))
    return entries


@dataclass
class _Cursor:
    offset: int
    last_ns: int
    window: list[LogEntry] = field(default_factory=list)   # entries handed out with ts >= last_ns - lookback


# ------------------------------------------------------------------------------------------------ runtime
class DockerRuntime:
    """Runtime protocol for one node's engine container (see module docstring). Example::

        rt = DockerRuntime(inv, inv.node("spark-a"), cluster=inv.cluster.name)
        h = rt.start(spec, dep_id); rt.liveness(h); rt.stop(h); h = rt.start(spec, dep_id); rt.remove(h)
    """

    kind = "docker"
    needs_image = True
    poll_interval_s = 0.5   # each read_log/liveness is an SSH round-trip (~0.2 s here)

    def __init__(self, inventory: "Inventory", node: "Node", *, cluster: str, connector: SSHConnector | None = None,
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

    # -- helpers -----------------------------------------------------------------------------------------------
    def _docker(self, *args: str, check: bool = True, timeout: float = 60.0, stdin: str | None = None,
                merge_stderr: bool = False, secrets: frozenset[str] = frozenset()) -> CommandResult:
        return self.ssh.run(["docker", *args], check=check, timeout=timeout, stdin=stdin, merge_stderr=merge_stderr,
                            secrets=secrets)

    def _inspect(self, ref: str) -> facts.ContainerState | None:
        fact = facts.container_state(ref)
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

    def _handle(self, spec_rank: int, deployment_id: str, cfg_name: str, state: facts.ContainerState, image: str,
                log_since: str | None) -> DockerHandle:
        return DockerHandle(node=self.node.name, rank=spec_rank, cluster=self.cluster, container=cfg_name,
                            container_id=state.id, image=image, image_id=state.image_id, deployment=deployment_id,
                            log_since=log_since, started_at=state.started_at)

    # -- Runtime protocol --------------------------------------------------------------------------------------
    def start(self, spec: LaunchSpec, deployment_id: str) -> DockerHandle:
        """Start the rank's container (detached). Reuses a stopped container of the same deployment when it runs
        exactly this launch (rollback's fast path); otherwise replaces it."""
        image = resolve_image(spec, self.environ)
        cfg = container_config(spec, self.node, cluster=self.cluster, deployment_id=deployment_id, image=image,
                               infiniband=self.has_infiniband(), memlock=self.environ.get(MEMLOCK_ENV) or "-1",
                               extra_env=sim_env(self.inventory.cluster.sim))
        secrets = spec.secret_values
        old = self._inspect(cfg.name)
        if old is not None:
            if old.status == "exited" and self._same_launch(old, cfg, spec):
                log.info("[%s] reusing stopped container %s (same launch)", self.node.name, cfg.name)
                self._docker("start", old.id, secrets=secrets)
                state = self._inspect(old.id)
                if state is None:
                    raise NodeError(f"container {cfg.name} vanished right after start", where=f"[{self.node.name}]")
                return self._handle(spec.rank, deployment_id, cfg.name, state, image, state.started_at)
            log.info("[%s] replacing container %s (%s)", self.node.name, cfg.name, old.describe())
            self._docker("rm", "--force", old.id)
        if cfg.host_dirs:
            self.ssh.run(["mkdir", "-p", "--", *cfg.host_dirs], check=True)
        res = self._docker(*cfg.argv[1:], stdin=cfg.env_file, secrets=secrets, timeout=120, check=False)
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
            raise NodeError(f"docker run failed for rank {spec.rank} ({cfg.name}), exit {res.returncode}",
                            where=f"[{self.node.name}] docker", hint=hint, evidence=res.output[-2000:])
        state = self._inspect(res.stdout.strip().splitlines()[-1] if res.stdout.strip() else cfg.name)
        if state is None:
            raise NodeError(f"container {cfg.name} not found right after docker run", where=f"[{self.node.name}]")
        return self._handle(spec.rank, deployment_id, cfg.name, state, image, None)

    def _same_launch(self, old: facts.ContainerState, cfg: ContainerConfig, spec: LaunchSpec) -> bool:
        """Same labels (identity), command and environment (compared in memory; secrets never leave it)."""
        if any(old.labels.get(k) != v for k, v in cfg.labels.items()):
            return False
        if list(old.cmd) != list(spec.argv):
            return False
        return {f"{k}={v}" for k, v in cfg.env.items()} <= set(old.env)

    def liveness(self, handle: DockerHandle) -> Liveness:
        state = self._inspect(handle.container_id)
        if state is None:
            return Liveness(False, f"container {handle.container} is gone (removed)")
        if state.running:
            return Liveness(True, f"container {handle.container} running")
        return Liveness(False, f"container {handle.container} {state.status} ({state.exit_code})"
                               + (" OOM-killed" if state.oom_killed else "")
                               + (f": {state.error}" if state.error else ""), state.exit_code)

    def read_log(self, handle: DockerHandle, offset: int = 0) -> tuple[str, int]:
        """Complete log lines from byte ``offset`` of this run's log, and the next offset (see module docstring)."""
        cid = handle.container_id
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
        return parse_log_lines(res.stdout)

    def stop(self, handle: DockerHandle, *, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; the container stays (stopped) for a fast restart."""
        res = self._docker("stop", "--time", str(max(0, int(round(timeout_s)))), handle.container_id,
                           check=False, timeout=timeout_s + 60)
        if res.returncode != 0 and "no such container" not in res.stderr.lower():
            res.check()

    def remove(self, handle: DockerHandle) -> None:
        """Remove the container for good (idempotent); its log is archived to ``log_dir`` first when set."""
        if self.log_dir is not None:
            try:
                text, _ = self.read_log(handle.model_copy(update={"log_since": None}), 0)
                if text:
                    self.log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                    path = self.log_dir / f"rank{handle.rank}-{handle.container}.log"
                    path.write_text(text)
                    path.chmod(0o600)
            except NodeError as exc:
                log.warning("[%s] could not archive the log of %s: %s", self.node.name, handle.container, exc)
        res = self._docker("rm", "--force", handle.container_id, check=False)
        if res.returncode != 0 and "no such container" not in res.stderr.lower():
            res.check()
        with self._lock:
            self._cursors.pop(handle.container_id, None)

    # -- image -------------------------------------------------------------------------------------------------
    def image_id(self, image: str) -> str | None:
        fact = facts.image_id(image)
        res = self.ssh.run(list(fact.argv))
        return fact.parse(res.stdout) if res.returncode == 0 else None

    # -- preflight ---------------------------------------------------------------------------------------------
    def gather(self, spec: LaunchSpec) -> NodeFacts:
        """Read-only facts of this node over SSH (two round-trips of parallel commands); judged in deploy/."""
        nf = gather_over_ssh(self.ssh, self.node, [p for p in self.inventory.nodes if p.name != self.node.name], spec)
        if "ib" in nf.outputs:
            self._infiniband = nf.outputs["ib"].returncode == 0
        return nf
