"""sparkctl.sglang.logparse on real captured SGLang logs (tests/fixtures/captures/sglang).

Every expected value below is read from the capture files themselves."""
from __future__ import annotations

import ast
import re
import threading
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.sglang import logparse
from sparkctl.sglang.bootwatch import BootState, LogFollower
from sparkctl.sglang.logparse import (
    EventKind,
    LogEvent,
    clean_line,
    decode_stats,
    parse_line,
    parse_server_args,
    split_segments,
)
from testrig.captures import CUT, capture_lines, capture_names

DFLASH = "sglang/spark-1node-dflash-startup-decode-shutdown.txt"
STOPPED = "sglang/spark-1node-dflash-stopped-at-capture-0of58.txt"
PERIOD = "sglang/decode-batch-old-period-form-eagle3-accept.txt"
WATCHDOG = "sglang/nccl-watchdog-timeout-multinode-2node-tp16.txt"
TERMINATE = "sglang/nccl-watchdog-terminate-dist-backend-error.txt"
WRONG_IF = "sglang/multinode-rank1-nccl-bootstrap-wrong-interface.txt"
SCHED_DEAD = "sglang/multinode-scheduler-exception-rank0-dead.txt"
POSTER_OOM = "sglang/2spark-load-host-oom-scheduler-died-poster-edited.txt"
HANG = "sglang/multinode-hang-before-spans-across-nodes.txt"
RANK0_OK = "sglang/multinode-rank0-startup-spans-across-nodes-ok.txt"
SPARK3_R0 = "sglang/spark-3node-tp3-rank0-dspark-startup-serve.txt"
SPARK3_R2 = "sglang/spark-3node-tp3-rank2-worker-dummy-health.txt"
MAMBA = "sglang/tp2-rtx4090-qwen3.5-mamba-cache-startup-unattributed.txt"


def event(line: str) -> LogEvent:
    """The event `line` is recognised as (the test expects one)."""
    ev = parse_line(line)
    assert ev is not None, line
    return ev


def follow(rel: str) -> LogFollower:
    f = LogFollower()
    for line in capture_lines(rel):
        f.feed(line)
    return f


EXPECTED_VERDICT = {
    DFLASH: (BootState.READY, None),
    STOPPED: (BootState.STUCK, None),
    PERIOD: (BootState.STUCK, None),           # a fragment of scheduler lines only
    WATCHDOG: (BootState.FAILED, EventKind.NCCL_WATCHDOG_TIMEOUT),
    TERMINATE: (BootState.FAILED, EventKind.NCCL_WATCHDOG_TIMEOUT),
    WRONG_IF: (BootState.FAILED, EventKind.NCCL_ERROR),
    SCHED_DEAD: (BootState.FAILED, EventKind.SCHEDULER_EXCEPTION),
    POSTER_OOM: (BootState.FAILED, EventKind.OOM),
    HANG: (BootState.FAILED, EventKind.NCCL_ERROR),
    RANK0_OK: (BootState.READY, None),
    SPARK3_R0: (BootState.READY, None),
    SPARK3_R2: (BootState.WORKER_READY, None),
    MAMBA: (BootState.STUCK, None),            # the excerpt ends at the capacity line
}


def test_every_sglang_capture_is_covered() -> None:
    assert sorted(EXPECTED_VERDICT) == capture_names("sglang")


@pytest.mark.parametrize("rel", sorted(EXPECTED_VERDICT))
def test_every_capture_parses_and_classifies(rel: str) -> None:
    for line in capture_lines(rel):
        parse_line(line)  # never raises, whatever the line
    v = follow(rel).classify()
    assert (v.state, v.kind) == EXPECTED_VERDICT[rel]
    if v.state is BootState.FAILED:
        assert v.first_error_line and v.failure is not None
    else:
        assert v.first_error_line is None


# ----------------------------------------------------------------------------- 0.5.16 DFLASH on a Spark

