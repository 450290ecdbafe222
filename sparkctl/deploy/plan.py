"""Plan: the desired deployment vs what runs now, as the ordered steps `up` will run (or a no-op with its reason).

The steps are the program: each is a small frozen dataclass of its kind carrying its inputs (the prior
deployment, the image survey, the ranks in boot order), made once under the lock from what was observed.
`deploy.apply.apply` runs exactly `plan.steps`, in order, dispatching on each step's class, each recorded in the
ledger as a stage under the step's name (from `deploy.steps`), so what `--dry-run` prints cannot drift from what
`up` does. The boot step carries a preview of each command it runs (the `docker run` argv per rank), shown by
`--dry-run`.
"""
from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from sparkctl.deploy import steps
from sparkctl.enginenames import ENGINE_NAMES
from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.sglang.render import RenderResult
from sparkctl.state.records import DeploymentRecord

if TYPE_CHECKING:
    from sparkctl.deploy.image_stage import ImageSurvey


def launch_identity(result: RenderResult, launch_image: str | None = None) -> str:
    """Content hash of what would run: every rank's redacted argv/env/image, and the launch image tag when the
    ranks run one (its tag hashes the engine image's inputs: a new base digest is a new identity).
    Same identity = same deployment."""
    payload: list = [s.redacted().model_dump(mode="json", include={"rank", "node", "argv", "env", "image"})
                     for s in result.specs]
    if launch_image:
        payload.append({"launch_image": launch_image})
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class Step:
    """One step of `up`, carrying its inputs; `name` (one of `deploy.steps.UP_STEPS`) is also the stage name in
    the ledger and the crash boundary's. `deploy.apply` dispatches on the step's class."""

    name: ClassVar[str]
    idempotent: ClassVar[bool] = True
    what: str
    node: str | None = None                # None: every node
    noop: bool = False                     # decided by the plan: apply journals it `noop` and runs no effect

    def commands(self) -> list[tuple[str, list[str]]]:
        """The commands this step runs, [(node, argv)], shown by `--dry-run` (only the boot step says them)."""
        return []

    def as_dict(self) -> JSONObject:
        return {"name": self.name, "what": self.what, "idempotent": self.idempotent, "node": self.node,
                "noop": self.noop}


@dataclass(frozen=True, kw_only=True)
class Preflight(Step):
    """Read-only checks on every node; the ports the prior deployment holds are its own, not a conflict."""

    name: ClassVar[str] = steps.PREFLIGHT
    own_ports: frozenset[tuple[str, int]] = frozenset()


@dataclass(frozen=True, kw_only=True)
class ImageStep(Step):
    """One of the three image steps, from the survey of what the nodes hold (`deploy.image_stage`)."""

    survey: ImageSurvey = field(repr=False)


@dataclass(frozen=True, kw_only=True)
class ImageBuild(ImageStep):
    name: ClassVar[str] = steps.IMAGE_BUILD


@dataclass(frozen=True, kw_only=True)
class ImageDistribute(ImageStep):
    name: ClassVar[str] = steps.IMAGE_DISTRIBUTE


@dataclass(frozen=True, kw_only=True)
class ImageVerify(ImageStep):
    name: ClassVar[str] = steps.IMAGE_VERIFY


@dataclass(frozen=True, kw_only=True)
class StopOld(Step):
    """Stop the prior deployment, kept restartable: a failure after this step restores it."""

    name: ClassVar[str] = steps.STOP_OLD
    idempotent: ClassVar[bool] = False
    prior: DeploymentRecord = field(repr=False)


@dataclass(frozen=True, kw_only=True)
class Boot(Step):
    """Start the ranks in `order` (rank N-1 .. 0) and wait until rank 0 is ready."""

    name: ClassVar[str] = steps.BOOT
    idempotent: ClassVar[bool] = False
    order: tuple[LaunchSpec, ...] = field(repr=False)
    preview: Callable[[LaunchSpec], list[str]] | None = field(default=None, repr=False, compare=False)

    def commands(self) -> list[tuple[str, list[str]]]:
        return [(s.node, self.preview(s)) for s in self.order] if self.preview else []


@dataclass(frozen=True, kw_only=True)
class WarmUp(Step):
    name: ClassVar[str] = steps.WARM_UP


@dataclass(frozen=True, kw_only=True)
class Verify(Step):
    name: ClassVar[str] = steps.VERIFY


