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
    rt.ensure_image(spec)                  # "image sglang-gb10:ab12 present on spark-b (sha256:...)"
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

from sparkctl.errors import ConfigError, NodeError, PreflightError
from sparkctl.nodes import facts
from sparkctl.nodes.runtime import DockerHandle, Liveness, sim_env
from sparkctl.nodes.ssh import CommandResult, SSHConnector, connector_for
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.sglang.render import MODELS_MOUNT

if TYPE_CHECKING:
    from sparkctl.config.inventory import Inventory, Node
    from sparkctl.deploy.preflight import Check

log = logging.getLogger("sparkctl.nodes.docker")

IMAGE_ENV = "SPARKCTL_ENGINE_IMAGE"
MEMLOCK_ENV = "SPARKCTL_DOCKER_MEMLOCK"        # override memlock=-1 (a daemon without CAP_SYS_RESOURCE)
CONTAINER_HOME = "/root"                      # the SGLang images run as root
LOG_LOOKBACK_NS = 2_000_000_000               # overlap re-read when following (see module docstring)
WARN = "warning: "                            # Check.seen prefix of a warning (ok=True, but worth reading)
MIN_FABRIC_MTU = 9000
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


def gpu_idle_check(node: str, smi: facts.NvidiaSmi, *, ours_running: bool) -> "Check":
    """The GPU must be idle before boot (unified memory: another compute process shrinks what the engine gets).

    Graphics processes (Xorg, gnome-shell on a desktop Spark) only warn. When sparkctl's own deployment runs,
    its engine is expected on the GPU (it is stopped before the new boot), so compute processes only warn.
    """
    from sparkctl.deploy.preflight import Check

    compute = smi.compute_processes
    shown = ", ".join(f"pid {p.pid} {p.name} ({p.memory_mib} MiB)" for p in compute)
    graphics = [p for p in smi.processes if p not in compute]
    if not compute:
        extra = f" ({len(graphics)} graphics processes: {', '.join(p.name for p in graphics)})" if graphics else ""
        return Check(node, "gpu idle", True, (WARN if graphics else "") + "no compute process on the GPU"
                     + extra)
    if ours_running:
        return Check(node, "gpu idle", True, f"{WARN}in use by {shown} (the active deployment's engine is "
                                             f"expected here; it is stopped before the new boot)")
    return Check(node, "gpu idle", False, f"GPU busy: {shown}",
                 f"stop those processes on {node} first: on unified memory they take what the engine needs")


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

    def ensure_image(self, spec: LaunchSpec) -> str:
        """Check the engine image is on this node; PreflightError naming node and image when it is not."""
        image = resolve_image(spec, self.environ)
        found = self.image_id(image)
        if found is None:
            peers = [n.name for n in self.inventory.nodes if n.name != self.node.name]
            raise PreflightError(
                f"image {image} is not on {self.node.name}", where=f"[{self.node.name}] image",
                hint=f"build it there, or copy it from a node that has it: docker save {image} | "
                     f"ssh {self.node.ssh.user}@{self.node.ssh.host} docker load"
                     + (f" (peers: {', '.join(peers)})" if peers else ""))
        return f"image {image} present on {self.node.name} ({found})"

    # -- preflight ---------------------------------------------------------------------------------------------
    def preflight(self, spec: LaunchSpec, own_ports: set[tuple[str, int]]) -> list["Check"]:
        """Read-only checks of this node over SSH, in two round-trips of parallel commands."""
        from sparkctl.deploy.preflight import Check, ports_of

        n = self.node
        name = n.name
        try:
            self.ssh.connect()
        except NodeError as exc:
            return [Check(name, "ssh", False, exc.message, exc.hint or "")]
        checks = [Check(name, "ssh", True, f"{self.ssh.address} reachable")]
        peers = [p for p in self.inventory.nodes if p.name != name]
        models = _model_paths(spec.argv)
        named: list[tuple[str, facts.Fact[Any]]] = [
            ("docker", facts.docker_info()), ("ip", facts.ip_addr()), ("mem", facts.meminfo()),
            ("ss", facts.listening()), ("gpu", facts.gpu_query()), ("smi", facts.nvidia_smi()),
            ("ib", facts.dir_entries("/dev/infiniband"))]
        if n.roce_hcas:
            named.append(("ibdev", facts.ibdev2netdev()))
        for what, path in models:
            host = host_model_path(path, n.host_paths.models) or path
            named.append((what, facts.Fact(what, ("ls", "-d", "--", host), lambda t: t.strip())))
        named += [(f"ping:{p.name}", facts.ping(p.fabric_address, dont_fragment=False)) for p in peers]
        results = dict(zip([k for k, _ in named], self.ssh.run_many([list(f.argv) for _, f in named])))
        fact_of = dict(named)

        def value(key: str) -> Any:
            res = results[key]
            return fact_of[key].parse(res.stdout) if res.returncode == 0 else None

        checks += self._check_docker(results["docker"])
        checks += self._check_gpu(results["gpu"], results["docker"])
        smi = value("smi")
        if smi is not None:   # no nvidia-smi: the gpu check above already said so
            checks.append(gpu_idle_check(name, smi, ours_running=bool(own_ports)))
        iface = self._fabric_checks(checks, results["ip"])
        checks += self._check_peers(peers, iface, {p.name: results[f"ping:{p.name}"] for p in peers})
        listeners = value("ss")
        for addr, port, what in ports_of(spec):
            if (addr, port) in own_ports:
                checks.append(Check(name, f"port {port}", True, f"{addr}:{port} held by the active deployment"))
            elif listeners is None:
                checks.append(Check(name, f"port {port}", False, f"ss failed: {results['ss'].output.strip()}",
                                    "install iproute2 on the node"))
            elif (hit := facts.port_conflict(listeners, addr, port)) is not None:
                checks.append(Check(name, f"port {port}", False,
                                    f"{addr}:{port} ({what}) is in use (listener on {hit.address}:{hit.port})",
                                    f"stop what listens there (ssh {n.ssh.host} ss -ltnp 'sport = :{port}') or "
                                    "change api.port / api.dist_port in the profile"))
            else:
                checks.append(Check(name, f"port {port}", True, f"{addr}:{port} free"))
        mem = value("mem")
        if mem is None:
            checks.append(Check(name, "memory", False, "cannot read /proc/meminfo", "check the node"))
        else:
            gib = mem.available / 2**30
            low = mem.available < mem.total * 0.25
            checks.append(Check(name, "memory", True, (WARN if low else "")
                                + f"{gib:.1f} GiB available of {mem.total / 2**30:.1f} GiB"
                                + (" (less than a quarter free: page cache and other programs share the GPU's "
                                   "memory)" if low else "")))
        ib = results["ib"].returncode == 0
        self._infiniband = ib
        if n.roce_hcas and not ib:
            checks.append(Check(name, "infiniband", False, "roce_hcas is set but /dev/infiniband is missing",
                                "install the MLNX/rdma-core drivers, or clear roce_hcas to use TCP sockets"))
        else:
            checks.append(Check(name, "infiniband", True, "/dev/infiniband present (passed to the container)" if ib
                                else "no /dev/infiniband (NCCL over TCP sockets)"))
        if n.roce_hcas:
            checks.append(self._check_hcas(results["ibdev"]))
        for what, path in models:
            checks.append(self._check_model(what, path, results[what]))
        return checks

    def _check_docker(self, res: CommandResult) -> list["Check"]:
        from sparkctl.deploy.preflight import Check
        name = self.node.name
        info = None
        try:
            info = facts.parse_docker_info_json(res.stdout)
        except ValueError:
            pass
        if info is None or not info.answering:
            why = (res.stderr.strip() or res.stdout.strip() or f"exit {res.returncode}").splitlines()[-1]
            return [Check(name, "docker", False, f"docker daemon does not answer: {why}",
                          "start it (sudo systemctl start docker) and make sure the SSH user may use it "
                          "(member of the docker group)")]
        out = [Check(name, "docker", True, f"docker {info.server_version} on {info.name or '?'} "
                                           f"({info.architecture or '?'}; runtimes {', '.join(info.runtimes)}; "
                                           f"default {info.default_runtime})")]
        want = self.node.gpu_runtime
        if want == "nvidia":
            if "nvidia" in info.runtimes:
                alias = info.runtime_is_runc_alias("nvidia")
                out.append(Check(name, "gpu runtime", True, "nvidia runtime registered"
                                 + (" (mapped to plain runc: test node, no GPU)" if alias else "")))
            else:
                out.append(Check(name, "gpu runtime", False,
                                 f"the nvidia runtime is not registered with docker (runtimes: "
                                 f"{', '.join(info.runtimes)})",
                                 "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker "
                                 "(or set gpu_runtime: gpus-all for this node)"))
        elif want == "gpus-all":
            out.append(Check(name, "gpu runtime", True, "--gpus all (needs nvidia-container-toolkit; not checked)"))
        else:
            out.append(Check(name, "gpu runtime", True, "gpu_runtime none: the container gets no GPU"))
        return out

    def _check_gpu(self, res: CommandResult, docker_res: CommandResult) -> list["Check"]:
        """GPU model/driver. No nvidia-smi is a failure on a real node, a warning on a test node (whose
        nvidia runtime is plain runc) or when gpu_runtime is none."""
        from sparkctl.deploy.preflight import Check
        name = self.node.name
        if res.returncode != 0:
            try:
                test_node = facts.parse_docker_info_json(docker_res.stdout).runtime_is_runc_alias("nvidia")
            except ValueError:
                test_node = False
            missing = res.returncode == 127 or "not found" in res.stderr
            seen = ("no nvidia-smi (not a GB10?)" if missing else
                    f"nvidia-smi failed: {res.output.strip().splitlines()[-1] if res.output.strip() else res.returncode}")
            if self.node.gpu_runtime == "none" or test_node:
                return [Check(name, "gpu", True, WARN + seen)]
            return [Check(name, "gpu", False, seen, "install the NVIDIA driver (DGX OS ships it) and check "
                                                    "`nvidia-smi` works on the node")]
        gpus = facts.parse_gpu_query(res.stdout)
        if not gpus:
            return [Check(name, "gpu", False, "nvidia-smi lists no GPU", "check the driver (nvidia-smi) on the node")]
        g = gpus[0]
        notes = []
        if not g.is_gb10:
            notes.append("not a GB10")
        if g.driver_version and g.driver_version.startswith("590."):
            notes.append("driver 590 deadlocks in CUDA-graph capture on GB10 in one report; 580.x is known good")
        return [Check(name, "gpu", True, (WARN if notes else "") + f"{g.name}, driver {g.driver_version or '?'}"
                      + (f" ({'; '.join(notes)})" if notes else ""))]

    def _fabric_checks(self, checks: list["Check"], res: CommandResult) -> facts.Interface | None:
        from sparkctl.deploy.preflight import Check
        n = self.node
        if res.returncode != 0:
            checks.append(Check(n.name, "fabric interface", False, f"ip failed: {res.output.strip()}",
                                "install iproute2 on the node"))
            return None
        ifaces = facts.parse_ip_addr_json(res.stdout)
        iface = ifaces.get(n.fabric_interface)
        if iface is None:
            others = ", ".join(f"{i.name} ({', '.join(i.ipv4) or 'no IPv4'})" for i in ifaces.values()
                               if i.name != "lo")
            checks.append(Check(n.name, "fabric interface", False,
                                f"interface {n.fabric_interface} does not exist on {n.name} (interfaces: {others})",
                                f"set fabric_interface for {n.name} in the inventory to the cabled CX-7 netdev "
                                f"(see `ibdev2netdev` on the node)"))
            return None
        ok = True
        if not iface.up:
            ok = False
            checks.append(Check(n.name, "fabric interface", False,
                                f"{n.fabric_interface} on {n.name} is not up: {iface.describe()}",
                                f"check the QSFP cable and `ip link set {n.fabric_interface} up` on {n.name}"
                                + (" (NO-CARRIER: the link or the peer's port is down)"
                                   if iface.state == "LOWERLAYERDOWN" or "NO-CARRIER" in iface.flags else "")))
        if n.fabric_address not in iface.ipv4:
            ok = False
            checks.append(Check(n.name, "fabric address", False,
                                f"{n.fabric_interface} on {n.name} has {', '.join(iface.ipv4) or 'no IPv4 address'}, "
                                f"not the inventory's fabric_address {n.fabric_address}",
                                f"configure {n.fabric_address} on {n.fabric_interface} (netplan), or fix "
                                f"fabric_address in the inventory"))
        if ok:
            checks.append(Check(n.name, "fabric interface", True, iface.describe()))
        if iface.mtu is not None:
            small = iface.mtu < MIN_FABRIC_MTU
            checks.append(Check(n.name, "fabric mtu", True, (WARN if small else "") + f"mtu {iface.mtu}"
                                + (f" (the community default is {MIN_FABRIC_MTU} on both ends)" if small else "")))
        return iface if iface.up else None

    def _check_peers(self, peers: list["Node"], iface: facts.Interface | None,
                     small: dict[str, CommandResult]) -> list["Check"]:
        """Each peer's fabric address answers a ping; then a don't-fragment ping of the full MTU (2nd round-trip)."""
        from sparkctl.deploy.preflight import Check
        name = self.node.name
        out: list[Check] = []
        big_for = []
        for p in peers:
            r = facts.parse_ping(small[p.name].output)
            if not r.ok:
                out.append(Check(name, f"fabric peer {p.name}", False,
                                 f"{p.name}'s fabric address {p.fabric_address} does not answer from {name}"
                                 + (f" ({r.error})" if r.error else ""),
                                 f"check the cable and both ends' fabric_interface/fabric_address; "
                                 f"`ping {p.fabric_address}` on {name}"))
            else:
                big_for.append((p, r))
        if iface is not None and iface.mtu and big_for:
            size = iface.mtu - 28
            bigs = self.ssh.run_many([list(facts.ping(p.fabric_address, size=size).argv) for p, _ in big_for])
            for (p, r), res in zip(big_for, bigs):
                b = facts.parse_ping(res.output)
                if b.ok:
                    out.append(Check(name, f"fabric peer {p.name}", True,
                                     f"{p.fabric_address} answers ({r.rtt_ms} ms; {iface.mtu}-byte packets pass "
                                     f"unfragmented)"))
                else:
                    out.append(Check(name, f"fabric peer {p.name}", False,
                                     f"{p.fabric_address} answers small pings but not {iface.mtu}-byte packets with "
                                     f"don't-fragment" + (f" ({b.error})" if b.error else ""),
                                     "set the same MTU on both ends of the fabric (and any switch between)"))
        else:
            out += [Check(name, f"fabric peer {p.name}", True, f"{p.fabric_address} answers ({r.rtt_ms} ms)")
                    for p, r in big_for]
        return out

    def _check_hcas(self, res: CommandResult) -> "Check":
        from sparkctl.deploy.preflight import Check
        n = self.node
        if res.returncode != 0:
            return Check(n.name, "roce hcas", True, WARN + "ibdev2netdev not available; roce_hcas not verified")
        links = {ln.hca: ln for ln in facts.parse_ibdev2netdev(res.stdout)}
        bad = [h for h in n.roce_hcas if h not in links or not links[h].up]
        if bad:
            return Check(n.name, "roce hcas", False,
                         "; ".join(f"{h}: " + (f"{links[h].netdev} down" if h in links else "not present") for h in bad),
                         "set roce_hcas to the HCAs of the cabled port (ibdev2netdev shows which are Up)")
        return Check(n.name, "roce hcas", True, ", ".join(f"{h} -> {links[h].netdev} (Up)" for h in n.roce_hcas))

    def _check_model(self, what: str, path: str, res: CommandResult) -> "Check":
        from sparkctl.deploy.preflight import Check
        n = self.node
        host = host_model_path(path, n.host_paths.models)
        if host is None:
            return Check(n.name, what, True, WARN + f"{path} is not under {MODELS_MOUNT}, so no host directory is "
                                                    f"mounted there; the engine will not see it")
        if res.returncode == 0:
            return Check(n.name, what, True, f"{path} present ({host} on {n.name})")
        return Check(n.name, what, False, f"{path} not found: {host} does not exist on {n.name}",
                     f"sync it to {host} on this node (every node mounts host_paths.models at {MODELS_MOUNT})")


def host_model_path(path: str, host_models: str) -> str | None:
    """Where a /models/... path of the engine lives on the node (its host_paths.models), or None if elsewhere."""
    if path == MODELS_MOUNT or path.startswith(MODELS_MOUNT + "/"):
        return host_models.rstrip("/") + path[len(MODELS_MOUNT):]
    return None


def _model_paths(argv: list[str]) -> list[tuple[str, str]]:
    """(check name, path) for the model and the drafter when they are local absolute paths (hub ids are not)."""
    out = []
    for what, flags in (("model", ("--model-path", "--model")), ("drafter", ("--speculative-draft-model-path",))):
        for flag in flags:
            if flag in argv:
                i = argv.index(flag) + 1
                if i < len(argv) and argv[i].startswith("/"):
                    out.append((what, argv[i]))
                break
    return out