def test_dflash_capacity_pools_and_milestones() -> None:
    f = follow(DFLASH)
    assert f.capacity == {"max_total_num_tokens": 185897, "chunked_prefill_size": 8192,
                          "max_prefill_tokens": 16384, "max_running_requests": 48, "context_len": 65536,
                          "available_gpu_mem": 6.22}
    assert [(p["tokens"], p["k_size_gb"], p["v_size_gb"]) for p in f.kv_pools] == [
        (148717, 10.21, 10.21), (185897, 4.25, 4.25), (185897, 2.13, 2.13)]
    assert {p["dtype"] for p in f.kv_pools} == {"torch.bfloat16"}
    w = f.milestones[EventKind.WEIGHTS_LOADED]
    assert w.ts == datetime(2026, 8, 1, 23, 39, 39)
    ev = event(w.line)
    assert ev.fields == {"elapsed_s": 109.33, "avail_mem_gb": 47.80, "mem_usage_gb": 67.56,
                         "type": "LagunaForCausalLM"}
    assert f.milestones[EventKind.READY].ts == datetime(2026, 8, 1, 23, 43, 47)
    assert EventKind.SHUTDOWN in f.milestones          # SIGTERM at the end: not an error
    assert f.fatal_events == []


def test_dflash_server_args() -> None:
    line = next(ln for ln in capture_lines(DFLASH) if "server_args=ServerArgs(" in ln)
    ev = event(line)
    assert ev.kind is EventKind.SERVER_ARGS
    assert ev.fields["speculative_algorithm"] == "DFLASH"
    assert ev.fields["tp_size"] == 1           # the top-level field, not a nested tp_size=None
    assert ev.fields["speculative_num_draft_tokens"] == 16
    assert ev.fields["speculative_draft_model_path"] == "poolside/Laguna-S-2.1-DFlash-INT4"
    assert ev.fields["context_length"] == 65536
    assert ev.fields["mem_fraction_static"] == 0.85
    assert ev.fields["model_path"] == "poolside/Laguna-S-2.1-INT4"
    args = parse_server_args(line)
    assert args["speculative_draft_attention_backend"] == "flashinfer"
    assert args["max_total_tokens"] is None
    assert args["cuda_graph_config"].startswith("CudaGraphConfig(")   # non-literal kept as text
    assert args["msprobe_dump_config"] is None                         # the last field


def test_server_args_parse_the_same_from_many_threads_at_once() -> None:
    # Replicas boot in parallel threads and each parses its ranks' server_args: CPython 3.11's
    # literal_eval shares one recursion counter across threads (gh-106905), which failed a CI run
    # with "AST constructor recursion depth mismatch". Every capture's line, 8 threads, same result.
    lines = [ln for name in capture_names("sglang") for ln in capture_lines(name) if "server_args=ServerArgs(" in ln]
    assert lines
    want = [parse_server_args(ln) for ln in lines]
    got: list[object] = []

    def work() -> None:
        try:
            for _ in range(40):
                assert [parse_server_args(ln) for ln in lines] == want
            got.append("ok")
        except BaseException as exc:  # noqa: BLE001 - the failure is the result
            got.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == ["ok"] * 8


@given(st.text(alphabet="([{'\",:=0123456789.eNoTrux -}])", max_size=300))
@settings(max_examples=300, deadline=None)
def test_any_server_args_value_reads_as_a_literal_or_stays_text(value: str) -> None:
    args = parse_server_args(f"server_args=ServerArgs(a={value}, b=1)")
    assert isinstance(args, dict)


def test_values_nested_past_the_parser_or_too_long_stay_text() -> None:
    deep = "[" * 5000 + "]" * 5000
    huge = "[" + ",".join(["1"] * 40000) + "]"
    args = parse_server_args(f"server_args=ServerArgs(deep={deep}, huge={huge}, ok=[1, 2])")
    assert args["deep"] == deep and args["huge"] == huge and args["ok"] == [1, 2]


def test_ast_is_used_only_under_the_lock() -> None:
    # The structural half of the thread-safety fix: the one literal_eval is in _literal, inside
    # `with _AST_LOCK`, and no other sparkctl module reaches for ast.
    root = Path(logparse.__file__).parents[1]
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if re.search(r"^\s*(import ast|from ast )", p.read_text(), re.M))
    assert users == ["sglang/logparse.py"]
    tree = ast.parse(Path(logparse.__file__).read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
             and n.value.id == "ast"]
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_literal")
    locked = [w for w in ast.walk(fn) if isinstance(w, ast.With)
              and any(getattr(i.context_expr, "id", "") == "_AST_LOCK" for i in w.items)]
    assert len(locked) == 1
    inside = {id(n) for n in ast.walk(locked[0])}
    assert calls and all(id(c) in inside for c in calls)


