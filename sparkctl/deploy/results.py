"""What the commands return: typed results, one model per command, the same keys in every outcome (None where a
key does not apply), exported by `sparkctl schema` and printed by `--json` as they are."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sparkctl.deploy.cluster import RankHealth
from sparkctl.deploy.settle import Settled
from sparkctl.jsontypes import JSONObject
from sparkctl.state.records import Capacity, GateResult, NodeImages, Warmup
from sparkctl.state.watchfile import WatchState, watcher_view


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def as_json(self) -> JSONObject:
        return self.model_dump(mode="json")


# Output keys renamed in 2026-12 (one name per concept: the records' `steps` and `settle`), each old key still written
# beside its new one, with the same value, until the next release: {old: new}. docs/reference.md lists them.
RENAMED_KEYS = {"stages": "steps", "reconciled": "settled", "kind": "runtime"}


def _was(new: str) -> str:
    return f"deprecated: the same as `{new}`, its name until 2026-12; written until the next release"


class _Renamed(_Result):
    """A result that still writes the old names of RENAMED_KEYS beside the new ones (set from them, never read)."""

    @model_validator(mode="after")
    def _old_names(self) -> _Renamed:
        for old, new in RENAMED_KEYS.items():
            if old in type(self).model_fields:
                object.__setattr__(self, old, getattr(self, new))
        return self


class StepView(BaseModel):
    name: str
    what: str
    idempotent: bool
    node: str | None = None
    noop: bool = False              # decided by the plan: apply runs no effect for it and journals it `noop`


class PlanView(BaseModel):
    profile: str
    identity: str
    deployment: str                 # the id `up` creates (the same one: planned under the lock)
    steps: list[StepView] = Field(default_factory=list)
    noop_reason: str | None = None
    active: str | None = None


class Concurrency(BaseModel):
    """The engine caps how many requests run at once: its own reason and the setting that raises the cap."""

    max_running_requests: int
    reason: str
    setting: str


class UpResult(_Renamed):
    """`up` / `rollback`: deployed, unchanged (a no-op decided after settling) or dry-run."""

    outcome: Literal["deployed", "unchanged", "dry-run"]
    changed: bool
    profile: str
    cluster: str
    emulated: bool
    plan: PlanView | None = None
    deployment: str | None = None
    endpoint: str | None = None
    reason: str | None = None
    capacity: Capacity | None = None
    concurrency: Concurrency | None = None
    gates: list[GateResult] | None = None
    steps: list[JSONObject] | None = None
    warmup: Warmup | None = None
    elapsed_s: float | None = None
    settled: Settled | None = None
    next_commands: list[str] = Field(default_factory=list)
    stages: list[JSONObject] | None = Field(None, description=_was("steps"))
    reconciled: Settled | None = Field(None, description=_was("settled"))


class DownResult(_Renamed):
    changed: bool
    reason: str | None = None
    stopped: str | None = None
    engines: list[str] = Field(default_factory=list)
    settled: list[str] = Field(default_factory=list)
    reconciled: list[str] = Field(default_factory=list, description=_was("settled"))


class DownPlanResult(_Result):
    """`down --dry-run`: what `down` would do, read from the ledger and the nodes; nothing is changed."""
    outcome: Literal["dry-run"] = "dry-run"
    changed: Literal[False] = False
    active: str | None = Field(None, description="The active deployment `down` stops (a replicated deployment: "
                                                 "its profile).")
    plan: list[str] = Field(description="Each step's line, in the order `down` runs them.")
    engines: list[str] = Field(description="The engines it would stop, as `down --json` lists the ones it stopped.")


class InProgress(BaseModel):
    command: str | None = None
    pid: int | None = None
    host: str | None = None
    since: str | None = None
    deployment: str | None = None
    profile: str | None = None
    stage: str | None = None


class InterruptedView(BaseModel):
    deployment: str
    profile: str
    stage: str
    detail: str
    controller_pid: int | None = None
    ranks_alive: list[int] = Field(default_factory=list)


class WatcherView(WatchState):
    """`sparkctl watch` on this cluster, as its file says, and whether that process runs now."""

    running: bool = Field(description="The watcher's pid runs now (checked with its start time).")


def watcher_of(root: Path) -> WatcherView | None:
    view = watcher_view(root)
    return WatcherView.model_validate(view) if view is not None else None


def refusing(watcher: WatcherView | None) -> bool:
    """A running watcher refuses to restart the desired deployment (it cannot start exactly what was deployed):
    `status` is not ok while it does, whatever still serves."""
    return bool(watcher is not None and watcher.running and watcher.refused)


class StatusResult(_Result):
    """`status`: `ok` is False when the active deployment is unhealthy, something was interrupted, a comparison
    did not finish, or nothing is active while a command changes the cluster."""

    cluster: str
    emulated: bool
    ok: bool
    active: str | None = None
    history: int = 0
    profile: str | None = None
    healthy: bool | None = None
    ranks: list[RankHealth] = Field(default_factory=list)
    endpoint: str | None = None
    speculative_algorithm: str | None = None
    identity: str | None = None
    sglang_version: str | None = None     # the engine's release
    engine: str | None = None             # sglang | vllm
    images: list[str] = Field(default_factory=list)
    image_ids: dict[str, str] = Field(default_factory=dict)
    images_per_node: dict[str, NodeImages] = Field(default_factory=dict)
    since: str | None = None
    capacity: Capacity | None = None
    detail: str | None = None
    in_progress: InProgress | None = None
    interrupted: list[InterruptedView] = Field(default_factory=list)
    unfinished_compare: str | None = None
    watcher: WatcherView | None = None
    leftovers: list[str] = Field(default_factory=list, description=(
        "Processes of sparkctl's engines that outlived them (their launcher or log pipe is gone), by deployment and "
        "rank: `sparkctl down` stops them. Any makes `ok` false."))


# ---- replicated deployments (`replicas: K`, deploy/replicated.py) -------------------------------------------------
class ReplicatedUpResult(_Result):
    """`up` of a replicated profile: the router's endpoint handed off, which replicas were redeployed."""

    outcome: Literal["deployed", "unchanged", "dry-run"]
    changed: bool
    profile: str
    cluster: str
    emulated: bool
    replicated: Literal[True] = True
    replicas: int
    endpoint: str
    updated: list[int] = Field(default_factory=list)         # replica indexes redeployed, in order
    parallel: bool = False                                    # first up: every replica booted at once
    plan: list[str] | None = None                             # dry-run: what would be done
    elapsed_s: float | None = None
    next_commands: list[str] = Field(default_factory=list)


