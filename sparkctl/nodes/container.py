"""The `docker run` of one rank, as data: container name, labels, mounts, the argv and the env file.

Pure (no daemon, no SSH): `container_config(spec, node, ...)` builds what `DockerRuntime.start` runs and what
`up --dry-run` prints; unit tests compare its argv. See `sparkctl.nodes.docker_runtime` for why the docker CLI
over SSH is used and what each flag is for.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkctl.errors import ConfigError
from sparkctl.redaction import REDACTED, SECRET_ENV, redact_argv
from sparkctl.sglang.launch import SECRETS_MOUNT, LaunchSpec, Mount

if TYPE_CHECKING:
    from sparkctl.config.inventory import Node

IMAGE_ENV = "SPARKCTL_ENGINE_IMAGE"
MEMLOCK_ENV = "SPARKCTL_DOCKER_MEMLOCK"        # override memlock=-1 (a daemon without CAP_SYS_RESOURCE)
CONTAINER_HOME = "/root"                      # the SGLang images run as root
# torch inductor's default cache directory for the container's root user (tempfile.gettempdir(), /tmp with TMPDIR
# unset, + "torchinductor_" + user: torch/_inductor/runtime/cache_dir_utils.py default_cache_dir). Its precompiled
# C++ headers always go under this one, whatever TORCHINDUCTOR_CACHE_DIR says (torch/_inductor/codecache.py
# _HEADER_DIR): with the cache mounted elsewhere each start of SGLang's CPU path compiled the header again (g++,
# about 20 CPU-s per rank on the test cluster's 2 cores), the kernels themselves cached.
TORCHINDUCTOR_DEFAULT = "/tmp/torchinductor_root"
# JIT caches the engine fills at first use: (directory under host_paths.cache, path in the container, env var)
JIT_CACHES = (
    ("tilelang", f"{CONTAINER_HOME}/.tilelang", None),
    ("triton", f"{CONTAINER_HOME}/.triton", None),
    ("flashinfer", f"{CONTAINER_HOME}/.cache/flashinfer", None),
    ("torchinductor", TORCHINDUCTOR_DEFAULT, "TORCHINDUCTOR_CACHE_DIR"),
)
# Where a rank's secret files live on the node: tmpfs (never on disk; gone at reboot, rewritten before every
# start), a 0700 directory per container, files 0400, bind-mounted read-only at SECRETS_MOUNT.
SECRETS_HOST_ROOT = "/dev/shm/sparkctl-secrets"
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Container variables that hold a credential: the LaunchSpec's, plus a launch image's API key placeholder
# (sparkctl.images.entrypoint.SECRET_ENV).
CONTAINER_SECRET_ENV = SECRET_ENV | {"SPARKCTL_ARG_API_KEY"}


def container_name(cluster: str, rank: int, deployment_id: str) -> str:
    """``sparkctl-<cluster>-rank<N>-<10 hex of sha256(deployment id)>`` (Docker's name charset)."""
    safe = re.sub(r"[^a-zA-Z0-9_.-]+", "-", cluster).strip("-.") or "cluster"
    short = hashlib.sha256(deployment_id.encode()).hexdigest()[:10]
    return f"sparkctl-{safe}-rank{rank}-{short}"


def spec_identity(spec: LaunchSpec, image: str) -> str:
    """Content hash of what this rank runs (redacted argv/env, image, mounts): same hash = same launch."""
    data = {**spec.redacted().model_dump(mode="json"), "image": image}
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
    mounts: list[Mount]
    host_dirs: list[str]                 # writable host directories to create before the container starts
    secret_values: frozenset[str] = frozenset()
    secrets_dir: str | None = None       # node directory of the rank's secret files (mounted at SECRETS_MOUNT)
    command: tuple[str, ...] = ()        # what follows the image in `docker run` (the argv, or none for a launch image)

    @property
    def env_file(self) -> str:
        """``KEY=VALUE`` lines for ``--env-file /dev/stdin`` (values verbatim: Docker does not unquote them)."""
        return "".join(f"{k}={v}\n" for k, v in sorted(self.env.items()))

    def redacted_env(self) -> dict[str, str]:
        """The env file's variables, the secret ones' values '***' (by name, never by what a value looks like)."""
        return {k: REDACTED if k in CONTAINER_SECRET_ENV else v for k, v in sorted(self.env.items())}


def container_config(spec: LaunchSpec, node: Node, *, cluster: str, deployment_id: str, image: str,
                     infiniband: bool = False, identity: str | None = None, memlock: str = "-1",
                     extra_env: dict[str, str] | None = None, command: list[str] | None = None) -> ContainerConfig:
    """Build the `docker run` parameters for one rank (pure: no daemon, no SSH). Example::

        cfg = container_config(spec, node, cluster="desk", deployment_id="d1", image="sglang-gb10:1")
        cfg.argv   # ['docker', 'run', '--detach', '--name', 'sparkctl-desk-rank0-...', ..., 'python3', '-m', ...]

    `command` replaces the spec's argv after the image (a launch image's entrypoint builds it from the env).
    """
    name = container_name(cluster, spec.rank, deployment_id)
    labels = {"sparkctl.cluster": cluster, "sparkctl.deployment": deployment_id, "sparkctl.rank": str(spec.rank),
              "sparkctl.node": node.name, "sparkctl.profile-identity": identity or spec_identity(spec, image)}
    mounts = [Mount(source=_check_path(m.source, "mount source", node.name),
                    target=_check_path(m.target, "mount target", node.name), read_only=m.read_only)
              for m in spec.mounts]
    host_dirs = [m.source for m in mounts if not m.read_only]
    env: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
    if node.gpu_runtime == "nvidia":
        env.update(NVIDIA_VISIBLE_DEVICES="all", NVIDIA_DRIVER_CAPABILITIES="compute,utility")
    cache = _check_path(node.host_paths.cache, "host_paths.cache", node.name)
    targets = [m.target for m in mounts]
    for sub, target, env_var in JIT_CACHES:
        if env_var:
            env[env_var] = target
        if _covered(target, targets):      # e.g. render mounts host_paths.cache at ~/.cache already
            continue
        mounts.append(Mount(source=f"{cache}/{sub}", target=target, read_only=False))
        host_dirs.append(f"{cache}/{sub}")
    secrets_dir = None
    if spec.secret_files:
        secrets_dir = f"{SECRETS_HOST_ROOT}/{name}"
        mounts.append(Mount(source=secrets_dir, target=SECRETS_MOUNT, read_only=True))
    env.update(extra_env or {})            # e.g. emulator knobs of a cluster whose engine is the emulator
    env.update(spec.env)                   # the LaunchSpec wins over our defaults
    for k, v in env.items():
        if not _ENV_KEY.match(k) or any(c in v for c in "\n\r\0"):
            raise ConfigError(f"environment variable {k!r} cannot be passed to a container (bad name, or a newline "
                              f"in its value)", where=f"[{node.name}] docker", hint="fix the profile's env")
    argv = ["docker", "run", "--detach", "--pull", "never", "--name", name]
    for k, v in labels.items():
        argv += ["--label", f"{k}={v}"]
    # `--restart no`, said outright: a rank restarted alone by Docker joins no collective (the pair stays wedged);
    # `sparkctl watch` restarts the whole group, in order (docs/watch.md)
    argv += ["--network", "host", "--ipc", "host", "--init", "--restart", "no"]
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
        argv += ["--mount", f"type=bind,source={m.source},target={m.target}" + (",readonly" if m.read_only else "")]
    # A hash of the whole (redacted) run command: a stopped container is reused only for exactly this launch.
    # Redacted by field (the secret flags' values), so a number equal to a secret still counts.
    cmd = list(spec.argv if command is None else command)
    shown = redact_argv(argv + [image, *cmd], spec.secret_options)
    labels["sparkctl.config-hash"] = hashlib.sha256(json.dumps(shown).encode()).hexdigest()[:16]
    at = argv.index("--network")
    argv[at:at] = ["--label", f"sparkctl.config-hash={labels['sparkctl.config-hash']}"]
    argv += ["--env-file", "/dev/stdin", image, *cmd]
    return ContainerConfig(name=name, image=image, argv=argv, env=env, labels=labels, mounts=mounts,
                           host_dirs=sorted(set(host_dirs)), secret_values=spec.secret_values,
                           secrets_dir=secrets_dir, command=tuple(cmd))
