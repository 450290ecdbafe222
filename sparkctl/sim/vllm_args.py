"""Parse `vllm serve` argv in vLLM's own dialect and resolve what the emulated vLLM runs with.

The parser is rebuilt from ``sparkctl/vllm/dialects/<version>.json`` (vLLM's real argparse, generated from the
wheel): every flag with its spellings, ``BooleanOptionalAction`` flags with their ``--no-`` form, human-readable
integers (``64k`` = 64,000, ``64K`` = 65,536: vllm/utils/argparse_utils.py ``human_readable_int``), JSON flags
(``--speculative-config``) parsed as JSON, the positional ``model_tag``. An unknown flag fails as vLLM's
FlexibleArgumentParser does: ``vllm serve: error: unrecognized arguments: ...``, exit 2 (no abbreviations: vLLM
sets ``allow_abbrev=False``). ``--config FILE.yaml`` is merged first (vLLM's ``_pull_args_from_config``: the file's
keys become flags after the model, the command line wins); sparkctl passes the API key this way.

Resolution fills what vLLM derives at start-up, with the emulator's knobs standing in for the model and the memory:
the model's max length (``model_context_length``), the KV cache in tokens (``--kv-cache-memory-bytes`` / the
per-rank cell ``kv_bytes_per_token``, else ``--gpu-memory-utilization`` through `perf.kv_pool_tokens`), whole
blocks of 128 tokens (the CPU backend's block size, tp1-metrics-*.txt ``block_size="128"``), ``--max-num-seqs``
(vLLM's default 256 on a GPU is the knob ``default_max_running_requests`` here), ``--speculative-config``'s method
and ``num_speculative_tokens`` (the emulator's draft tokens are num_speculative_tokens + 1: drafted plus bonus).
"""
from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from sparkctl.errors import ConfigError
from sparkctl.sim import perf
from sparkctl.sim.args import Resolved
from sparkctl.sim.config import Knobs

DEFAULT_VLLM_VERSION = "0.32.0"
BLOCK_SIZE = 128            # tp1-metrics-after-2-requests.txt: cache_config_info block_size="128" (CPU backend)
GIB = 1 << 30
_HUMAN_RE = re.compile(r"^(?P<num>-?\d+(?:\.\d+)?)(?P<suffix>[kKmMgGtT]?)$")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def vllm_version() -> str:
    """The emulated vLLM release: ``SPARKCTL_SIM_VLLM_VERSION`` (default 0.32.0, the only dialect sparkctl has)."""
    return os.environ.get("SPARKCTL_SIM_VLLM_VERSION") or DEFAULT_VLLM_VERSION


def human_readable_int(value: str) -> int:
    """vLLM's ``human_readable_int``: ``1k`` -> 1,000, ``1K`` -> 1,024, ``25.6k`` -> 25,600; ``auto`` / ``-1`` -> -1
    for the flags that take it."""
    text = str(value).strip()
    if text == "auto":
        return -1
    m = _HUMAN_RE.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"Invalid human-readable integer: {value!r}")
    num, suffix = float(m.group("num")), m.group("suffix")
    mult = _DECIMAL.get(suffix) or _BINARY.get(suffix) or 1
    return int(num * mult)


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _type(flag: dict[str, Any]) -> Any:
    raw, typ = flag.get("type_raw") or "", flag.get("type")
    if "human_readable_int" in raw:
        return human_readable_int
    if "loads" in raw or typ == "json":
        return json.loads
    if "parse_dataclass" in raw or "union_dict_and_str" in raw:
        return _json_or_text
    return {"int": int, "float": float}.get(typ or "", str)


def build_parser(version: str) -> argparse.ArgumentParser:
    """`vllm serve`'s parser from the dialect file (ConfigError if sparkctl has none for `version`)."""
    path = resources.files("sparkctl.vllm") / "dialects" / f"{version}.json"
    if not path.is_file():
        raise ConfigError(f"no flag schema for vLLM {version}", where="SPARKCTL_SIM_VLLM_VERSION",
                          hint="use 0.32.0")
    data = json.loads(path.read_text(encoding="utf-8"))
    parser = argparse.ArgumentParser(prog="vllm serve", allow_abbrev=False)
    for f in data["flags"]:
        opts = [o for o in f["options"] if not o.startswith("--no-")] if f["action"] == "BooleanOptionalAction" \
            else list(f["options"])
        kwargs: dict[str, Any] = {"default": f.get("default")}
        if f["dest"] == "model_tag":
            parser.add_argument("model_tag", nargs="?", default=None)
            continue
        if f["action"] == "BooleanOptionalAction":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif f["action"] == "_StoreTrueAction":
            kwargs["action"] = "store_true"
        elif f["action"] == "_AppendAction":
            kwargs.update(action="append", type=_type(f))
        else:
            kwargs["type"] = _type(f)
            if isinstance(kwargs["default"], str) and kwargs["type"] is not str:
                kwargs["default"] = None     # the schema keeps the repr of vLLM's default object, not an argv value
            if f.get("nargs") in ("+", "*", "?"):
                kwargs["nargs"] = f["nargs"]
            if f.get("choices"):
                conv = kwargs["type"]
                kwargs["choices"] = [conv(c) if conv in (int, float) else c for c in f["choices"]]
        try:
            parser.add_argument(*opts, dest=f["dest"], **kwargs)
        except (argparse.ArgumentError, ValueError):
            continue   # an option registered twice in the schema: keep the first
    return parser


