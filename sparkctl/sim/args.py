"""Parse SGLang's launch_server argv in the emulated version's dialect and resolve it.

Parsing uses ``sparkctl.sglang.dialect.load_dialect(version).argparser()``: the real flag
schema of that release, so an unknown or removed flag fails exactly like SGLang does
(``launch_server.py: error: unrecognized arguments: ...``, exit 2). Resolution then fills what
SGLang derives at start-up (capacity, running-request cap, speculative defaults), with the
emulator's knobs standing in for GPU memory and model config.
"""
from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkctl.sim import perf
from sparkctl.sim.config import Knobs, version_tuple

# Model names that are hybrid (mamba/linear-attention state) when the argv gives no hint.
_HYBRID_NAME_RE = re.compile(r"qwen3[._-]?next|qwen3\.5|kimi[-_]linear|nemotron[-_]h|granite-4|falcon-h1|"
                             r"jamba|mamba", re.IGNORECASE)
MAMBA_STATE_SLOTS_PER_REQUEST = perf.MAMBA_STATE_SLOTS_PER_REQUEST


def build_parser(version: str) -> tuple[argparse.ArgumentParser, str | None]:
    """The dialect's parser; (parser, warning) where warning is set only for the stand-in."""
    from sparkctl.errors import ConfigError
    from sparkctl.sglang.dialect import available_versions, load_dialect
    try:
        return load_dialect(version).argparser(), None
    except ConfigError:
        if available_versions():
            raise
    # No dialect data installed at all (development checkout before generation): a small stand-in.
    return _standin_parser(), (f"sparkctl-sim: no flag schema installed for SGLang {version}; "
                               f"using the emulator's minimal stand-in parser")


def startup_error(ns: argparse.Namespace, version: str) -> str | None:
    """What SGLang's launcher dies with before starting anything, for argv its parser accepted; None if nothing.

    Today: an unknown --speculative-algorithm on versions whose parser takes any string (0.5.23); the name
    is upper-cased and looked up among SpeculativeAlgorithm's members and aliases, as from_string does.
    """
    from sparkctl.sglang.dialect import load_dialect
    from sparkctl.sim.failures import unknown_speculative_algorithm
    name = getattr(ns, "speculative_algorithm", None)
    try:
        dialect = load_dialect(version)
    except Exception:  # noqa: BLE001 - no schema: the stand-in parser has no algorithm list either
        return None
    known, error = dialect.speculative_algorithms, dialect.speculative_unknown_error
    if name is None or known is None or error is None or str(name).upper() in known:
        return None
    return unknown_speculative_algorithm(error.replace("{name}", str(name)))


def _standin_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch_server.py", allow_abbrev=False)
    s = p.add_argument
    s("--model-path", "--model", dest="model_path", type=str)
    for name, typ, default in [
        ("--tokenizer-path", str, None), ("--served-model-name", str, None), ("--host", str, "127.0.0.1"),
        ("--port", int, 30000), ("--tp-size", int, 1), ("--nnodes", int, 1), ("--node-rank", int, 0),
        ("--dist-init-addr", str, None), ("--dist-timeout", int, None), ("--reasoning-parser", str, None),
        ("--tool-call-parser", str, None), ("--speculative-algorithm", str, None),
        ("--speculative-draft-model-path", str, None), ("--speculative-num-draft-tokens", int, None),
        ("--speculative-num-steps", int, None), ("--speculative-eagle-topk", int, None),
        ("--speculative-dflash-block-size", int, None), ("--speculative-draft-attention-backend", str, None),
        ("--max-total-tokens", str, None), ("--max-running-requests", int, None),
        ("--context-length", int, None), ("--kv-cache-dtype", str, "auto"),
        ("--mem-fraction-static", float, None), ("--mamba-full-memory-ratio", float, 0.9),
        ("--max-mamba-cache-size", int, None), ("--api-key", str, None), ("--decode-log-interval", int, 40),
        ("--chunked-prefill-size", int, None), ("--max-prefill-tokens", int, 16384),
        ("--watchdog-timeout", float, 300), ("--attention-backend", str, None),
        ("--dsa-prefill-backend", str, None), ("--dsa-decode-backend", str, None),
        ("--cuda-graph-max-bs-decode", int, None),
    ]:
        s(name, type=typ, default=default)
    for name in ("--trust-remote-code", "--enable-metrics", "--disable-cuda-graph", "--disable-radix-cache",
                 "--enable-cache-report", "--skip-server-warmup"):
        s(name, action="store_true")
    return p


def _parse_tokens(value: object) -> int | None:
    """'128k' / '131072' / 131072 -> int (SGLang accepts k/m suffixes for --max-total-tokens)."""
    if value is None:
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    mult = 1
    if text.endswith("k"):
        mult, text = 1024, text[:-1]
    elif text.endswith("m"):
        mult, text = 1024 * 1024, text[:-1]
    return int(float(text) * mult)


