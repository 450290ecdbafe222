"""Read what an SGLang rank prints: boot milestones, capacity, scheduler stats, fatal errors.

Pure functions over strings, no I/O: one line in, one event out (`parse_line`), and what the
scheduler measured (`decode_stats`); the boot state machine that follows a rank's log with them is
`sparkctl.sglang.bootwatch` (`LogFollower.classify`). Every pattern here is anchored on text found in
real captured logs (tests/fixtures/captures/) or in SGLang's own source (the wheel), in
both dialects: 0.5.3.post3 (``Decode batch.``) and 0.5.1x-0.5.23 (``Decode batch,``).

Rules kept on purpose:
* A failure is reported only when an error line was actually printed. A log that stops
  (operator stop, hang, slow JIT) is STUCK with its last milestone and last line, not FAILED.
* Multi-rank logs print the same start-up line once per TP rank; pool lists keep only the
  rank that printed first, so counts are per engine, not per GPU.
"""
from __future__ import annotations

import ast
import enum
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sparkctl.jsontypes import JSONObject

__all__ = [
    "EventKind", "FATAL_KINDS", "LogEvent", "clean_line", "split_segments", "parse_line",
    "parse_server_args", "parse_batch_fields", "DecodeStats", "decode_stats", "parse_segment", "STAT_KINDS",
    "LogDialect", "SGLANG_LOG", "match_fatal", "literal",
]


class EventKind(enum.Enum):
    """What a recognised log line means. Milestones first, then scheduler stats, then fatal kinds."""

    SERVER_ARGS = "server_args"
    NCCL_VERSION = "nccl_version"
    SPANS_ACROSS_NODES = "spans_across_nodes"
    LOAD_WEIGHT_BEGIN = "load_weight_begin"
    WEIGHTS_LOADED = "weights_loaded"
    KV_ALLOCATED = "kv_allocated"
    MAMBA_ALLOCATED = "mamba_allocated"
    MAMBA_CAP_WARNING = "mamba_cap_warning"
    CUDA_GRAPH_BEGIN = "cuda_graph_begin"
    CUDA_GRAPH_END = "cuda_graph_end"
    CAPACITY = "capacity"
    WORKER_DUMMY_HEALTH = "worker_dummy_health"
    READY = "ready"
    SHUTDOWN = "shutdown"
    PREFILL_BATCH = "prefill_batch"
    DECODE_BATCH = "decode_batch"
    # fatal kinds
    OOM = "oom"
    NCCL_ERROR = "nccl_error"
    NCCL_WATCHDOG_TIMEOUT = "nccl_watchdog_timeout"
    SCHEDULER_EXCEPTION = "scheduler_exception"
    TRACEBACK = "traceback"
    # added for vLLM (sparkctl/vllm/logparse.py); SGLang's parser never produces them
    HEADLESS = "headless"                      # milestone: a headless (node rank > 0) vLLM rank started its executor
    ENGINE_STATS = "engine_stats"              # stat: vLLM's periodic "Engine 000: Avg prompt throughput: ..." line
    SPEC_DECODE_STATS = "spec_decode_stats"    # stat: vLLM's periodic "SpecDecoding metrics: ..." line
    CONFIG_ERROR = "config_error"              # fatal: the engine refused its configuration (pydantic ValidationError)
    MEMORY_BUDGET = "memory_budget"            # fatal: the engine's own memory check refused the KV cache budget
    ENGINE_CONFIG = "engine_config"            # milestone: vLLM's EngineCore printed the config it resolved

    @property
    def fatal(self) -> bool:
        return self in FATAL_KINDS



FATAL_KINDS = frozenset({EventKind.OOM, EventKind.NCCL_ERROR, EventKind.NCCL_WATCHDOG_TIMEOUT,
                         EventKind.SCHEDULER_EXCEPTION, EventKind.TRACEBACK, EventKind.CONFIG_ERROR,
                         EventKind.MEMORY_BUDGET})
STAT_KINDS = frozenset({EventKind.PREFILL_BATCH, EventKind.DECODE_BATCH, EventKind.ENGINE_STATS,
                        EventKind.SPEC_DECODE_STATS})


