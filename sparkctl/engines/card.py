"""What each engine tells the measurement card (`sparkctl bench`), asked here so the bench spells no engine's
endpoints, metric names or log lines.

SGLang's card reads ``/server_info``, its scheduler's ``Decode batch`` / ``Prefill batch`` lines and native
``/generate`` (`sparkctl.bench` keeps that path as it was). Another engine's arm is described by `ArmFacts`, read
from that engine's own answers: vLLM's config line (rank 0's log), ``/metrics`` (``vllm:cache_config_info``),
``/v1/models`` and ``/version`` (`sparkctl.vllm.answers`); its counters and periodic log lines are read around each
measurement (`sparkctl.vllm.measures`).

    facts = arm_facts("vllm", client, rank0_lines, argv)
    facts.speculative_method, facts.draft_tokens      # 'ngram', 4 (vLLM's num_speculative_tokens)
    before = engine_counters("vllm", client); ...; acceptance_from(delta(before, engine_counters("vllm", client)))
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sparkctl.enginelog import follower_for
from sparkctl.enginenames import ENGINE_NAMES
from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.client import SGLangAPIError, SGLangClient
from sparkctl.sglang.responses import EndpointBoundError, EndpointProtocolError
from sparkctl.vllm import answers as vllm_answers
from sparkctl.vllm import measures as vllm_measures

__all__ = ["ArmFacts", "arm_facts", "engine_of_endpoint", "engine_counters", "counter_delta", "acceptance_from",
           "log_window", "capacity_from_log", "not_reported", "counters_source", "log_source"]


@dataclass(frozen=True)
class ArmFacts:
    """An arm's configuration as its engine (other than SGLang) reports it, in the card's terms, each with where it
    was read; `settings` keeps the engine's own names and values as read."""

    engine: str
    version: str | None
    model: str | None
    speculative_method: str | None
    draft_tokens: int | None
    draft_tokens_meaning: str
    context_length: int | None
    context_source: str
    max_running_requests: int | None
    max_running_requests_source: str
    kv_tokens: int | None
    kv_concurrency: float | None
    kv_dtype: str | None
    memory_fraction: float | None
    memory_fraction_name: str
    prefix_cache: bool | str
    sources: list[str]
    settings: JSONObject = field(default_factory=dict)
    emulated: bool = False          # /version says so (sparkctl's emulator; the real vLLM's has only "version")

    def as_dict(self) -> JSONObject:
        return {"engine": self.engine, "engine_name": ENGINE_NAMES.get(self.engine, self.engine),
                "version": self.version, "model": self.model, "speculative_method": self.speculative_method,
                "draft_tokens": self.draft_tokens, "draft_tokens_meaning": self.draft_tokens_meaning,
                "context_length": self.context_length, "context_source": self.context_source,
                "max_running_requests": self.max_running_requests,
                "max_running_requests_source": self.max_running_requests_source,
                "kv_tokens": self.kv_tokens, "kv_concurrency": self.kv_concurrency, "kv_dtype": self.kv_dtype,
                "memory_fraction": self.memory_fraction,
                "memory_fraction_name": self.memory_fraction_name, "prefix_cache": self.prefix_cache,
                "sources": self.sources,
                "settings": self.settings, "emulated": self.emulated}


def _optional(read: object) -> object:
    """Call `read` (a no-argument callable); None when the engine does not answer it. A broken bound or protocol
    is not "no answer": it propagates (the run's guard stops the run)."""
    try:
        return read()  # type: ignore[operator]
    except (EndpointBoundError, EndpointProtocolError):
        raise
    except SGLangAPIError:
        return None


def engine_of_endpoint(client: SGLangClient) -> str:
    """Which engine serves a bare endpoint that has no ``/server_info`` (SGLang's): vLLM names itself in
    ``/v1/models`` (``owned_by: "vllm"``); anything else is measured as SGLang's card always measured it."""
    models = _optional(client.models)
    if isinstance(models, list) and any(isinstance(m, dict) and m.get("owned_by") == "vllm" for m in models):
        return "vllm"
    return "sglang"


