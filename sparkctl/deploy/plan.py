"""Plan: the desired deployment vs what runs now, as ordered steps (or a no-op with its reason)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from sparkctl.sglang.render import RenderResult
from sparkctl.state.records import DeploymentRecord


def launch_identity(result: RenderResult) -> str:
    """Content hash of what would run: every rank's redacted argv/env/image. Same identity = same deployment."""
    payload = [{k: v for k, v in s.redacted().items() if k in ("rank", "node", "argv", "env", "image")}
               for s in result.specs]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Plan:
    profile: str
    identity: str
    steps: list[str] = field(default_factory=list)
    noop_reason: str | None = None
    active_id: str | None = None

    @property
    def noop(self) -> bool:
        return self.noop_reason is not None

    def lines(self) -> list[str]:
        if self.noop:
            return [f"nothing to do: {self.noop_reason}"]
        return [f"{i}. {s}" for i, s in enumerate(self.steps, 1)]

    def as_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "identity": self.identity, "steps": self.steps,
                "noop_reason": self.noop_reason, "active": self.active_id}


def make_plan(result: RenderResult, active: DeploymentRecord | None, active_healthy: bool, health_detail: str,
              kind: str = "up") -> Plan:
    identity = launch_identity(result)
    plan = Plan(profile=result.profile.name, identity=identity, active_id=active.id if active else None)
    if active and active.identity == identity:
        if active_healthy:
            plan.noop_reason = (f"deployment {active.id} already runs profile {result.profile.name} with the same "
                                f"launch identity {identity} and is healthy ({health_detail})")
            return plan
    nodes = result.inventory.nodes
    plan.steps.append(f"preflight on {', '.join(n.name for n in nodes)} (read-only)")
    kinds = {n.runtime for n in nodes}
    if "docker" in kinds:
        plan.steps.append(f"image: ensure {result.specs[0].image or 'the engine image'} is on every node")
    if active:
        why = "unhealthy, same identity" if active.identity == identity else f"profile {active.profile}"
        plan.steps.append(f"stop deployment {active.id} ({why}); kept restartable for rollback  [not idempotent]")
    for spec in sorted(result.specs, key=lambda s: -s.rank):
        plan.steps.append(f"start rank {spec.rank} on {spec.node} (SGLang {spec.sglang_version})  [not idempotent]")
    w = result.profile.warmup
    plan.steps.append(f"warm-up: {w.requests} x {w.max_tokens} tokens (first request timed apart as cold)")
    plan.steps.append("verify: health, models, settings in force, capacity, workers alive, smoke generation")
    plan.steps.append(f"hand off http://{result.specs[0].api_host}:{result.specs[0].api_port} "
                      f"(on failure: {'roll back to ' + active.id if active else 'stop the new engines'})")
    return plan