@dataclass(frozen=True)
class LogEvent:
    """One recognised line: its kind, log timestamp, rank tags (``("TP0", "EP0")``) and parsed fields."""

    kind: EventKind
    line: str                       # the cleaned line (no ANSI codes, no \r, no newline)
    message: str                    # the line without its ``[date time TPn]`` prefix
    ts: datetime | None = None
    ranks: tuple[str, ...] = ()
    fields: JSONObject = field(default_factory=dict)

    @property
    def fatal(self) -> bool:
        return self.kind in FATAL_KINDS


# --------------------------------------------------------------------------- line cleaning

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_PREFIX_RE = re.compile(
    r"^\s*\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?P<tags>(?:\s+[A-Z]{2,4}\d+)*)\]\s?")


def clean_line(raw: str) -> str:
    """Drop ANSI colour codes and the line terminator; keep inner spacing as printed."""
    return _ANSI_RE.sub("", raw).rstrip("\r\n")


def split_segments(raw: str) -> list[str]:
    """Split a physical line on ``\\r`` (tqdm redraws) into cleaned, non-blank segments."""
    return [s for s in (clean_line(p) for p in raw.rstrip("\r\n").split("\r")) if s.strip()]


def _split_prefix(line: str) -> tuple[datetime | None, tuple[str, ...], str]:
    m = _PREFIX_RE.match(line)
    if not m:
        return None, (), line.strip()
    ts = datetime.strptime(m.group("ts"), "%Y-%m-%d %H:%M:%S")
    return ts, tuple(m.group("tags").split()), line[m.end():].strip()


# --------------------------------------------------------------------------- patterns

def _num(s: str) -> int | float:
    return int(s) if re.fullmatch(r"-?\d+", s) else float(s)


_LOAD_END_RE = re.compile(r"^Load weight end\b")
_LOAD_BEGIN_RE = re.compile(r"^Load weight begin\b")
_KV_RE = re.compile(
    r"(?P<name>[\w ]*?Cache) is allocated\.\s+(?:dtype: (?P<dtype>[\w.]+),\s+)?#tokens: (?P<tokens>\d+),\s+"
    r"(?:K size: (?P<k>[\d.]+) GB,\s+V size: (?P<v>[\d.]+) GB|KV size: (?P<kv>[\d.]+) GB)")
_MAMBA_RE = re.compile(
    r"Mamba Cache is allocated\.\s+max_mamba_cache_size: (?P<size>\d+)"
    r"(?:,\s+conv_state size: (?P<conv>[\d.]+)\s*GB)?(?:,\s+ssm_state size: (?P<ssm>[\d.]+)\s*GB)?")
# Format string from sglang 0.5.23 srt/mem_cache/kv_cache_configurator.py (logger.warning).
_MAMBA_CAP_RE = re.compile(
    r"max_running_requests is capped to (?P<cap>\d+) by the mamba state cache"
    r"(?: \(max_mamba_cache_size=(?P<size>\d+), (?P<slots>\d+) state slots per request\))?")
_CAPACITY_RE = re.compile(r"^max_total_num_tokens=\d+")
_KV_PAIR_RE = re.compile(r"(\w+)=(-?[\d.]+)(?:\s*GB)?")
_READY_RE = re.compile(r"The server is fired up and ready to roll!")
_DUMMY_RE = re.compile(r"Dummy health check server started in background thread at (?P<addr>\S+)")
_SPANS_RE = re.compile(r"(?P<who>[\w ]+?) is disabled because this process group spans across nodes")
_NCCL_VER_RE = re.compile(r"sglang is using nccl==(?P<version>[\w.+-]+)")
_BATCH_RE = re.compile(r"^(?P<which>Prefill|Decode) batch(?: \[(?P<iter>\d+)\])?(?P<sep>[.,])\s+(?P<body>.*)$")
# SGLang 0.5.16 (captures/sglang/spark-1node-dflash-...) prints the dataclass repr ``server_args=ServerArgs(...)``;
# 0.5.23 prints a dict, ``server_args={'model_path': ..., ...}`` (the real engine's log on CPU:
# tests/fixtures/real-engine/0.5.23/tp1/server.log). Both are read.
_SERVER_ARGS_RE = re.compile(r"server_args=(?:ServerArgs\((?P<body>.*)\)|(?P<dict>\{.*\}))\s*$")
_GRAPH_RE = re.compile(r"^Capture\b.*?\bcuda graph (?P<what>begin|end)\b", re.IGNORECASE)
_SHUTDOWN_RE = re.compile(r"SIGTERM received")