def test_dflash_decode_and_prefill_lines() -> None:
    lines = capture_lines(DFLASH)
    dec = event(next(ln for ln in lines if "Decode batch," in ln))
    assert dec.kind is EventKind.DECODE_BATCH
    f = dec.fields
    assert (f["running_req"], f["tokens"], f["accept_len"], f["accept_rate"], f["cuda_graph"],
            f["gen_throughput"], f["queue_req"], f["dialect"]) == (1, 181, 2.75, 0.12, True, 0.10, 0, "comma")
    assert f["raw"]["#swa token"] == 181
    pre = event(next(ln for ln in lines if "Prefill batch," in ln))
    assert pre.kind is EventKind.PREFILL_BATCH
    assert (pre.fields["new_seq"], pre.fields["new_token"], pre.fields["cached_token"],
            pre.fields["input_throughput"], pre.fields["cuda_graph"]) == (1, 7, 0, 1.81, True)


def test_dflash_decode_stats() -> None:
    s = decode_stats(capture_lines(DFLASH))
    assert s == {"batches": 13, "active_batches": 13, "accept_len": (1.23, 2.90), "accept_rate": (0.01, 0.13),
                 "peak_gen_throughput": 28.93, "max_running_req": 2, "dialects": ["comma"]}
    assert follow(DFLASH).decode.as_dict() == s


def test_ansi_line_is_cleaned() -> None:
    line = capture_lines(DFLASH)[4]
    assert "\x1b[" in line
    assert clean_line(line) == ("'--cuda-graph-max-bs' is deprecated and will be removed in a future release. "
                                "Use '--cuda-graph-max-bs-decode' instead.")
    assert parse_line(line) is None


# ----------------------------------------------------------------------------- stopped, never ready

def test_stopped_at_capture_is_stuck_not_failed() -> None:
    f = follow(STOPPED)
    v = f.classify()
    assert v.state is BootState.STUCK and v.kind is None and v.first_error_line is None
    assert f.fatal_events == [] and f.failure is None
    assert v.last_milestone is EventKind.CUDA_GRAPH_BEGIN
    assert v.last_line == "  warnings.warn('resource_tracker: There appear to be %d '"
    assert EventKind.READY not in f.milestones and f.capacity is None
    assert event(f.milestones[EventKind.WEIGHTS_LOADED].line).fields["elapsed_s"] == 618.01
    assert [p["tokens"] for p in f.kv_pools] == [26397, 32997, 32997]
    assert f.classify(final=False).state is BootState.STARTING


def test_carriage_return_tqdm_lines_split() -> None:
    lines = capture_lines(STOPPED)
    tqdm = next(ln for ln in lines if ln.startswith("\rMulti-thread loading shards:"))
    segs = split_segments(tqdm)
    assert len(segs) > 3 and all(s.startswith("Multi-thread loading shards:") for s in segs)
    assert parse_line(tqdm) is None
    f = LogFollower()
    for line in lines:
        f.feed(line)
    assert f.line_no > len(lines)   # each \r segment counted as a line seen


# ----------------------------------------------------------------------------- old 0.5.3 dialect

def test_period_form_decode_and_prefill() -> None:
    lines = capture_lines(PERIOD)
    pre = event(lines[0])
    assert pre.kind is EventKind.PREFILL_BATCH and pre.fields["dialect"] == "period"
    assert (pre.fields["new_token"], pre.fields["running_req"], pre.fields["queue_req"]) == (28, 0, 0)
    assert pre.ts == datetime(2025, 10, 22, 10, 27, 56) and pre.ranks == ("TP0",)
    dec = event(lines[1])
    assert (dec.fields["tokens"], dec.fields["accept_len"], dec.fields["accept_rate"],
            dec.fields["gen_throughput"], dec.fields["queue_req"]) == (108, 2.17, 0.54, 0.39, 0)
    assert decode_stats(lines) == {"batches": 5, "active_batches": 5, "accept_len": (1.80, 2.17),
                                   "accept_rate": (0.45, 0.54), "peak_gen_throughput": 188.68,
                                   "max_running_req": 1, "dialects": ["period"]}


