"""Verify gates: the deployment is handed off only when every gate passes, each with its evidence.

health (rank 0 /health 200), models (/v1/models lists the served name), settings
(the engine's own account shows the profile's TP, speculative algorithm, draft tokens, KV dtype in force:
SGLang's /server_info, vLLM's config line, /metrics and /v1/models; `sparkctl.engines.settings_seen`),
capacity (the resolved KV tokens / running requests meet the profile's expectations), workers (every rank > 0
alive by its process/container state and log: its own /health is a dummy or, on vLLM, absent), smoke (a
generation returns tokens).

Each gate is a `state.records.GateResult` (the one model of a gate: what runs it returns is what the record keeps).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from sparkctl.config.profile import Profile
from sparkctl.deploy.boot import BootingRank
from sparkctl.engines import resolved_capacity, settings_seen
from sparkctl.errors import SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.bootwatch import BootState
from sparkctl.state.records import GateResult

if TYPE_CHECKING:
    from sparkctl.sglang.client import SGLangClient

V = TypeVar("V")      # what a gate's check gives the gates after it (settings: the engine's /server_info)

def _same(expected: object, seen: object) -> bool:
    if expected is None:
        return seen in (None, "", "NONE", "None")
    if isinstance(expected, float) and isinstance(seen, (int, float)):
        return abs(expected - seen) < 1e-9
    return str(expected) == str(seen)


def run_gates(profile: Profile, client: SGLangClient, watches: list[BootingRank], *,
              smoke_tokens: int = 16) -> list[GateResult]:
    """Run every gate (all of them, even after one fails, so the record shows the whole picture)."""
    gates: list[GateResult] = []

    def gate(name: str, fn: Callable[[], tuple[bool, str, V]]) -> V | None:
        try:
            ok, evidence, value = fn()
        except SparkctlError as exc:  # the engine did not answer as it must: a failed gate with its reason
            ok, evidence, value = False, exc.message, None     # (a bug in sparkctl propagates instead)
        gates.append(GateResult(name=name, ok=ok, evidence=evidence))
        return value

    def health() -> tuple[bool, str, None]:
        code = client.health()
        return code == 200, f"GET /health -> {code}", None

    def models() -> tuple[bool, str, None]:
        ids = [m.get("id") for m in client.models()]
        want = profile.model.served_name or profile.model.path
        return want in ids, f"/v1/models ids={ids}, want {want!r}", None

    def settings() -> tuple[bool, str, JSONObject]:
        rank0 = next((w for w in watches if w.spec.rank == 0), None)
        exp, info = settings_seen(profile, client, rank0.follower if rank0 else None)
        bad = {k: (v, info.get(k)) for k, v in exp.items() if not _same(v, info.get(k))}
        shown = ", ".join(f"{k}={info.get(k)!r}" for k in exp)
        if bad:
            return False, "mismatch " + ", ".join(f"{k}: want {w!r}, engine has {g!r}"
                                                  for k, (w, g) in bad.items()), info
        return True, shown, info

    def capacity(info: JSONObject | None) -> Callable[[], tuple[bool, str, None]]:
        def check() -> tuple[bool, str, None]:
            if info is None:
                return False, "no answer from the engine to read the resolved capacity from", None
            (total_name, total), (running_name, running) = resolved_capacity(profile, info)
            problems = []
            exp = profile.expect
            if exp.min_max_total_num_tokens and (total is None or total < exp.min_max_total_num_tokens):
                problems.append(f"{total_name}={total} < expected {exp.min_max_total_num_tokens}")
            if exp.min_max_running_requests and (running is None or running < exp.min_max_running_requests):
                problems.append(f"{running_name}={running} < expected {exp.min_max_running_requests}")
            ev = f"{total_name}={total}, {running_name}={running}"
            return (not problems), ("; ".join(problems) + f" ({ev})") if problems else ev, None
        return check

    def workers() -> tuple[bool, str, None]:
        notes, ok = [], True
        for w in watches:
            if w.spec.rank == 0:
                continue
            w.poll()
            live = w.runtime.liveness(w.handle)
            verdict = w.follower.classify(final=False)
            rank_ok = live.alive and verdict.state is not BootState.FAILED
            ok &= rank_ok
            notes.append(f"rank {w.spec.rank} ({w.spec.node}): {live.detail}; log: {verdict.state.value}"
                         + (f" ({verdict.detail})" if verdict.state is BootState.FAILED else ""))
        return ok, "; ".join(notes) or "single node", None

    def smoke() -> tuple[bool, str, None]:
        res = client.chat([{"role": "user", "content": "Reply with one short sentence: are you up?"}],
                          max_tokens=smoke_tokens, temperature=0)
        n = res.usage.completion_tokens or 0
        text = (res.reasoning_content or "") + (res.content or "")
        return n > 0 and bool(text.strip()), f"{n} tokens: {text[:60]!r}", None

    gate("health", health)
    gate("models", models)
    info = gate("settings", settings)
    gate("capacity", capacity(info))
    gate("workers", workers)
    gate("smoke", smoke)
    return gates
