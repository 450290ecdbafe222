"""What a running vLLM reports that the measurement card reads, beside what `sparkctl.vllm.answers` reads for the
gates: its own counters in ``/metrics`` (read before and after a measurement, the card keeps the deltas) and the
periodic lines its API server logs while it serves.

vLLM 0.32.0 has no ``/generate`` with per-request ``meta_info`` and no per-batch scheduler line: acceptance is what
it counts in ``/metrics`` (vllm/v1/spec_decode/metrics.py:229-231, only when ``--speculative-config`` is set) and
what it logs every logging interval (10 s; vllm/v1/spec_decode/metrics.py:120 ``SpecDecoding metrics: ...``).
Definitions are vLLM's own (the same file): mean acceptance length = 1 + accepted / drafts (the bonus token
included), acceptance rate = accepted / draft tokens. In tests/fixtures/captures/vllm-0.32.0-cpu/
spec-ngram-metrics.txt: 53 accepted, 26 drafts, 84 draft tokens -> 1 + 53/26 = 3.04 (the log line says 3.04) and
53/84 = 63.1 %.

    before = counters(client.text("/metrics")); ...requests...; after = counters(client.text("/metrics"))
    acceptance(delta(before, after))["mean_acceptance_length"]
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.logparse import EventKind
from sparkctl.sglang.serverinfo import parse_prometheus_samples
from sparkctl.vllm.logparse import parse_line

__all__ = ["COUNTERS", "counters", "delta", "acceptance", "log_window", "NOT_REPORTED", "LOG_SOURCE"]

# The card's neutral name -> vLLM's counter (vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py; every
# label set summed: one engine per API server here, `engine="0"`).
COUNTERS: dict[str, str] = {
    "spec_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "spec_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "prefix_cache_hit_tokens": "vllm:prefix_cache_hits_total",
    "prefix_cache_query_tokens": "vllm:prefix_cache_queries_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
}

LOG_SOURCE = ("own periodic log lines (SpecDecoding metrics, Engine 000 stats) printed during the code decode runs; "
              "each covers its 10 s logging interval")

# What the SGLang card reads that vLLM 0.32.0 does not report, and why: the card prints these instead of a number.
NOT_REPORTED: dict[str, str] = {
    "per_request_acceptance": "vLLM has no native /generate with per-request meta_info (spec_verify_ct); "
                              "acceptance comes from its /metrics spec-decode counters around the code runs",
    "scheduler_gauge": "vLLM logs no per-batch decode line with an instantaneous gen throughput; its periodic "
                       "'Avg generation throughput' is a mean over its 10 s logging interval, not a gauge peak",
    "max_running_requests": "vLLM does not report its resolved --max-num-seqs (not in /metrics, its config line or "
                            "/v1/models); the card names it only when the launch command sets it",
    "batch_running_requests": "vLLM logs its running requests only every 10 s (Engine 000: ... Running: N reqs), "
                              "not per decode batch: a level's serialisation is judged from the streams' timing",
}


def counters(metrics: str) -> dict[str, float]:
    """The card's counters (neutral names) in one ``/metrics`` text; a counter vLLM did not export is left out
    (the spec-decode ones exist only with speculative decoding on)."""
    names = {v: k for k, v in COUNTERS.items()}
    out: dict[str, float] = {}
    for s in parse_prometheus_samples(metrics):
        key = names.get(s.name)
        if key is not None:
            out[key] = out.get(key, 0.0) + s.value
    return out


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """after - before for every counter in both; a counter that went backwards (the engine restarted) is left out."""
    return {k: after[k] - before[k] for k in before.keys() & after.keys() if after[k] >= before[k]}


def acceptance(d: Mapping[str, float]) -> JSONObject:
    """vLLM's acceptance figures from counter deltas: mean acceptance length = 1 + accepted / drafts, acceptance
    rate = accepted / draft tokens (None where the denominator is 0 or the counter absent)."""
    acc, drafts, tokens = d.get("spec_accepted_tokens"), d.get("spec_drafts"), d.get("spec_draft_tokens")
    return {"accepted_tokens": acc, "drafts": drafts, "draft_tokens": tokens,
            "mean_acceptance_length": None if acc is None or not drafts else round(1 + acc / drafts, 4),
            "acceptance_rate": None if acc is None or not tokens else round(acc / tokens, 4),
            "formula": "mean acceptance length = 1 + accepted / drafts; acceptance rate = accepted / draft tokens "
                       "(vLLM's own, vllm/v1/spec_decode/metrics.py)"}


def _range(values: list[float]) -> list[float] | None:
    return [min(values), max(values)] if values else None


def log_window(lines: Iterable[str]) -> JSONObject:
    """What vLLM logged in a window of rank 0's lines: its ``SpecDecoding metrics`` lines (mean acceptance length
    and draft acceptance rate ranges, accepted/drafted token sums) and its ``Engine 000: ...`` stats lines (max
    running requests, mean generation throughput over each 10 s interval). Each line covers vLLM's logging interval,
    which may begin before the window."""
    spec: list[JSONObject] = []
    stats: list[JSONObject] = []
    for line in lines:
        ev = parse_line(line)
        if ev is None:
            continue
        if ev.kind is EventKind.SPEC_DECODE_STATS:
            spec.append(ev.fields)
        elif ev.kind is EventKind.ENGINE_STATS:
            stats.append(ev.fields)
    lens = [f["accept_len"] for f in spec if isinstance(f.get("accept_len"), (int, float))]
    rates = [f["accept_rate"] for f in spec if isinstance(f.get("accept_rate"), (int, float))]
    running = [f["running_req"] for f in stats if isinstance(f.get("running_req"), int)]
    gen = [f["gen_throughput"] for f in stats if isinstance(f.get("gen_throughput"), (int, float))]
    return {"spec_lines": len(spec), "accept_len": _range(lens), "accept_rate": _range(rates),
            "accepted_tokens": sum(int(f.get("accepted_tokens") or 0) for f in spec),
            "drafted_tokens": sum(int(f.get("drafted_tokens") or 0) for f in spec),
            "stats_lines": len(stats), "max_running_req": max(running, default=None),
            "max_interval_gen_throughput": max(gen, default=None)}