# ----------------------------------------------------------------------------- NCCL failures

def test_watchdog_timeout_fields() -> None:
    lines = capture_lines(WATCHDOG)
    ev = event(lines[0])
    assert ev.kind is EventKind.NCCL_WATCHDOG_TIMEOUT
    assert ev.fields == {"seqnum": 91885, "optype": "ALLREDUCE", "timeout_ms": 600000, "ran_for_ms": 600037}
    assert lines[1] == "ected all trees" and parse_line(lines[1]) is None   # torn line: tolerated
    f = follow(WATCHDOG)
    assert f.failure is not None
    assert f.failure.fields["seqnum"] == 91885 and f.failure.first_line == lines[0]


def test_terminate_dist_backend_error_refined_to_watchdog() -> None:
    f = follow(TERMINATE)
    fl = f.failure
    assert fl is not None
    assert fl.first_line == "terminate called after throwing an instance of 'c10::DistBackendError'"
    assert fl.first_kind is EventKind.NCCL_ERROR
    assert fl.kind is EventKind.NCCL_WATCHDOG_TIMEOUT
    assert (fl.fields["seqnum"], fl.fields["optype"], fl.fields["timeout_ms"], fl.fields["ran_for_ms"]) == (
        9141, "_ALLGATHER_BASE", 600000, 600020)
    # C++ frames are not errors of their own
    assert all(parse_line(ln) is None for ln in capture_lines(TERMINATE) if ln.startswith("frame #"))


def test_wrong_interface_nccl_warn_peer_and_first_error() -> None:
    lines = capture_lines(WRONG_IF)
    warns = [event(ln) for ln in lines if "NCCL WARN" in ln]
    assert len(warns) == 3
    for ev in warns:
        assert ev.kind is EventKind.NCCL_ERROR
        assert (ev.fields["peer"], ev.fields["peer_port"], ev.fields["source"]) == (
            "10.82.101.249", 54709, "misc/socket.cc:578")
        assert ev.ts == datetime(2026, 2, 25, 16, 33, 59)
    v = follow(WRONG_IF).classify()
    assert v.first_error_line is not None and v.failure is not None
    assert v.first_error_line.endswith(
        "NCCL WARN socketPollConnect: connect to 10.82.101.249<54709> returned Connection refused, "
        "exceeded error retry count after 35 attempts")
    assert v.failure.exception == "RuntimeError: NCCL error: remote process exited or there was a network error"
    assert v.failure.fields["peer"] == "10.82.101.249"
    # the shell's final "Killed" is recorded but does not turn an NCCL failure into an OOM
    assert v.last_line == CUT and lines[-2] == "Killed"
    assert event(lines[-2]).kind is EventKind.OOM
    assert v.kind is EventKind.NCCL_ERROR


def test_hang_segments_by_last_line() -> None:
    lines = capture_lines(HANG)
    good_start = next(i for i, ln in enumerate(lines) if ln.startswith("как это происходит на 3й"))
    bad_start = next(i for i, ln in enumerate(lines) if ln.startswith("как это происходит на 7й"))
    bad_end = next(i for i, ln in enumerate(lines) if i > bad_start and ln == "висит")

    good = LogFollower()
    for ln in lines[good_start:bad_start]:
        good.feed(ln)
    assert EventKind.SPANS_ACROSS_NODES in good.milestones
    assert event(good.milestones[EventKind.SPANS_ACROSS_NODES].line).fields["wording"] == "old"

    bad = LogFollower()
    for ln in lines[bad_start + 1:bad_end]:
        bad.feed(ln)
    v = bad.classify()
    assert v.state is BootState.STUCK
    assert EventKind.SPANS_ACROSS_NODES not in bad.milestones
    assert v.last_milestone is EventKind.NCCL_VERSION and bad.nccl_version == "2.27.5"
    assert v.last_line == "[Gloo] Rank 2 is connected to 15 peer ranks. Expected number of connected peer ranks is : 15"

    whole = follow(HANG).failure
    assert whole is not None
    assert (whole.fields["peer"], whole.fields["peer_port"], whole.fields["hca"]) == ("10.99.91.63", 36473, "mlx5_0")