@dataclass
class VllmSettings:
    """What only the vLLM dialect knows (the rest is the shared `Resolved`)."""
    headless: bool
    master_addr: str
    master_port: int
    kv_cache_bytes: int | None         # per rank, when --kv-cache-memory-bytes sizes the cache
    gpu_memory_utilization: float
    kv_cache_dtype: str
    dtype: str
    enforce_eager: bool
    prefix_caching: bool
    spec_method: str | None
    num_speculative_tokens: int | None
    spec_model: str | None
    max_num_batched_tokens: int
    model_max_len: int                 # the model's own (derived) max length
    non_default: dict[str, Any]        # `non-default args: {...}` (api_utils.py:286)


def _spec(value: Any) -> tuple[str | None, int | None, str | None]:
    if not value:
        return None, None, None
    if not isinstance(value, dict):
        raise ValueError(f"--speculative-config must be a JSON object, got {value!r}")
    method = value.get("method")
    tokens = value.get("num_speculative_tokens")
    return (str(method) if method else None, int(tokens) if tokens is not None else None,
            str(value["model"]) if value.get("model") else None)


def kv_tokens(knobs: Knobs, kv_cache_bytes: int | None, gpu_memory_utilization: float, kv_dtype: str) -> int:
    """The KV cache in tokens, whole blocks: from the per-rank byte budget and the per-rank cell when
    ``--kv-cache-memory-bytes`` is given, else the performance model's pool at --gpu-memory-utilization."""
    cell = knobs.kv_bytes_per_token / (2 if kv_dtype.startswith("fp8") else 1)
    tokens = int(kv_cache_bytes // cell) if kv_cache_bytes is not None else \
        perf.kv_pool_tokens(knobs, gpu_memory_utilization, kv_dtype, None)
    return max(0, tokens) // BLOCK_SIZE * BLOCK_SIZE


def resolve(parser: argparse.ArgumentParser, ns: argparse.Namespace, argv: list[str], version: str,
            knobs: Knobs) -> tuple[Resolved, VllmSettings]:
    """(the shared resolution the scheduler and API read, the vLLM-only settings) of a parsed argv."""
    a: dict[str, Any] = dict(vars(ns))
    g = a.get
    model = g("model_tag") or g("model") or "default-model"
    served = g("served_model_name")
    served_name = served[0] if isinstance(served, list) and served else (served or model)
    tp = int(g("tensor_parallel_size") or 1)
    nnodes = int(g("nnodes") or 1)
    node_rank = int(g("node_rank") or 0)
    model_max = knobs.model_context_length
    max_len = g("max_model_len")
    context = model_max if max_len in (None, -1) else int(max_len)
    method, spec_tokens, spec_model = _spec(g("speculative_config"))
    draft = (spec_tokens or 1) + 1 if method else 1
    kv_bytes = g("kv_cache_memory_bytes")
    util_given = g("gpu_memory_utilization")
    util = float(util_given) if util_given is not None else 0.92      # vllm/config/cache.py's default
    kv_dtype = str(g("kv_cache_dtype") or "auto")
    tokens = kv_tokens(knobs, kv_bytes, util, kv_dtype)
    seqs = int(g("max_num_seqs") or knobs.default_max_running_requests)
    batched = int(g("max_num_batched_tokens") or 4096)   # tp2-rank0.log: "max_num_batched_tokens=4096"
    keys = g("api_key")
    api_key = str(keys[0]) if isinstance(keys, list) and keys else (str(keys) if keys else None)
    timeout = g("distributed_timeout_seconds")
    defaults = {act.dest: act.default for act in parser._actions}
    non_default = {k: v for k, v in a.items() if k in defaults and v != defaults[k]}
    if "model_tag" in non_default:
        non_default["model"] = model
    res = Resolved(
        version=version, args=a, argv=list(argv), tp_size=tp, nnodes=nnodes, node_rank=node_rank,
        host=g("host") or "0.0.0.0", port=int(g("port") or 8000), dist_host=g("master_addr") or "127.0.0.1",
        dist_port=int(g("master_port") or 29501), served_model_name=str(served_name), model_path=str(model),
        context_len=context, max_total_num_tokens=max(1, tokens), max_running_requests=seqs,
        requested_max_running_requests=seqs, mamba_capped=False, mamba_cache_size=0, hybrid=False,
        chunked_prefill_size=batched, max_prefill_tokens=batched, max_req_input_len=context,
        spec_algorithm=method.upper() if method else None, num_draft_tokens=draft, draft_model_path=spec_model,
        kv_dtype=kv_dtype, reasoning_parser=g("reasoning_parser") or None,
        api_key=api_key, enable_metrics=True, decode_log_interval=1 << 30,
        dist_timeout=float(timeout) if timeout else None,
        extras={"boot_oom": perf.boot_oom(knobs, util), "kv_tokens": tokens})
    settings = VllmSettings(
        headless=bool(g("headless")), master_addr=res.dist_host or "127.0.0.1", master_port=res.dist_port or 29501,
        kv_cache_bytes=int(kv_bytes) if kv_bytes is not None else None, gpu_memory_utilization=util,
        kv_cache_dtype=kv_dtype, dtype=str(g("dtype") or "auto"), enforce_eager=bool(g("enforce_eager")),
        prefix_caching=g("enable_prefix_caching") is not False, spec_method=method,
        num_speculative_tokens=spec_tokens, spec_model=spec_model, max_num_batched_tokens=batched,
        model_max_len=model_max, non_default=non_default)
    return res, settings

