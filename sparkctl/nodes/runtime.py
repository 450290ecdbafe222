"""What a runtime does for one rank: start the engine, tell if it lives, read its log, stop it.

Two runtimes implement this: `process` (the embedded cluster: a local emulator
process per rank) and `docker` (a real Spark: the engine container over SSH).
A handle (`sparkctl.nodes.handles`) is stored in the deployment record, so a later
sparkctl command (status, logs, down, rollback) can find the engine again.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol, TypeVar

from sparkctl.jsontypes import JSONMapping
from sparkctl.nodes.handles import DockerHandle, Handle, ProcessHandle
from sparkctl.nodes.node_facts import NodeFacts
from sparkctl.sglang.launch import LaunchSpec

__all__ = ["DockerHandle", "Handle", "Liveness", "NodeFacts", "ProcessHandle", "Runtime", "log_tail", "sim_env"]


@dataclass(frozen=True)
class Liveness:
    alive: bool
    detail: str               # "running (pid 123)", "exited with code 1", "container exited (137)"
    exit_code: int | None = None


# The handle a runtime takes back: its own runtime's (a process runtime's `ProcessHandle`, a docker runtime's
# `DockerHandle`). Callers hold a plain `Runtime` (either) and pass it the handles it returned.
H = TypeVar("H", bound=ProcessHandle | DockerHandle, contravariant=True)


class Runtime(Protocol[H]):
    runtime: str               # process | docker (its handles' `runtime`)
    needs_image: bool          # the engine runs from an image that the image stage must put on the node

    @property
    def poll_interval_s(self) -> float:
        """How often boot polls its log and liveness (a docker runtime's poll without a stream is an SSH session)."""

    def follow(self, handle: H, bound_s: float) -> None:
        """From now until `unfollow` (at most `bound_s`), boot reads this engine's log and liveness at every poll:
        a runtime whose reads are remote streams the log instead (docker); a local one does nothing."""

    def unfollow(self) -> None:
        """End what `follow` opened, for every handle (boot's end, whatever the outcome)."""

    def gather(self, spec: LaunchSpec) -> NodeFacts:
        """Read-only facts of the node for rank `spec` (judged by deploy.preflight_rules.evaluate)."""

    def launch_argv(self, spec: LaunchSpec, deployment_id: str) -> list[str]:
        """The command `start` runs for this rank, secrets redacted (shown by `up --dry-run`)."""

    def prepare(self, spec: LaunchSpec, deployment_id: str) -> object:
        """What `start` of `spec` reads and makes on the node first, done ahead for every rank at once (boot, before
        the first start) and handed to that start, so the starts follow each other as closely as by hand: nothing
        started or removed (docker: the cache directories and the old container's state; a local runtime: None)."""

    def start(self, spec: LaunchSpec, deployment_id: str, prepared: object = None) -> Handle:
        """Start the rank's engine (detached: it outlives the sparkctl command); `prepared`: what `prepare` gave
        for this start, if it ran."""

    def liveness(self, handle: H) -> Liveness:
        """Is the engine process/container alive right now."""

    def read_log(self, handle: H, offset: int = 0) -> tuple[str, int]:
        """Log text from byte offset `offset` (for following) and the next offset."""

    def stop(self, handle: H, *, timeout_s: float = 15.0) -> None:
        """Stop the engine, keeping what is needed to restart it (idempotent). Starting the same spec under the
        same deployment id again is the restart: a docker runtime reuses the stopped container (rollback's fast
        path), a process runtime starts a fresh process."""

    def remove(self, handle: H) -> None:
        """Forget a stopped engine for good (containers removed; logs stay)."""

    def cleanup_secrets(self) -> list[str]:
        """Remove the secret files of every engine of this cluster (on this node) that is no longer running, and
        return what was removed. `stop` already removes a stopped engine's secrets; this settles what a kill -9
        left (settle, `down`). A running engine's secrets are kept."""


SIM_ENV_PREFIX = "SPARKCTL_SIM_"


def sim_env(knobs: JSONMapping) -> dict[str, str]:
    """Emulator knobs (inventory `sparkctl_sim`) as the engine's SPARKCTL_SIM_CLUSTER (one JSON mapping).

    One variable, read by the emulator as its lowest layer (sparkctl/sim/config.py): a deployment's own
    SPARKCTL_SIM_CONFIG (fault injection in a profile's env) and per-knob SPARKCTL_SIM_<KNOB> variables win
    over it. Only clusters whose engine is sparkctl's emulator set knobs (the embedded cluster, test
    clusters); real Sparks have none, so nothing is added there.
    """
    return {SIM_ENV_PREFIX + "CLUSTER": json.dumps(knobs)} if knobs else {}


def log_tail(text: str, lines: int = 30, width: int = 400) -> str:
    """The last `lines` lines, each clipped to `width` characters (a server_args line runs to 14 KB)."""
    out = []
    for line in text.rstrip("\n").splitlines()[-lines:]:
        out.append(line if len(line) <= width else f"{line[:width]}... [{len(line) - width} more characters]")
    return "\n".join(out)