@dataclass
class Resolved:
    """What the emulated engine runs with; ``args`` is the ServerArgs-like dict (/server_info)."""
    version: str
    args: dict[str, Any]
    argv: list[str]
    tp_size: int
    nnodes: int
    node_rank: int
    host: str
    port: int
    dist_host: str | None
    dist_port: int | None
    served_model_name: str
    model_path: str
    context_len: int
    max_total_num_tokens: int
    max_running_requests: int
    requested_max_running_requests: int
    mamba_capped: bool
    mamba_cache_size: int
    hybrid: bool
    chunked_prefill_size: int
    max_prefill_tokens: int
    max_req_input_len: int
    spec_algorithm: str | None
    num_draft_tokens: int
    draft_model_path: str | None
    kv_dtype: str
    reasoning_parser: str | None
    api_key: str | None
    enable_metrics: bool
    decode_log_interval: int
    dist_timeout: float | None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def speculative(self) -> bool:
        return self.spec_algorithm is not None

    @property
    def tp_rank(self) -> int:
        """First TP rank on this node (TP ranks are spread evenly over the nodes)."""
        return self.node_rank * max(1, self.tp_size // max(1, self.nnodes))

    @property
    def vt(self) -> tuple[int, int, int]:
        return version_tuple(self.version)

    @property
    def old_dialect(self) -> bool:
        """0.5.3/0.5.4 era: 'Decode batch.' lines, only /get_server_info."""
        return self.vt < (0, 5, 5)

    @property
    def old_accept_rate(self) -> bool:
        """Before SGLang PR #23530 (2026-04) accept rate included the bonus token: len / draft."""
        return self.vt < (0, 5, 16)


_TORCH_DTYPES = {"auto": "torch.bfloat16", "bf16": "torch.bfloat16", "bfloat16": "torch.bfloat16",
                 "fp16": "torch.float16", "float16": "torch.float16",
                 "fp8_e4m3": "torch.float8_e4m3fn", "fp8_e5m2": "torch.float8_e5m2",
                 "fp4_e2m1": "torch.float4_e2m1fn_x2"}


def _speculative(a: dict[str, Any]) -> tuple[str | None, Any]:
    """The speculative algorithm (upper case; None: off) and its draft tokens as SGLang derives them (DFLASH: its
    block size, default 16; EAGLE and the others: steps + 1), with the derived flags written back into `a`."""
    g: Callable[[str], Any] = a.get
    spec = g("speculative_algorithm")
    spec = str(spec).upper() if spec else None
    draft_tokens = g("speculative_num_draft_tokens") or g("speculative_dflash_block_size")
    if spec == "DFLASH":
        draft_tokens = draft_tokens or 16
        a["speculative_num_steps"], a["speculative_eagle_topk"] = 1, 1
    elif spec:
        steps = g("speculative_num_steps") or 3
        a["speculative_num_steps"] = steps
        a["speculative_eagle_topk"] = g("speculative_eagle_topk") or 1
        draft_tokens = draft_tokens or steps + 1
    a["speculative_algorithm"] = spec
    a["speculative_num_draft_tokens"] = int(draft_tokens) if spec else None
    return spec, draft_tokens


def _mamba_cap(max_mamba_cache_size: Any, knobs: Knobs, mamba_ratio: Any, mrr: int) -> tuple[int, bool, int]:
    """A hybrid model's running requests capped by its mamba state slots: (max running requests, whether the cap
    lowered them, the mamba cache size), from --max-mamba-cache-size or the pool the performance model gives."""
    if max_mamba_cache_size:
        mamba_cache_size = int(max_mamba_cache_size)
        cap = mamba_cache_size // MAMBA_STATE_SLOTS_PER_REQUEST
    else:
        cap = perf.mamba_cache_slots(knobs, mamba_ratio)
        mamba_cache_size = cap * MAMBA_STATE_SLOTS_PER_REQUEST
    if cap < mrr:
        return max(1, cap), True, mamba_cache_size
    return mrr, False, mamba_cache_size


def resolve(ns: argparse.Namespace, argv: list[str], version: str, knobs: Knobs) -> Resolved:
    a: dict[str, Any] = dict(vars(ns))
    g: Callable[[str], Any] = a.get     # any value argparse gave, None when absent
    mrr_given = g("max_running_requests") is not None
    model_path = g("model_path") or "default-model"
    served = g("served_model_name") or model_path
    a["model_path"] = model_path
    a["served_model_name"] = served
    if a.get("tokenizer_path") is None:
        a["tokenizer_path"] = model_path
    tp_size = int(g("tp_size") or 1)
    nnodes = int(g("nnodes") or 1)
    node_rank = int(g("node_rank") or 0)
    host = g("host") or "127.0.0.1"
    port = int(g("port") or 30000)
    dist_host = dist_port = None
    if g("dist_init_addr"):
        h, _, p = str(g("dist_init_addr")).rpartition(":")
        dist_host, dist_port = (h.strip("[]") or "127.0.0.1"), int(p)
    context_len = int(g("context_length") or knobs.model_context_length)
    a["context_length"] = context_len

    explicit = {t.split("=", 1)[0] for t in argv if t.startswith("--")}
    hybrid = knobs.hybrid
    if hybrid is None:
        hybrid = bool(g("max_mamba_cache_size")) or "--mamba-full-memory-ratio" in explicit \
            or bool(_HYBRID_NAME_RE.search(model_path))
    # The performance model (perf.py): the pool follows --mem-fraction-static when given (SGLang's derived
    # default is taken as the reference fraction), and for a hybrid model an explicit mamba ratio splits it.
    mem_fraction = g("mem_fraction_static")
    mamba_ratio = g("mamba_full_memory_ratio") if hybrid and "--mamba-full-memory-ratio" in explicit \
        and not g("max_mamba_cache_size") else None
    kv_dtype = str(g("kv_cache_dtype") or "auto")
    pool = perf.kv_pool_tokens(knobs, mem_fraction, kv_dtype, mamba_ratio)
    requested_total = _parse_tokens(g("max_total_tokens"))
    max_total = pool if requested_total is None else min(requested_total, pool)

    spec, draft_tokens = _speculative(a)

    requested_mrr = int(g("max_running_requests") or knobs.default_max_running_requests)
    mrr = max(1, min(requested_mrr, max(1, max_total) // 2))
    mamba_capped = False
    mamba_cache_size = 0
    if hybrid:
        mrr, mamba_capped, mamba_cache_size = _mamba_cap(g("max_mamba_cache_size"), knobs, mamba_ratio, mrr)
    a["max_running_requests"] = mrr
    chunked = int(g("chunked_prefill_size") or 8192)
    a["chunked_prefill_size"] = chunked
    max_prefill = int(g("max_prefill_tokens") or 16384)
    a["max_prefill_tokens"] = max_prefill
    if a.get("mem_fraction_static") is None:
        a["mem_fraction_static"] = knobs.kv_ref_mem_fraction
    kv = kv_dtype
    decode_interval = int(g("decode_log_interval") or 40)
    dist_timeout = g("dist_timeout")
    return Resolved(
        version=version, args=a, argv=list(argv), tp_size=tp_size, nnodes=nnodes, node_rank=node_rank,
        host=host, port=port, dist_host=dist_host, dist_port=dist_port, served_model_name=served,
        model_path=model_path, context_len=context_len, max_total_num_tokens=max_total,
        max_running_requests=mrr, requested_max_running_requests=requested_mrr, mamba_capped=mamba_capped,
        mamba_cache_size=mamba_cache_size, hybrid=hybrid, chunked_prefill_size=chunked,
        max_prefill_tokens=max_prefill, max_req_input_len=max(0, min(context_len - 1, max_total - 1) - 5),
        spec_algorithm=spec, num_draft_tokens=int(draft_tokens) if spec else 1,
        draft_model_path=g("speculative_draft_model_path"), kv_dtype=kv,
        reasoning_parser=g("reasoning_parser"), api_key=g("api_key"), enable_metrics=bool(g("enable_metrics")),
        decode_log_interval=max(1, decode_interval),
        dist_timeout=float(dist_timeout) if dist_timeout else None,
        extras={"mrr_given": mrr_given, "boot_oom": perf.boot_oom(knobs, mem_fraction),
                "weights_do_not_fit": pool <= 0})


def torch_dtype(kv_dtype: str) -> str:
    return _TORCH_DTYPES.get(kv_dtype, f"torch.{kv_dtype}")


def server_args_repr(args: dict[str, Any], version: str = "0.5.16") -> str:
    """What follows ``server_args=`` in the log: the dataclass repr ``ServerArgs(model_path='...', tp_size=2, ...)``
    up to 0.5.16 (the captured Spark log), a dict ``{'model_path': '...', ...}`` on 0.5.23 (the real engine's log
    on CPU); versions in between are not known either way and print the older form."""
    first = [k for k in ("model_path", "tokenizer_path") if k in args]   # SGLang's dataclass starts with these
    items = [(k, args[k]) for k in first] + [(k, v) for k, v in args.items() if k not in first]
    if _version_tuple(version) >= (0, 5, 23):
        return repr(dict(items))
    return "ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in items) + ")"


def _version_tuple(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit()) if not part.isdigit() else part
        out.append(int(digits or 0))
    return tuple(out)
