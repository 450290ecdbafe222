"""Plan: the desired deployment vs what runs now, as the ordered steps `up` will run (or a no-op with its reason).

The steps are the program: `deploy.apply.apply` runs exactly `plan.steps`, in order, each recorded in the ledger
as a stage under the step's name, so what `--dry-run` prints cannot drift from what `up` does. A step that
starts engines carries a preview of each command it runs (the `docker run` argv per rank), shown by
`--dry-run`.
"""
from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.render import RenderResult
from sparkctl.state.records import DeploymentRecord

if TYPE_CHECKING:
    from sparkctl.deploy.image_stage import ImageSurvey

Preview = Callable[[], list[tuple[str, list[str]]]]   # -> [(node, argv)] of the commands a step runs


def launch_identity(result: RenderResult, launch_image: str | None = None) -> str:
    """Content hash of what would run: every rank's redacted argv/env/image, and the launch image tag when the
    ranks run one (its tag hashes the engine image's inputs: a new base digest is a new identity).
    Same identity = same deployment."""
    payload: list = [{k: v for k, v in s.redacted().items() if k in ("rank", "node", "argv", "env", "image")}
                     for s in result.specs]
    if launch_image:
        payload.append({"launch_image": launch_image})
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Step:
    """One step of `up`: `name` is also the stage name in the ledger; `node` None means every node."""

    name: str
    what: str
    idempotent: bool = True
    node: str | None = None
    preview: Preview | None = field(default=None, repr=False)

    def commands(self) -> list[tuple[str, list[str]]]:
        return self.preview() if self.preview else []

    def as_dict(self) -> JSONObject:
        return {"name": self.name, "what": self.what, "idempotent": self.idempotent, "node": self.node}


@dataclass
class Plan:
    profile: str
    identity: str
    deployment_id: str                     # the id the new deployment gets (names its containers)
    steps: list[Step] = field(default_factory=list)
    noop_reason: str | None = None
    active_id: str | None = None
    images: ImageSurvey | None = field(default=None, repr=False)   # the survey the image steps came from

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
              *, deployment_id: str, start_preview: Callable[[Any], list[str]] | None = None,
              image_steps: list[tuple[str, str]] | None = None, launch_image: str | None = None) -> Plan:
    """The steps from what runs now (`active`) to `result`. `start_preview(spec)` gives the argv that starts a
    rank (the runtime's `launch_argv`), shown under the boot step by `--dry-run`. `image_steps` are the image
    stage's (name, what) from `deploy.image_stage.ImageSurvey.steps` (each says why it is or is not needed);
    `launch_image` is the launch image tag the ranks will run, part of the identity."""
    identity = launch_identity(result, launch_image)
    plan = Plan(profile=result.profile.name, identity=identity, deployment_id=deployment_id,
                active_id=active.id if active else None)
    if active and active.identity == identity and active_healthy:
        plan.noop_reason = (f"deployment {active.id} already runs profile {result.profile.name} with the same "
                            f"launch identity {identity} and is healthy ({health_detail})")
        return plan
    nodes = result.inventory.nodes
    add = plan.steps.append
    add(Step("preflight", f"preflight on {', '.join(n.name for n in nodes)} (read-only)"))
    for name, what in image_steps or []:
        add(Step(name, what))
    if active:
        why = "unhealthy, same identity" if active.identity == identity else f"profile {active.profile}"
        add(Step("stop-old", f"stop deployment {active.id} ({why}); kept restartable for rollback",
                 idempotent=False))
    order = sorted(result.specs, key=lambda s: -s.rank)
    starts = ", then ".join(f"start rank {s.rank} on {s.node}" for s in order)
    add(Step("boot", f"{starts} (SGLang {order[0].sglang_version}); wait until rank 0 is ready", idempotent=False,
             preview=(lambda: [(s.node, start_preview(s)) for s in order]) if start_preview else None))
    w = result.profile.warmup
    add(Step("warm-up", f"warm-up: {w.requests} x {w.max_tokens} tokens (first request timed apart as cold)"))
    add(Step("verify", "verify: health, models, settings in force, capacity, workers alive, smoke generation"))
    add(Step("hand-off", f"hand off http://{result.specs[0].api_host}:{result.specs[0].api_port} "
                         f"(on failure: {'roll back to ' + active.id if active else 'stop the new engines'})",
             idempotent=False))
    return plan