@dataclass(frozen=True, kw_only=True)
class HandOff(Step):
    """Make the new deployment the active one; the prior one (if any) is marked superseded."""

    name: ClassVar[str] = steps.HAND_OFF
    idempotent: ClassVar[bool] = False
    prior: DeploymentRecord | None = field(default=None, repr=False)


IMAGE_STEP_TYPES: dict[str, type[ImageStep]] = {c.name: c for c in (ImageBuild, ImageDistribute, ImageVerify)}
STEP_TYPES: tuple[type[Step], ...] = (Preflight, ImageBuild, ImageDistribute, ImageVerify, StopOld, Boot, WarmUp,
                                      Verify, HandOff)


@dataclass
class Plan:
    """The steps `apply` runs, made once from what was observed (`prior`: the active deployment then)."""

    profile: str
    identity: str
    deployment_id: str                     # the id the new deployment gets (names its containers)
    steps: list[Step] = field(default_factory=list)
    noop_reason: str | None = None
    prior: DeploymentRecord | None = field(default=None, repr=False)
    prior_known_good: str | None = None    # the newest known-good deployment when planned (the record keeps it)
    images: ImageSurvey | None = field(default=None, repr=False)   # the survey the image steps came from

    @property
    def active_id(self) -> str | None:
        return self.prior.id if self.prior else None

    @property
    def noop(self) -> bool:
        return self.noop_reason is not None

    def lines(self, *, commands: bool = False) -> list[str]:
        """Numbered steps; with `commands`, each command a step runs under it (argv quoted as a shell would)."""
        if self.noop:
            return [f"nothing to do: {self.noop_reason}"]
        out = []
        for i, s in enumerate(self.steps, 1):
            out.append(f"{i}. {s.what}" + ("" if s.idempotent else "  [not idempotent]"))
            if commands:
                try:
                    out += [f"     [{node}] $ {shlex.join(argv)}" for node, argv in s.commands()]
                except Exception as exc:  # noqa: BLE001 - a preview is information, never a reason to fail
                    out.append(f"     (commands not shown: {exc})")
        return out

    def as_dict(self) -> JSONObject:
        return {"profile": self.profile, "identity": self.identity, "deployment": self.deployment_id,
                "steps": [s.as_dict() for s in self.steps], "noop_reason": self.noop_reason,
                "active": self.active_id}


def make_plan(result: RenderResult, active: DeploymentRecord | None, active_healthy: bool, health_detail: str,
              *, deployment_id: str, images: ImageSurvey, own_ports: frozenset[tuple[str, int]] = frozenset(),
              prior_known_good: str | None = None,
              start_preview: Callable[[LaunchSpec], list[str]] | None = None, arm_is_ours: bool = False) -> Plan:
    """The steps from what runs now (`active`) to `result`. `images` is the survey of what the nodes hold
    (`deploy.image_stage.survey`): its steps say why each is or is not needed, and its launch image tag is part
    of the identity. `own_ports` are the ports `active` holds (preflight does not count them as taken);
    `start_preview(spec)` gives the argv that starts a rank (the runtime's `launch_argv`), shown under the boot
    step by `--dry-run`. A comparison or tune arm running (`active.command` ARM_COMMAND) is a transaction's
    temporary deployment: only another arm (`arm_is_ours`) takes it as is; anything else (a user's `up`, the
    restore after the trials) deploys its own even when the launch is the same, so that what the ledger says runs
    is what was asked for, never an arm under another name."""
    identity = launch_identity(result, images.identity_key)
    arm = active is not None and active.command == steps.ARM_COMMAND and not arm_is_ours
    plan = Plan(profile=result.profile.name, identity=identity, deployment_id=deployment_id, prior=active,
                prior_known_good=prior_known_good, images=images)
    if active and active.identity == identity and active_healthy and not arm:
        plan.noop_reason = (f"deployment {active.id} already runs profile {result.profile.name} with the same "
                            f"launch identity {identity} and is healthy ({health_detail})")
        return plan
    nodes = result.inventory.nodes
    add = plan.steps.append
    add(Preflight(what=f"preflight on {', '.join(n.name for n in nodes)} (read-only)", own_ports=own_ports))
    for name, what, noop in images.steps():
        add(IMAGE_STEP_TYPES[name](what=what, survey=images, noop=noop))
    if active:
        why = (f"profile {active.profile}" if active.identity != identity else
               "a comparison or tune arm, same identity" if arm else "unhealthy, same identity")
        add(StopOld(what=f"stop deployment {active.id} ({why}); kept restartable for rollback", prior=active))
    order = tuple(sorted(result.specs, key=lambda s: -s.rank))
    starts = ", then ".join(f"start rank {s.rank} on {s.node}" for s in order)
    engine = ENGINE_NAMES.get(order[0].engine, order[0].engine)
    add(Boot(what=f"{starts} ({engine} {order[0].sglang_version}); wait until rank 0 is ready", order=order,
             preview=start_preview))
    w = result.profile.warmup
    add(WarmUp(what=f"warm-up: {w.requests} x {w.max_tokens} tokens (first request timed apart as cold)"))
    add(Verify(what="verify: health, models, settings in force, capacity, workers alive, smoke generation"))
    add(HandOff(what=f"hand off http://{result.specs[0].api_host}:{result.specs[0].api_port} "
                     f"(on failure: {'roll back to ' + active.id if active else 'stop the new engines'})",
                prior=active))
    return plan


