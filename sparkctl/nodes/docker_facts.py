"""Facts docker gives about a node: its daemon (`docker info`), an image's ID, a container's state and processes,
and both in one round trip (`container_liveness`). Each is a command (argv) plus a pure parser of what it prints,
like every fact in `sparkctl.nodes.facts` (tested on real captured output: `tests/unit/test_facts.py`).

Example::

    fact = docker_info()
    value = fact.parse(connector.run(fact.argv).stdout)   # DockerInfo(server_version='29.2.1', ...)
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from sparkctl.jsontypes import JSONObject
from sparkctl.nodes.facts import Fact


@dataclass(frozen=True)
class DockerInfo:
    """What `docker info` says about the daemon. ``runtime_paths`` is known only from the JSON form."""

    server_version: str | None
    runtimes: tuple[str, ...]
    default_runtime: str | None
    runtime_paths: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    architecture: str | None = None
    logging_driver: str | None = None
    errors: tuple[str, ...] = ()

    @property
    def answering(self) -> bool:
        """The daemon answered (a client without a daemon prints an empty ServerVersion)."""
        return bool(self.server_version)

    def runtime_is_runc_alias(self, runtime: str) -> bool:
        """True when ``runtime`` is registered but only points at plain runc (a test node, not the NVIDIA toolkit)."""
        return self.runtime_paths.get(runtime, "").rsplit("/", 1)[-1] == "runc"


def docker_info() -> Fact[DockerInfo]:
    return Fact("docker info", ("docker", "info", "--format", "{{json .}}"), parse_docker_info_json)


def parse_docker_info_json(text: str) -> DockerInfo:
    """Parse ``docker info --format '{{json .}}'`` (CLI 20.10 .. 29). Without a daemon the CLI still prints
    the JSON with empty server fields (and exits 1); that parses to ``answering == False``."""
    line = next((ln for ln in text.splitlines() if ln.lstrip().startswith("{")), "")
    if not line:
        raise ValueError("no JSON object in docker info output")
    data: JSONObject = json.loads(line)
    runtimes = data.get("Runtimes") or {}
    paths = {name: str((spec or {}).get("path") or (spec or {}).get("runtimeType") or "")
             for name, spec in runtimes.items()}
    errors = tuple(str(e) for e in (data.get("ServerErrors") or []))
    return DockerInfo(server_version=data.get("ServerVersion") or None, runtimes=tuple(sorted(runtimes)),
                      default_runtime=data.get("DefaultRuntime") or None, runtime_paths=paths,
                      name=data.get("Name") or None, architecture=data.get("Architecture") or None,
                      logging_driver=data.get("LoggingDriver") or None, errors=errors)


def image_id(ref: str) -> Fact[str | None]:
    """The local image ID of ``ref`` (``sha256:...``), or None when the image is absent (exit code 1)."""
    return Fact(f"image {ref}", ("docker", "image", "inspect", "--format", "{{.Id}}", ref), parse_image_id)


def parse_image_id(text: str) -> str | None:
    for ln in text.splitlines():
        ln = ln.strip()
        if re.fullmatch(r"sha256:[0-9a-f]{64}", ln):
            return ln
    return None


@dataclass(frozen=True)
class ContainerState:
    """A container as `docker inspect` reports it (the part a runtime needs)."""

    id: str
    name: str
    status: str            # created | running | paused | restarting | removing | exited | dead
    running: bool
    exit_code: int | None
    oom_killed: bool
    error: str
    started_at: str | None
    finished_at: str | None
    image_id: str
    labels: dict[str, str]
    env: tuple[str, ...]
    cmd: tuple[str, ...]

    def describe(self) -> str:
        if self.running:
            return f"container running (started {self.started_at})"
        why = " (OOM-killed)" if self.oom_killed else (f" ({self.error})" if self.error else "")
        if self.status == "created":
            return "container created, never started" + why
        return f"container {self.status} ({self.exit_code}){why}"


def container_state(name_or_id: str) -> Fact[ContainerState | None]:
    return Fact(f"container {name_or_id}", ("docker", "container", "inspect", "--format", "{{json .}}", name_or_id),
                parse_container_inspect)


_ZERO_TIME = "0001-01-01T00:00:00Z"


def parse_container_inspect(text: str) -> ContainerState | None:
    """Parse ``docker container inspect --format '{{json .}}'`` (one JSON object per line); None if empty."""
    line = next((ln for ln in text.splitlines() if ln.lstrip().startswith("{")), "")
    if not line:
        return None
    d = json.loads(line)
    state = d.get("State") or {}
    cfg = d.get("Config") or {}
    started = state.get("StartedAt") or None
    finished = state.get("FinishedAt") or None
    status = state.get("Status") or ""
    return ContainerState(
        id=d.get("Id", ""), name=(d.get("Name") or "").lstrip("/"), status=status,
        running=bool(state.get("Running")),
        exit_code=None if status in ("created", "running") else state.get("ExitCode"),
        oom_killed=bool(state.get("OOMKilled")), error=state.get("Error") or "",
        started_at=None if started == _ZERO_TIME else started, finished_at=None if finished == _ZERO_TIME else finished,
        image_id=d.get("Image", ""), labels=dict(cfg.get("Labels") or {}), env=tuple(cfg.get("Env") or ()),
        cmd=tuple(cfg.get("Cmd") or ()))


@dataclass(frozen=True)
class ContainerProcess:
    """One process of a running container as ``docker top CONTAINER -o pid,stat,comm`` lists it (host PIDs: the
    daemon runs ``ps`` on the node). ``state`` is the first letter of ps's STAT (R, S, D, T, t, Z ...)."""

    pid: int
    state: str
    command: str


