"""What a running vLLM says it runs, read from its own answers, for the verify gates and the card.

vLLM 0.32.0 has no `/server_info`. What it is running is in three places, each read here:

- the engine's config line, printed once by rank 0's EngineCore at start-up (vllm/v1/engine/core.py:133):
  ``Initializing a V1 LLM engine (v0.32.0) with config: model='...', speculative_config=SpeculativeConfig(
  method='dflash', model='...', num_spec_tokens=3), ..., max_seq_len=1024, ..., tensor_parallel_size=2, ...,
  kv_cache_dtype=auto, ...`` (the resolved values, not the argv);
- ``/metrics``' ``vllm:cache_config_info`` labels: the KV cache as allocated (``cache_dtype``,
  ``gpu_memory_utilization``, ``kv_cache_size_tokens``, ``kv_cache_max_concurrency``, ``num_gpu_blocks``,
  ``block_size``; "gpu" in the names on a CPU too);
- ``/v1/models``: ``max_model_len`` of the served model.

Every key the gates compare is vLLM's own name; `expected_settings` says what the profile asks for in those names
(the same translation render uses). Examples are real lines: tests/fixtures/captures/vllm-0.32.0-cpu/.
"""
from __future__ import annotations

from sparkctl.config.profile import Profile
from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.dialect import Dialect
from sparkctl.sglang.serverinfo import parse_prometheus_samples
from sparkctl.vllm.logparse import parse_engine_config
from sparkctl.vllm.render import KV_DTYPES, speculative_config

__all__ = ["cache_config", "capacity", "expected_settings", "parse_engine_config", "settings_in_force"]

def cache_config(metrics: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` in a ``/metrics`` text ({} when it is not there)."""
    for s in parse_prometheus_samples(metrics):
        if s.name == "vllm:cache_config_info":
            return dict(s.labels)
    return {}


def _number(text: str | None) -> int | float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() else value


def settings_in_force(engine_config: JSONObject | None, metrics: str, models: list[JSONObject]) -> JSONObject:
    """vLLM's own account of what it runs, in its names: the config line's resolved settings, the KV cache's
    labels, the served model's max_model_len."""
    seen: JSONObject = dict(engine_config or {})
    labels = cache_config(metrics)
    seen["kv_cache_dtype_allocated"] = labels.get("cache_dtype")
    seen["gpu_memory_utilization"] = _number(labels.get("gpu_memory_utilization"))
    seen["kv_cache_size_tokens"] = _number(labels.get("kv_cache_size_tokens"))
    seen["kv_cache_max_concurrency"] = _number(labels.get("kv_cache_max_concurrency"))
    seen["num_gpu_blocks"] = _number(labels.get("num_gpu_blocks"))
    seen["block_size"] = _number(labels.get("block_size"))
    seen["max_model_len"] = next((m.get("max_model_len") for m in models if "max_model_len" in m), None)
    return seen


def expected_settings(profile: Profile, dialect: Dialect) -> JSONObject:
    """What the profile asks vLLM for, in vLLM's names (render's translation): checked against
    `settings_in_force` by the settings gate."""
    exp: JSONObject = {"tensor_parallel_size": profile.server.tp_size}
    spec = speculative_config(profile, dialect)
    exp["speculative_method"] = None if spec is None else spec["method"]
    if spec is not None and "num_speculative_tokens" in spec:
        exp["num_speculative_tokens"] = spec["num_speculative_tokens"]
    server = profile.server
    if server.kv_cache_dtype is not None:
        exp["kv_cache_dtype"] = KV_DTYPES.get(server.kv_cache_dtype, server.kv_cache_dtype)
    if server.mem_fraction_static is not None:
        exp["gpu_memory_utilization"] = server.mem_fraction_static
    if server.context_length is not None:
        exp["max_model_len"] = server.context_length
    return exp


def capacity(seen: JSONObject) -> tuple[int | None, float | None]:
    """(KV cache size in tokens, requests of max_model_len the KV cache holds at once) from `settings_in_force`."""
    tokens, concurrency = seen.get("kv_cache_size_tokens"), seen.get("kv_cache_max_concurrency")
    return (tokens if isinstance(tokens, int) else None,
            float(concurrency) if isinstance(concurrency, (int, float)) else None)