_WATCHDOG_RE = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
    r"[^)]*?Timeout\(ms\)=(?P<timeout>\d+)\)(?: ran for (?P<ran>\d+) milliseconds)?")
_DIED_INIT_RE = re.compile(r"Rank (?P<rank>\d+) scheduler died during initialization \(exit code: (?P<code>-?\d+)\)")
_EXIT_CODE_RE = re.compile(r"^Exit code: (?P<code>-?\d+)\s*$", re.IGNORECASE)
_CUDA_OOM_RE = re.compile(r"CUDA out of memory|OutOfMemoryError")
_SCHED_EXC_RE = re.compile(r"Scheduler hit an exception")
_SCHED_DEAD_RE = re.compile(r"Rank (?P<rank>\d+) scheduler is dead")
_NCCL_ERR_RE = re.compile(r"NCCL WARN|NCCL error|DistBackendError")
_NCCL_PEER_RE = re.compile(r"(?:connect to|from peer) (?P<peer>[0-9A-Fa-f:.]+)<(?P<port>\d+)>")
_NCCL_HCA_RE = re.compile(r"\bhca (?P<hca>\w+)")
_NCCL_SRC_RE = re.compile(r"(?P<src>[\w/]+\.cc:\d+) NCCL WARN")
_TRACEBACK_RE = re.compile(r"^Traceback \(most recent call last\):")
_EXC_LINE_RE = re.compile(r"^(?P<exc>[A-Za-z_][\w.:]*(?:Error|Exception|Interrupt))(?::\s*(?P<msg>.*))?$")


def parse_batch_fields(body: str) -> JSONObject:
    """``#running-req: 1, accept len: 2.75, cuda graph: True, ...`` -> {key: int|float|bool|str}.

    Generic on purpose: SGLang adds and renames fields between releases (``#token`` vs
    ``#full token``/``#swa token``, ``cap len``...); the caller picks what it knows.
    """
    out: JSONObject = {}
    for part in body.split(", "):
        key, sep, value = part.partition(": ")
        if not sep:
            continue
        value = value.strip().rstrip(",")
        if value in ("True", "False"):
            out[key.strip()] = value == "True"
        else:
            try:
                out[key.strip()] = _num(value)
            except ValueError:
                out[key.strip()] = value
    return out


def _batch_event_fields(kind: EventKind, m: re.Match[str]) -> JSONObject:
    raw = parse_batch_fields(m.group("body"))
    f: JSONObject = {"dialect": "period" if m.group("sep") == "." else "comma", "raw": raw}
    names = {
        "#running-req": "running_req", "#queue-req": "queue_req", "token usage": "token_usage",
        "full token usage": "token_usage", "accept len": "accept_len", "accept rate": "accept_rate",
        "cuda graph": "cuda_graph", "gen throughput (token/s)": "gen_throughput",
        "input throughput (token/s)": "input_throughput", "#new-seq": "new_seq",
        "#new-token": "new_token", "#cached-token": "cached_token", "#pending-token": "pending_token",
    }
    for key, name in names.items():
        if key in raw and name not in f:
            f[name] = raw[key]
    if "#token" in raw:
        f["tokens"] = raw["#token"]
    elif "#full token" in raw:
        f["tokens"] = raw["#full token"]
    return f