# ----------------------------------------------------------------------------- scheduler crashes

def test_scheduler_exception_first_error_and_exit_code() -> None:
    lines = capture_lines(SCHED_DEAD)
    first = event(lines[1])          # the paste's first line keeps a 2-space indent
    assert first.kind is EventKind.LOAD_WEIGHT_BEGIN and first.ranks == ("DP1", "TP3", "EP3")
    assert first.fields["avail_mem_gb"] == 77.48
    f = follow(SCHED_DEAD)
    v = f.classify()
    assert v.first_error_line == ("[2026-02-20 11:13:52 DP0 TP1 EP1] Scheduler hit an exception: "
                                  "Traceback (most recent call last):")
    assert v.failure is not None
    assert v.failure.exception == ("ImportError: DeepEP is not installed. Please install DeepEP package from "
                                   "https://github.com/deepseek-ai/deepep.")
    assert v.failure.exit_code == -3
    assert v.last_milestone is EventKind.LOAD_WEIGHT_BEGIN
    assert v.first_error_line in v.failure.context and len(v.failure.context) > 1
    assert "(exit code -3)" in v.detail
    kinds = [e.kind for e in f.fatal_events]
    assert kinds.count(EventKind.SCHEDULER_EXCEPTION) == 3   # hit an exception / is dead / Exit code
    # traceback source lines are never taken for the error itself
    raise_line = next(ln for ln in lines if ln.strip() == "raise ImportError(")
    assert parse_line(raise_line) is None


def test_poster_edited_oom_by_substring_only() -> None:
    v = follow(POSTER_OOM).classify()
    assert v.state is BootState.FAILED and v.kind is EventKind.OOM
    assert v.failure is not None and v.first_error_line is not None
    assert v.failure.exit_code == -9
    assert "scheduler died during initialization" in v.first_error_line


# ----------------------------------------------------------------------------- multi-node starts

def test_multinode_rank0_old_wording_and_dedup() -> None:
    f = follow(RANK0_OK)
    assert f.classify().state is BootState.READY
    spans = event(f.milestones[EventKind.SPANS_ACROSS_NODES].line)
    assert spans.fields == {"who": "Custom allreduce", "wording": "old"}
    assert f.kv_pools == [{"name": "KV Cache", "dtype": None, "tokens": 326265, "kv_size_gb": 21.35}]
    assert f.capacity == {"max_total_num_tokens": 326265, "chunked_prefill_size": 8192, "max_prefill_tokens": 16384,
                          "max_running_requests": 128, "context_len": 163840, "available_gpu_mem": 14.40}


def test_spark_3node_rank0() -> None:
    f = follow(SPARK3_R0)
    assert f.nccl_version == "2.30.7"
    spans = event(f.milestones[EventKind.SPANS_ACROSS_NODES].line)
    assert spans.fields["wording"] == "new" and spans.ranks == ("TP0", "EP0")
    assert f.capacity == {"max_total_num_tokens": 2999808, "chunked_prefill_size": 1024, "max_prefill_tokens": 16384,
                          "max_running_requests": 4, "context_len": 1048576, "available_gpu_mem": 7.68}
    assert f.decode.as_dict()["accept_len"] == (3.08, 3.08)
    assert f.decode.as_dict()["accept_rate"] == (0.41, 0.41)
    assert f.milestones[EventKind.READY].ts == datetime(2026, 9, 11, 23, 47, 9)


def test_spark_3node_rank2_worker_ready() -> None:
    f = follow(SPARK3_R2)
    v = f.classify()
    assert v.state is BootState.WORKER_READY
    assert f.worker_health_address == "0.0.0.0:8888"
    assert f.capacity is None and EventKind.READY not in f.milestones
    assert EventKind.SPANS_ACROSS_NODES in f.milestones and EventKind.WEIGHTS_LOADED in f.milestones