# ---- a replicated `up` (deploy/replicated.py): the steps around each replica's own `up` ------------------------
# Run by the same `deploy.apply.run_step` (intent on disk, the screen, the boundary, the effect, the outcome),
# journaled in the parent cluster's `replicated.json` with the same `JournalEntry`; `replica` says which replica.
@dataclass(frozen=True, kw_only=True)
class ReplicatedStep(Step):
    """A step of a replicated `up`; `replica` is its replica's index (None: the router or the whole)."""

    replica: int | None = None

    def as_dict(self) -> JSONObject:
        return {**super().as_dict(), "replica": self.replica}


@dataclass(frozen=True, kw_only=True)
class SettleReplicated(ReplicatedStep):
    """Before anything else: what an `up` whose controller died left (`settle.settle_replicated`), then the
    parent cluster's single-group deployment, if one is active, goes down (after this step, under its own lock)."""

    name: ClassVar[str] = steps.SETTLE
    left: str | None = None                               # "controller pid P on H gone" of the dead `up`, if any
    replicas: tuple[tuple[int, str], ...] = ()            # (index, url) of the replicas that `up` recorded


@dataclass(frozen=True, kw_only=True)
class RouterStart(ReplicatedStep):
    """Start the router (just before the first attach: on a first `up` rank 0 has the engine image it runs from
    only after a replica's image stage), if none of ours runs and a replica serves (planned conditions: a no-op
    otherwise, journaled with the reason)."""

    name: ClassVar[str] = steps.ROUTER_START
    idempotent: ClassVar[bool] = False


@dataclass(frozen=True, kw_only=True)
class ReplicaDetach(ReplicatedStep):
    """Out of the router, its in-flight requests drained; `listed` False: already out (a controller killed
    mid-drain), its requests still finish first."""

    name: ClassVar[str] = steps.REPLICA_DETACH
    url: str
    drain_s: float
    listed: bool


@dataclass(frozen=True, kw_only=True)
class ReplicaUp(ReplicatedStep):
    """The replica's own `up` (its own plan, lock, journal and restore); `together`: a first `up`, every replica's
    at once (nothing serves through the router yet). `on_failure`: in a rolling update, the steps run when it
    fails (that `up` restored what ran before: the router, then the replica, back), before the error ends the run."""

    name: ClassVar[str] = steps.REPLICA_UP
    idempotent: ClassVar[bool] = False
    together: bool = False
    on_failure: tuple[ReplicatedStep, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ReplicaAttach(ReplicatedStep):
    """Back into the router, if it serves (its gates passed, or its failed `up` restored what ran before): a
    planned condition, a no-op journaled with the reason otherwise (the router's gates then say it is missing)."""

    name: ClassVar[str] = steps.REPLICA_ATTACH
    url: str


@dataclass(frozen=True, kw_only=True)
class RouterGates(ReplicatedStep):
    name: ClassVar[str] = steps.ROUTER_GATES


@dataclass(frozen=True, kw_only=True)
class RouterHandOff(ReplicatedStep):
    """The router's endpoint is the one handed off (the record's status "active")."""

    name: ClassVar[str] = steps.HAND_OFF
    idempotent: ClassVar[bool] = False


REPLICATED_STEP_TYPES: tuple[type[ReplicatedStep], ...] = (SettleReplicated, RouterStart, ReplicaDetach, ReplicaUp,
                                                           ReplicaAttach, RouterGates, RouterHandOff)