class RouterStatus(_Renamed):
    url: str
    runtime: Literal["process", "container"] = "process"  # a local process (embedded) or a container on rank 0
    live: bool
    ready: bool
    healthy_workers: int | None = None
    total_workers: int | None = None
    requests_per_replica: dict[str, float] | None = None      # the router's own count, per worker URL
    kind: Literal["process", "container"] = Field("process", description=_was("runtime"))


class ReplicaStatus(_Result):
    index: int
    nodes: list[str]
    url: str
    cluster: str
    healthy: bool
    in_router: bool
    router_healthy: bool
    deployment: str | None = None
    profile: str | None = None           # what the replica runs (the record's `profile` is what was asked)
    ranks: list[RankHealth] = Field(default_factory=list)


class ReplicatedStatusResult(_Result):
    """`status` of a replicated deployment: healthy when the router is ready and every replica is healthy and in it."""

    cluster: str
    emulated: bool
    replicated: Literal[True] = True
    ok: bool
    healthy: bool
    profile: str | None = None
    endpoint: str | None = None
    status: str | None = None
    router: RouterStatus | None = None
    replicas: list[ReplicaStatus] = Field(default_factory=list)
    progress: str | None = None          # an `up` in progress, or interrupted (its controller gone)
    watcher: WatcherView | None = None


class ReplicatedDownResult(_Result):
    changed: bool
    replicated: Literal[True] = True
    stopped: list[str] = Field(default_factory=list)          # "router", "replica 0", ...