def _split_top_level(body: str) -> list[str]:
    """Split ``a=1, b='x, y', c=[1, 2]`` on commas outside quotes and brackets."""
    parts, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(body):
        ch = body[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
        i += 1
    parts.append(body[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_server_args(line_or_body: str) -> JSONObject:
    """Parse the ``server_args=ServerArgs(...)`` repr (or 0.5.23's ``server_args={...}`` dict) into a dict of
    top-level fields.

    Python literals (str, int, float, None, bool, lists, dicts) become values; anything
    else (nested dataclass reprs, enums) is kept as its printed text.
    """
    m = _SERVER_ARGS_RE.search(line_or_body)
    text = m.group("dict") if m and m.group("dict") else line_or_body.strip() if not m else None
    if text is not None and text.startswith("{"):
        value = _literal(text)
        return {k: v for k, v in value.items() if isinstance(k, str)} if isinstance(value, dict) else {}
    body = m.group("body") if m else line_or_body
    out: JSONObject = {}
    for part in _split_top_level(body):
        key, sep, value = part.partition("=")
        if not sep or not key.isidentifier():
            continue
        out[key] = _literal(value)
    return out


# CPython 3.11's ast module keeps its AST-to-object recursion counter in interpreter-wide state, so
# two threads in ast.parse / literal_eval at once can fail with "SystemError: AST constructor
# recursion depth mismatch" (CPython gh-106905). Replicas boot in parallel threads, each parsing its
# ranks' server_args, so every literal_eval in sparkctl goes through this one lock. Values are engine
# log text: longer than _LITERAL_MAX or nested past the parser's limit, they stay text.
_AST_LOCK = threading.Lock()
_LITERAL_MAX = 64 * 1024


def _literal(value: str) -> Any:
    """A Python literal read from ``value`` (str, number, None, bool, list, tuple, dict), else the text."""
    if len(value) > _LITERAL_MAX:
        return value
    with _AST_LOCK:
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
            return value


SERVER_ARGS_KEYS = ("model_path", "served_model_name", "tp_size", "nnodes", "node_rank", "dist_init_addr",
                    "speculative_algorithm", "speculative_draft_model_path", "speculative_num_draft_tokens",
                    "speculative_num_steps", "speculative_eagle_topk", "kv_cache_dtype", "mem_fraction_static",
                    "context_length", "max_running_requests", "max_total_tokens", "chunked_prefill_size")


# --------------------------------------------------------------------------- parse_line

def _match_milestone(msg: str) -> tuple[EventKind, JSONObject] | None:
    if m := _BATCH_RE.match(msg):
        kind = EventKind.PREFILL_BATCH if m.group("which") == "Prefill" else EventKind.DECODE_BATCH
        return kind, _batch_event_fields(kind, m)
    if _LOAD_END_RE.match(msg):
        f: JSONObject = {}
        for key, rx in (("elapsed_s", r"elapsed=([\d.]+) s"), ("avail_mem_gb", r"avail mem=([\d.]+) GB"),
                        ("mem_usage_gb", r"mem usage=([\d.]+) GB")):
            if mm := re.search(rx, msg):
                f[key] = float(mm.group(1))
        if mm := re.search(r"type=(\w+)", msg):
            f["type"] = mm.group(1)
        return EventKind.WEIGHTS_LOADED, f
    if _LOAD_BEGIN_RE.match(msg):
        mm = re.search(r"avail mem=([\d.]+) GB", msg)
        return EventKind.LOAD_WEIGHT_BEGIN, {"avail_mem_gb": float(mm.group(1))} if mm else {}
    if m := _MAMBA_RE.search(msg):
        f = {"max_mamba_cache_size": int(m.group("size"))}
        if m.group("conv"):
            f["conv_state_gb"] = float(m.group("conv"))
        if m.group("ssm"):
            f["ssm_state_gb"] = float(m.group("ssm"))
        return EventKind.MAMBA_ALLOCATED, f
    if m := _KV_RE.search(msg):
        f = {"name": m.group("name").strip(), "dtype": m.group("dtype"), "tokens": int(m.group("tokens"))}
        if m.group("kv") is not None:
            f["kv_size_gb"] = float(m.group("kv"))
        else:
            f["k_size_gb"], f["v_size_gb"] = float(m.group("k")), float(m.group("v"))
        return EventKind.KV_ALLOCATED, f
    if _CAPACITY_RE.match(msg):
        return EventKind.CAPACITY, {k: _num(v) for k, v in _KV_PAIR_RE.findall(msg)}
    if m := _MAMBA_CAP_RE.search(msg):
        f = {"max_running_requests": int(m.group("cap"))}
        if m.group("size"):
            f["max_mamba_cache_size"], f["state_slots_per_request"] = int(m.group("size")), int(m.group("slots"))
        return EventKind.MAMBA_CAP_WARNING, f
    if _READY_RE.search(msg):
        return EventKind.READY, {}
    if m := _DUMMY_RE.search(msg):
        return EventKind.WORKER_DUMMY_HEALTH, {"address": m.group("addr")}
    if m := _SPANS_RE.search(msg):
        who = m.group("who").strip()
        return EventKind.SPANS_ACROSS_NODES, {"who": who, "wording": "new" if who == "CustomAllreduce" else "old"}
    if m := _NCCL_VER_RE.search(msg):
        return EventKind.NCCL_VERSION, {"version": m.group("version")}
    if m := _SERVER_ARGS_RE.search(msg):
        args = parse_server_args(m.group(0))
        return EventKind.SERVER_ARGS, {"args": args, **{k: args[k] for k in SERVER_ARGS_KEYS if k in args}}
    if m := _GRAPH_RE.match(msg):
        return (EventKind.CUDA_GRAPH_BEGIN if m.group("what").lower() == "begin" else EventKind.CUDA_GRAPH_END), {}
    if _SHUTDOWN_RE.search(msg):
        return EventKind.SHUTDOWN, {}
    return None


def _match_fatal(line: str, msg: str) -> tuple[EventKind, JSONObject] | None:
    if m := _WATCHDOG_RE.search(line):   # also inside an indented C++ ``what():`` line
        f = {"seqnum": int(m.group("seq")), "optype": m.group("op"), "timeout_ms": int(m.group("timeout"))}
        if m.group("ran"):
            f["ran_for_ms"] = int(m.group("ran"))
        return EventKind.NCCL_WATCHDOG_TIMEOUT, f
    if re.match(r"^\s{4}", line) and not _PREFIX_RE.match(line):
        return None  # source lines and carets inside a Python traceback: not the error itself
    f = {}
    if m := _EXC_LINE_RE.match(msg):
        f["exception"] = msg
    if m := _DIED_INIT_RE.search(msg):
        code = int(m.group("code"))
        f.update(exit_code=code, rank=int(m.group("rank")))
        if code == -9:
            return EventKind.OOM, {**f, "cause": "sigkill (exit code -9): OS OOM-killer likely"}
        return EventKind.SCHEDULER_EXCEPTION, f
    if m := _EXIT_CODE_RE.match(msg):
        code = int(m.group("code"))
        if code == -9:
            return EventKind.OOM, {"exit_code": code, "cause": "sigkill (exit code -9): OS OOM-killer likely"}
        return EventKind.SCHEDULER_EXCEPTION, {"exit_code": code}
    if _CUDA_OOM_RE.search(msg):
        return EventKind.OOM, {**f, "cause": "CUDA out of memory"}
    if msg == "Killed":
        return EventKind.OOM, {"cause": "process killed (SIGKILL; OOM-killer likely)", "weak": True}
    if _SCHED_EXC_RE.search(msg):
        return EventKind.SCHEDULER_EXCEPTION, f
    if m := _SCHED_DEAD_RE.search(msg):
        return EventKind.SCHEDULER_EXCEPTION, {"rank": int(m.group("rank"))}
    if _NCCL_ERR_RE.search(msg):
        if m := _NCCL_PEER_RE.search(msg):
            f.update(peer=m.group("peer"), peer_port=int(m.group("port")))
        if m := _NCCL_HCA_RE.search(msg):
            f["hca"] = m.group("hca")
        if m := _NCCL_SRC_RE.search(msg):
            f["source"] = m.group("src")
        return EventKind.NCCL_ERROR, f
    if _TRACEBACK_RE.match(msg) or "exception" in f:
        return EventKind.TRACEBACK, f
    return None


def parse_segment(seg: str) -> LogEvent | None:
    ts, ranks, msg = _split_prefix(seg)
    hit = _match_milestone(msg) or _match_fatal(seg, msg)
    if hit is None:
        return None
    kind, fields = hit
    return LogEvent(kind=kind, line=seg, message=msg, ts=ts, ranks=ranks, fields=fields)


# Shared with the other engines' parsers (sparkctl/vllm/logparse.py): the engine-neutral error lines (Python
# tracebacks and exception lines, CUDA OOM, NCCL, the watchdog) and Python literals read under the one AST lock.
match_fatal = _match_fatal
literal = _literal


def _as_is(text: str) -> str:
    return text


@dataclass(frozen=True)
class LogDialect:
    """How one engine's log is read by `sparkctl.sglang.bootwatch.LogFollower`.

    `parse_segment`: one cleaned segment -> an event. `worker_ready`: the milestones that, all seen (and no READY),
    make a rank WORKER_READY (a node rank > 0 with no HTTP server). `display`: applied to every line the follower keeps
    for display (last line, tail, failure context): SGLang's keeps lines as printed, vLLM's escapes control characters.
    """

    engine: str
    parse_segment: Callable[[str], LogEvent | None]
    worker_ready: frozenset[EventKind]
    worker_detail: str
    ready_detail: str
    display: Callable[[str], str] = _as_is


def parse_line(line: str) -> LogEvent | None:
    """Recognise one printed line (any SGLang dialect); None when it carries nothing sparkctl uses.

    Tolerates the ``[date time TP0 EP0] `` prefix, ANSI colours and ``\\r``-joined tqdm redraws
    (the last recognised segment wins).
    """
    found = None
    for seg in split_segments(line):
        found = parse_segment(seg) or found
    return found


# --------------------------------------------------------------------------- decode stats

class DecodeStats:
    """Running summary of ``Decode batch`` lines (both dialects).

    Acceptance ranges count only active decode (``#running-req >= 1``). ``gen throughput`` is
    the scheduler's instantaneous gauge: report its peak as a gauge, never as the result.
    """

    def __init__(self) -> None:
        self.batches = 0
        self.active_batches = 0
        self.accept_len: list[float] = []
        self.accept_rate: list[float] = []
        self.peak_gen_throughput: float | None = None
        self.max_running_req: int | None = None
        self.dialects: set[str] = set()

    def add(self, ev: LogEvent) -> None:
        if ev.kind is not EventKind.DECODE_BATCH:
            return
        f = ev.fields
        self.batches += 1
        self.dialects.add(f["dialect"])
        running = f.get("running_req")
        if isinstance(running, int):
            self.max_running_req = running if self.max_running_req is None else max(self.max_running_req, running)
        gen = f.get("gen_throughput")
        if isinstance(gen, (int, float)):
            self.peak_gen_throughput = gen if self.peak_gen_throughput is None else max(self.peak_gen_throughput, gen)
        if isinstance(running, int) and running >= 1:
            self.active_batches += 1
            if "accept_len" in f:
                self.accept_len.append(float(f["accept_len"]))
            if "accept_rate" in f:
                self.accept_rate.append(float(f["accept_rate"]))

    def as_dict(self) -> JSONObject:
        def rng(xs: list[float]) -> tuple[float, float] | None:
            return (min(xs), max(xs)) if xs else None
        return {
            "batches": self.batches,
            "active_batches": self.active_batches,
            "accept_len": rng(self.accept_len),
            "accept_rate": rng(self.accept_rate),
            "peak_gen_throughput": self.peak_gen_throughput,
            "max_running_req": self.max_running_req,
            "dialects": sorted(self.dialects),
        }


def decode_stats(lines: Iterable[str]) -> JSONObject:
    """Summarise scheduler decode lines: accept len/rate (min, max) during active decode,
    peak gen-throughput gauge, batch counts, and max ``#running-req`` (1 everywhere under
    concurrency means the server serialised the requests)."""
    stats = DecodeStats()
    for line in lines:
        for seg in split_segments(line):
            ev = parse_segment(seg)
            if ev is not None:
                stats.add(ev)
    return stats.as_dict()


SGLANG_LOG = LogDialect(engine="sglang", parse_segment=parse_segment,
                        worker_ready=frozenset({EventKind.WORKER_DUMMY_HEALTH}),
                        worker_detail="worker rank serving dummy health", ready_detail="server fired up")
