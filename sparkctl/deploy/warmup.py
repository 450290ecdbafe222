"""Warm-up: the profile's requests after boot; the first (cold) one is timed and kept apart."""
from __future__ import annotations

from typing import TYPE_CHECKING

from sparkctl.config.profile import Profile
from sparkctl.deploy.progress import Reporter
from sparkctl.errors import DeployError
from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.responses import SGLangAPIError

if TYPE_CHECKING:
    from sparkctl.sglang.client import SGLangClient


def warm_up(profile: Profile, client: SGLangClient, reporter: Reporter, node: str) -> JSONObject:
    """Run the warm-up requests. Returns {"cold": {...}, "warm": [{...}, ...]}; raises DeployError on failure."""
    w = profile.warmup
    out: JSONObject = {"cold": None, "warm": [], "max_tokens": w.max_tokens}
    for i in range(w.requests):
        try:
            res = client.chat([{"role": "user", "content": w.prompt}], max_tokens=w.max_tokens, temperature=0,
                              model=profile.model.served_name)
        except SGLangAPIError as exc:
            raise DeployError(f"warm-up request {i + 1}/{w.requests} failed: {exc.message}", where=f"[{node}] warm-up",
                              hint="read the engine log (sparkctl logs --rank 0)", evidence=exc.render()) from None
        entry = {"elapsed_s": round(res.latency, 3), "completion_tokens": res.usage.completion_tokens,
                 "finish_reason": res.finish_reason}
        label = "cold" if i == 0 else "warm"
        if i == 0:
            out["cold"] = entry
        else:
            out["warm"].append(entry)
        reporter.event(f"{label} request {i + 1}/{w.requests}: {entry['completion_tokens']} tokens in "
                       f"{entry['elapsed_s']:.2f}s", node)
    return out