def _argv_value(argv: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        name, eq, val = a.partition("=")
        if name == flag:
            return val if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def _version_body(text: object) -> dict[str, object]:
    if not isinstance(text, str):
        return {}
    try:
        body = json.loads(text)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _version(text: object) -> str | None:
    """``/version``'s ``{"version": "0.32.0"}`` -> "0.32.0" (None for anything else)."""
    if not isinstance(text, str):
        return None
    try:
        body = json.loads(text)
    except ValueError:
        return None
    v = body.get("version") if isinstance(body, dict) else None
    return v if isinstance(v, str) and len(v) <= 64 else None


def arm_facts(engine: str, client: SGLangClient, log_lines: Iterable[str] | None,
              argv: Sequence[str] | None = None) -> ArmFacts:
    """The arm's configuration from `engine`'s own answers (vLLM: the config line in `log_lines`, rank 0's log when
    there is one; ``/metrics``, ``/v1/models``, ``/version``). `argv` is rank 0's launch command when sparkctl made
    the deployment (the one place vLLM's --max-num-seqs shows)."""
    if engine != "vllm":
        raise ValueError(f"no card reader for engine {engine!r} (SGLang's card reads /server_info)")
    follower = follower_for("vllm")
    for line in log_lines or ():
        follower.feed(line)
    metrics = _optional(lambda: client.text("/metrics"))
    models = _optional(client.models)
    version_text = _optional(lambda: client.text("/version", max_bytes=4096))
    seen = vllm_answers.settings_in_force(follower.engine_config, metrics if isinstance(metrics, str) else "",
                                          models if isinstance(models, list) else [])
    config = follower.engine_config or {}
    sources = ["/metrics vllm:cache_config_info" if isinstance(metrics, str) else "/metrics: no answer",
               "/v1/models" if isinstance(models, list) else "/v1/models: no answer"]
    sources.append("rank 0's log: the engine's config line" if follower.engine_config else
                   "no engine config line (no rank 0 log: speculative decoding and TP unknown)")
    version = _version(version_text)
    model = next((m.get("id") for m in models if isinstance(m, dict) and m.get("id")), None) \
        if isinstance(models, list) else None
    context, context_src = seen.get("max_model_len"), "/v1/models max_model_len"
    if not isinstance(context, int):
        context, context_src = config.get("max_seq_len"), "the engine's config line max_seq_len"
    seqs = _argv_value(list(argv or []), "--max-num-seqs")
    if seqs is None and follower.server_args and isinstance(follower.server_args.get("max_num_seqs"), int):
        seqs = str(follower.server_args["max_num_seqs"])
    running, running_src = (int(seqs), "the launch command's --max-num-seqs") if seqs and seqs.isdigit() else \
        (None, vllm_measures.NOT_REPORTED["max_running_requests"])
    tokens, concurrency = vllm_answers.capacity(seen)
    dtype = seen.get("kv_cache_dtype") or seen.get("kv_cache_dtype_allocated")
    fraction = seen.get("gpu_memory_utilization")
    prefix = config.get("enable_prefix_caching")
    return ArmFacts(
        engine="vllm", version=version if isinstance(version, str) else None, model=model,
        speculative_method=config.get("speculative_method") if follower.engine_config else None,
        draft_tokens=config.get("num_speculative_tokens") if isinstance(config.get("num_speculative_tokens"), int)
        else None,
        draft_tokens_meaning="tokens the drafter proposes per step (vLLM's num_speculative_tokens)",
        context_length=context if isinstance(context, int) else None, context_source=context_src,
        max_running_requests=running, max_running_requests_source=running_src,
        kv_tokens=tokens, kv_concurrency=concurrency, kv_dtype=dtype if isinstance(dtype, str) else None,
        memory_fraction=float(fraction) if isinstance(fraction, (int, float)) else None,
        memory_fraction_name="gpu_memory_utilization (vllm:cache_config_info; on a CPU the KV size is set apart)",
        prefix_cache=prefix if isinstance(prefix, bool) else "unknown", sources=sources, settings=seen,
        emulated=_version_body(version_text).get("emulated") is True)


def engine_counters(engine: str, client: SGLangClient) -> dict[str, float] | None:
    """The engine's counters the card reads around a measurement (neutral names: spec_accepted_tokens,
    spec_drafts, spec_draft_tokens, prefix_cache_hit_tokens, ...), or None when the engine has none to read this way
    (SGLang: the card reads its scheduler log and /generate) or did not answer."""
    if engine != "vllm":
        return None
    text = _optional(lambda: client.text("/metrics"))
    return vllm_measures.counters(text) if isinstance(text, str) else None


def counter_delta(before: Mapping[str, float] | None, after: Mapping[str, float] | None) -> dict[str, float] | None:
    """after - before per counter (None when either read failed)."""
    if before is None or after is None:
        return None
    return vllm_measures.delta(before, after)


def acceptance_from(engine: str, d: Mapping[str, float]) -> JSONObject:
    """Mean acceptance length and acceptance rate from counter deltas, by the engine's own definitions."""
    if engine != "vllm":
        raise ValueError(f"no counter-based acceptance for engine {engine!r}")
    return vllm_measures.acceptance(d)


def counters_source(engine: str) -> str:
    """Where `engine_counters` reads, for the card (the counters' own names)."""
    names = ", ".join(vllm_measures.COUNTERS[k] for k in ("spec_accepted_tokens", "spec_drafts",
                                                         "spec_draft_tokens"))
    return f"{ENGINE_NAMES.get(engine, engine)} /metrics counters ({names}), delta around the code decode runs"


def log_source(engine: str) -> str:
    """What `log_window` reads, for the card."""
    return f"{ENGINE_NAMES.get(engine, engine)}'s {vllm_measures.LOG_SOURCE}"


def log_window(engine: str, lines: Iterable[str]) -> JSONObject:
    """What the engine logged in a window of rank 0's lines (vLLM: its SpecDecoding and stats lines)."""
    if engine != "vllm":
        raise ValueError(f"no log window reader for engine {engine!r}")
    return vllm_measures.log_window(lines)


def capacity_from_log(engine: str, lines: Iterable[str]) -> JSONObject:
    """The capacity the engine printed at boot, as its log follower reads it (`state.records.Capacity` keys)."""
    f = follower_for(engine)
    for line in lines:
        f.feed(line)
    return dict(f.capacity or {})


def not_reported(engine: str) -> dict[str, str]:
    """What SGLang's card shows that `engine` does not report, each with the reason the card prints."""
    return dict(vllm_measures.NOT_REPORTED) if engine == "vllm" else {}