def test_mamba_cache_and_per_rank_dedup() -> None:
    f = follow(MAMBA)
    assert f.mamba_pools == [{"max_mamba_cache_size": 186, "conv_state_gb": 0.10, "ssm_state_gb": 4.38}]
    assert f.kv_pools == [{"name": "KV Cache", "dtype": None, "tokens": 327310, "k_size_gb": 2.50, "v_size_gb": 2.50}]
    assert f.capacity is not None
    assert f.capacity["max_running_requests"] == 62 and f.capacity["context_len"] == 262144
    assert f.nccl_version == "2.27.5"
    assert f.milestones[EventKind.MAMBA_ALLOCATED].ts == datetime(2026, 4, 14, 16, 8, 49)
    # "Setup Custom allreduce failed with CUDART error" is a warning, not a failure
    assert f.failure is None


def test_mamba_cap_warning_from_sglang_format_string() -> None:
    # No raw capture of this warning exists (captures/README "wanted but not found"). This is
    # SGLang 0.5.23's own format string, copied verbatim from
    # sglang/srt/mem_cache/kv_cache_configurator.py (logger.warning in the mamba cap branch),
    # rendered with %-formatting exactly as logging does.
    fmt = ("max_running_requests is capped to %d by the mamba state "
           "cache (max_mamba_cache_size=%d, %d state slots per "
           "request). To raise it: increase --mamba-full-memory-ratio "
           "or --max-mamba-cache-size, or halve the state size with "
           "--mamba-ssm-dtype bfloat16.")
    ev = event(fmt % (1, 186, 2))
    assert ev.kind is EventKind.MAMBA_CAP_WARNING
    assert ev.fields == {"max_running_requests": 1, "max_mamba_cache_size": 186, "state_slots_per_request": 2}


# ---- the real engine's own log (SGLang 0.5.23 on CPU, tests/fixtures/real-engine/0.5.23: testrig/realengine) ----
REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real-engine" / "0.5.23"


def _kinds(path: Path) -> list[str]:
    events = [logparse.parse_line(line) for line in path.read_text().splitlines()]
    return [e.kind.name for e in events if e is not None]


@pytest.mark.parametrize("log", ["tp1/server.log", "tp2/server-rank0.log"])
def test_real_rank0_log_gives_every_milestone_boot_follows(log):
    kinds = _kinds(REAL / log)
    order = ["SERVER_ARGS", "WEIGHTS_LOADED", "KV_ALLOCATED", "CAPACITY", "READY"]
    assert [k for k in kinds if k in order] == order, kinds
    assert "PREFILL_BATCH" in kinds and "DECODE_BATCH" in kinds


def test_real_rank1_log_gives_the_dummy_health_server():
    assert "WORKER_DUMMY_HEALTH" in _kinds(REAL / "tp2" / "rank1" / "server-rank1.log")


def test_real_0523_server_args_is_a_dict_and_parses_like_the_0516_repr():
    line = next(ln for ln in (REAL / "tp1" / "server.log").read_text().splitlines() if "server_args=" in ln)
    assert "server_args={'model_path': " in line         # 0.5.23's spelling; 0.5.16 printed ServerArgs(...)
    args = logparse.parse_server_args(line)
    assert args["tp_size"] == 1 and args["device"] == "cpu" and args["max_total_tokens"] == 16384
    event = logparse.parse_line(line)
    assert event is not None
    assert event.fields["context_length"] == 1024 and event.fields["speculative_algorithm"] is None
    old = logparse.parse_server_args("server_args=ServerArgs(model_path='/m', tp_size=2, device='cpu')")
    assert old == {"model_path": "/m", "tp_size": 2, "device": "cpu"}


def test_api_key_redacted_in_both_spellings_of_server_args():
    from sparkctl.redaction import redact
    assert redact("server_args={'model_path': '/m', 'api_key': 'k-unknown', 'admin_api_key': None}", ()) == \
        "server_args={'model_path': '/m', 'api_key': '***', 'admin_api_key': None}"
    assert redact("server_args=ServerArgs(api_key='k-unknown', port=1)", ()) == \
        "server_args=ServerArgs(api_key='***', port=1)"
