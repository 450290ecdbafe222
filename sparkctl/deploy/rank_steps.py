"""The boot and verify steps as `up` (`deploy.apply`) and the restore of a deployment (`deploy.rollback`) both run
them: one readiness rule, one gate client, so the two cannot drift apart.

Boot: ranks highest first, rank 0 last; ready when rank 0's log says so and its /health answers 200, or by
/health alone when the rank log cannot grow (`Cluster.log_room`: the state directory full or read-only).
Verify: every gate of `deploy.gates` against rank 0, within the profile's health timeout.
"""
from __future__ import annotations

from collections.abc import Callable

from sparkctl.config.profile import Profile
from sparkctl.deploy.boot import BootResult, boot
from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.gates import run_gates
from sparkctl.deploy.runtimes import Runtimes
from sparkctl.engines import emulated as engine_emulated
from sparkctl.nodes.runtime import Handle, Runtime
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.sglang.render import RenderResult
from sparkctl.state.records import GateResult


def boot_ranks(c: Cluster, profile: Profile, result: RenderResult, rts: Runtimes, dep_id: str, *,
               timeout_s: float, started: list[tuple[Runtime, Handle]],
               on_start: Callable[[LaunchSpec, Handle | None], None] | None = None) -> BootResult:
    """Start every rank of `result` as deployment `dep_id` and wait until rank 0 serves (see the module doc)."""
    return boot(result.specs, rts.for_node, dep_id, c.reporter, timeout_s=timeout_s, started=started,
                ready_probe=c.health_probe(result.specs[0], profile.api.api_key_env), on_start=on_start,
                log_room=c.log_room(dep_id))


def gate_ranks(c: Cluster, profile: Profile, result: RenderResult, booted: BootResult) -> tuple[list[GateResult], bool]:
    """Every gate against the booted ranks; (gates, emulated: the engine says it is sparkctl's emulator)."""
    with c.client(result.specs[0], profile.api.api_key_env, timeout=profile.lifecycle.health_timeout_s) as client:
        gates = run_gates(profile, client, booted.watches)
        emulated = engine_emulated(profile, client)     # the engine says it is sparkctl's emulator (sparkctl.sim)
    return gates, emulated