def container_processes(name_or_id: str) -> Fact[list[ContainerProcess]]:
    """Every process of a running container with its state: a rank SIGSTOPped inside its container (the
    container still "running" to `docker inspect`) shows as state T. `docker top` fails on a container that is
    not running (inspect answers that)."""
    return Fact(f"processes of container {name_or_id}", ("docker", "top", name_or_id, "-o", "pid,stat,comm"),
                parse_docker_top)


def parse_docker_top(text: str) -> list[ContainerProcess]:
    """Parse ``docker top ... -o pid,stat,comm``: a header line (PID STAT COMMAND), then one process a line;
    lines that do not parse (a cut mark, an empty line) are skipped."""
    out: list[ContainerProcess] = []
    for line in text.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        out.append(ContainerProcess(int(parts[0]), parts[1][:1], parts[2].strip() if len(parts) > 2 else ""))
    return out


@dataclass(frozen=True)
class ContainerLiveness:
    """A container's state and, when it runs, its processes: both answers of one SSH round trip."""

    state: ContainerState | None                  # None: no such container
    processes: list[ContainerProcess]             # empty when it is not running (`docker top` could not answer)


# Printed alone on its line between the two answers: `docker inspect --format '{{json .}}'` prints one JSON line.
LIVENESS_MARK = "--- sparkctl: docker top ---"
# The container reaches the script as $1 (never spliced into the text). Inspect first: its exit status and stderr
# are the command's when it fails ("No such container"); `docker top` on a container that is not running fails,
# and an empty process list is its answer.
_LIVENESS_SCRIPT = ('docker container inspect --format "{{json .}}" "$1" || exit $?\n'
                    f"echo '{LIVENESS_MARK}'\n"
                    'docker top "$1" -o pid,stat,comm 2>/dev/null || true\n')


def container_liveness(name_or_id: str) -> Fact[ContainerLiveness]:
    """`docker container inspect` (`container_state`) and `docker top` (`container_processes`) in one remote
    argv, each answer read by its own parser."""
    return Fact(f"liveness of container {name_or_id}", ("sh", "-c", _LIVENESS_SCRIPT, "sh", name_or_id),
                parse_container_liveness)


def parse_container_liveness(text: str) -> ContainerLiveness:
    """Split at the mark line; each side goes to its own parser (no mark: no process list)."""
    inspect, _, top = text.partition(LIVENESS_MARK + "\n")
    return ContainerLiveness(parse_container_inspect(inspect), parse_docker_top(top))
