"""The doctor's catalogue (sparkctl/sglang/signatures.py), each signature on a real line: a capture under
tests/fixtures/captures/ as it was printed, or a message exactly as it was published (operations.md's table, SGLang
0.5.23's source). No line here is written by this project. Clean boot logs match nothing; hostile text never crashes
the matcher and never comes back raw."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sparkctl.sglang.findings import EVIDENCE_CHARS, EVIDENCE_LINES, LogText, match_sources, match_text, printable
from sparkctl.sglang.signatures import CATALOGUE, by_id
from testrig.captures import capture_lines, capture_text

OPERATIONS = Path("/work/shared/reference/operations.md")

# Messages as published: operations.md's failure-signature table (quoted between backticks there, verbatim here)
# and SGLang 0.5.23's own source (the wheel's python files; the string literal as the code holds it).
PUBLISHED: dict[str, tuple[str, str]] = {
    "vllm-free-memory-below-utilization": (
        "operations.md", "Free memory on device cuda:0 (.../121.63 GiB) on startup is less than desired GPU memory "
                         "utilization"),
    "nvrm-no-memory": ("operations.md", "NVRM ... Out of memory [NV_ERR_NO_MEMORY]"),
    "nccl-qp-or-system-error": ("operations.md", "ibv_modify_qp failed with 110"),
    "moe-shared-memory-sm121": ("operations.md", "OutOfResources: shared memory, Required: 147456, Hardware limit: "
                                                 "101376"),
    "sglang-memory-unbalanced": ("operations.md", "RuntimeError: The memory capacity is unbalanced"),
    "deepgemm-no-sm121-kernel": ("operations.md", "Failed to open ... sm121_fp8_mqa_logits.cuh"),
    "image-newer-than-driver": ("operations.md", "container was built for NVIDIA Driver Release 590.48 ... 580.x "
                                                 "detected"),
    "cutlass-fp4-sm121": ("operations.md", "Failed to initialize cutlass TMA WS grouped gemm"),
    # sglang 0.5.23 python/sglang/srt/model_executor/pool_configurator.py, ModelRunnerPoolConfig.__post_init__:
    #   msg = "Not enough memory. Please try to increase --mem-fraction-static."
    "sglang-kv-pool-no-memory": ("sglang-0.5.23", "Not enough memory. Please try to increase --mem-fraction-static."),
    # sglang 0.5.23 python/sglang/srt/model_executor/model_runner_components/load_model_utils.py,
    # dist_barrier_after_load (raised as ValueError on the rank that reached the barrier; here with tp_rank=1, the
    # line CI printed in issue 31):
    #   f"TP rank {tp_rank} could finish the model loading, but there are other ranks that didn't finish loading.
    #   It is likely due to unexpected failures (e.g., OOM) or a slow node."
    "sglang-rank-did-not-finish-loading": (
        "sglang-0.5.23", "ValueError: TP rank 1 could finish the model loading, but there are other ranks that "
                         "didn't finish loading. It is likely due to unexpected failures (e.g., OOM) or a slow node."),
}
# The other spelling operations.md gives for the same row ("NCCL `unhandled system error`").
PUBLISHED_ALSO = {"nccl-qp-or-system-error": "unhandled system error",
                  # sglang 0.5.23 python/sglang/srt/distributed/bootstrap.py, _check_tp_memory_balance:
                  #   msg = "The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
                  "sglang-memory-unbalanced": "The memory capacity is unbalanced. Some GPUs may be occupied by other "
                                              "processes. ",
                  # the same f-string as printed by rank 0 (the rank that enforces the 480 s barrier timeout)
                  "sglang-rank-did-not-finish-loading": "TP rank 0 could finish the model loading, but there are "
                                                        "other ranks that didn't finish loading. It is likely due to "
                                                        "unexpected failures (e.g., OOM) or a slow node."}

# Captures: (file, a line of it exactly as printed, found by its line number in the file).
CAPTURED: dict[str, tuple[str, str]] = {
    "host-oom-killed-at-load": ("sglang/2spark-load-host-oom-scheduler-died-poster-edited.txt",
                                "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9)."),
    "nccl-bootstrap-connect-failed": ("sglang/multinode-rank1-nccl-bootstrap-wrong-interface.txt",
                                      "NCCL WARN socketPollConnect: connect to 10.82.101.249<54709> returned "
                                      "Connection refused"),
    "nccl-remote-exited": ("sglang/multinode-rank1-nccl-bootstrap-wrong-interface.txt",
                           "RuntimeError: NCCL error: remote process exited or there was a network error"),
    "nccl-watchdog-timeout": ("sglang/nccl-watchdog-timeout-multinode-2node-tp16.txt",
                              "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=91885"),
    "nccl-ib-completion-error": ("sglang/multinode-hang-before-spans-across-nodes.txt",
                                 "NCCL WARN NET/IB: Got completion from peer 10.99.91.63<36473> with status=4"),
    "cuda-graph-capture-stalled": ("sglang/spark-1node-dflash-stopped-at-capture-0of58.txt",
                                   "| 0/58 [00:00<?, ?it/s]"),
    "deepep-not-installed": ("sglang/multinode-scheduler-exception-rank0-dead.txt",
                             "ImportError: DeepEP is not installed."),
}

CLEAN_BOOTS = ["sglang/spark-1node-dflash-startup-decode-shutdown.txt",
               "sglang/spark-3node-tp3-rank0-dspark-startup-serve.txt",
               "sglang/spark-3node-tp3-rank2-worker-dummy-health.txt",
               "sglang/multinode-rank0-startup-spans-across-nodes-ok.txt",
               "sglang/decode-batch-old-period-form-eagle3-accept.txt",
               "sglang/tp2-rtx4090-qwen3.5-mamba-cache-startup-unattributed.txt"]


def test_every_signature_has_a_real_or_published_line_here():
    ids = [s.id for s in CATALOGUE]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(PUBLISHED) | set(CAPTURED)
    for sig in CATALOGUE:
        assert sig.cause and sig.fix and sig.source, sig.id


@pytest.mark.skipif(not OPERATIONS.is_file(), reason="the shared reference is not on this machine")
def test_the_published_quotes_are_the_tables_own_words():
    table = OPERATIONS.read_text(encoding="utf-8")
    for sid, (where, line) in PUBLISHED.items():
        if where == "operations.md":
            assert line in table, sid
    assert "`unhandled system error`" in table


@pytest.mark.parametrize("sid", sorted(PUBLISHED))
def test_signature_on_its_published_message(sid):
    _, line = PUBLISHED[sid]
    found = match_text(line, "published")
    assert [f.signature for f in found] == [sid]
    assert found[0].evidence[0].text == line.strip() and found[0].source == by_id(sid).source
    also = PUBLISHED_ALSO.get(sid)
    if also:
        assert [f.signature for f in match_text(also)] == [sid]


@pytest.mark.parametrize("sid", sorted(CAPTURED))
def test_signature_on_its_capture(sid):
    rel, fragment = CAPTURED[sid]
    lines = capture_lines(rel)
    printed = [ln for ln in lines if fragment in ln]
    assert printed, f"{fragment!r} is not in {rel}"        # the fragment locates a real line, never replaces it
    found = {f.signature: f for f in match_text(capture_text(rel), rel)}
    assert sid in found
    assert any(fragment in e.text for e in found[sid].evidence)
    assert all(e.source == rel and e.line >= 1 for e in found[sid].evidence)


def test_each_failure_capture_names_its_own_causes_and_nothing_else():
    got = {rel: [f.signature for f in match_text(capture_text(rel))] for rel in (
        "sglang/multinode-rank1-nccl-bootstrap-wrong-interface.txt",
        "sglang/spark-1node-dflash-stopped-at-capture-0of58.txt",
        "sglang/2spark-load-host-oom-scheduler-died-poster-edited.txt",
        "sglang/nccl-watchdog-terminate-dist-backend-error.txt")}
    assert got == {
        "sglang/multinode-rank1-nccl-bootstrap-wrong-interface.txt": ["nccl-bootstrap-connect-failed",
                                                                       "nccl-remote-exited"],
        "sglang/spark-1node-dflash-stopped-at-capture-0of58.txt": ["cuda-graph-capture-stalled"],
        "sglang/2spark-load-host-oom-scheduler-died-poster-edited.txt": ["host-oom-killed-at-load"],
        "sglang/nccl-watchdog-terminate-dist-backend-error.txt": ["nccl-watchdog-timeout"]}


@pytest.mark.parametrize("rel", CLEAN_BOOTS)
def test_clean_boot_logs_match_nothing(rel):
    # these boots went through CUDA-graph capture (0/N, then on) and came up: the stall signature is cancelled
    assert match_text(capture_text(rel), rel) == []


def test_spark_host_captures_match_nothing():
    root = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "spark"
    texts = [LogText(p.name, capture_text(f"spark/{p.name}")) for p in sorted(root.glob("*.txt"))]
    assert len(texts) >= 10 and match_sources(texts) == []


def test_evidence_is_bounded_and_deduplicated_across_sources():
    rel = "sglang/multinode-rank1-nccl-bootstrap-wrong-interface.txt"
    text = capture_text(rel)
    # the same log read twice (a rank log and the failure record holding its tail): each line once
    found = match_sources([LogText("rank 1", text), LogText("failure record", text)])
    f = next(f for f in found if f.signature == "nccl-bootstrap-connect-failed")
    assert f.matches == 3 and [e.source for e in f.evidence] == ["rank 1"] * 3
    f = next(x for x in match_sources([LogText(f"r{i}", text.replace("35 attempts", f"{i} attempts"))
                                       for i in range(10)]) if x.signature == "nccl-bootstrap-connect-failed")
    assert len(f.evidence) == EVIDENCE_LINES and f.matches > EVIDENCE_LINES


def test_summaries_add_evidence_only_where_no_log_showed_it():
    wrong = capture_text("sglang/multinode-rank1-nccl-bootstrap-wrong-interface.txt")
    oom = capture_text("sglang/2spark-load-host-oom-scheduler-died-poster-edited.txt")
    found = {f.signature: f for f in match_sources([LogText("rank 1", wrong),
                                                    LogText("failure record", wrong + "\n" + oom, secondary=True)])}
    assert {e.source for e in found["nccl-bootstrap-connect-failed"].evidence} == {"rank 1"}
    assert {e.source for e in found["host-oom-killed-at-load"].evidence} == {"failure record"}   # the log was gone


# ------------------------------------------------------------------------------------------------- hostile
PUBLISHED_LINE = PUBLISHED["sglang-kv-pool-no-memory"][1]


def test_a_one_megabyte_line_is_cut_and_matched_quickly():
    huge = PUBLISHED_LINE + "x" * (1024 * 1024)
    t0 = time.monotonic()
    found = match_text(huge + "\n" + "y" * (1024 * 1024) + PUBLISHED_LINE)  # the 2nd: past the scan window
    assert time.monotonic() - t0 < 5
    assert [f.signature for f in found] == ["sglang-kv-pool-no-memory"] and found[0].matches == 1
    ev = found[0].evidence[0].text
    assert len(ev) < EVIDENCE_CHARS + 60 and ev.endswith("more characters]")


def test_escape_sequences_and_binary_never_reach_the_output_raw():
    hostile = ("\x1b]0;owned\x07\x1b[2J" + PUBLISHED_LINE + "\x00\x08\u202egnp.exe\x1bP+q\x1b\\\r\n").encode() \
        + os.urandom(4096) + b"\n\xff\xfe" + PUBLISHED["nvrm-no-memory"][1].encode() + b"\x9b31m\n"
    found = match_text(hostile.decode("utf-8", "replace"), "rank 0 \x1b[31m[spark-a]")
    assert {f.signature for f in found} >= {"sglang-kv-pool-no-memory", "nvrm-no-memory"}
    for f in found:
        for e in f.evidence:
            for s in (e.text, e.source):
                assert all(c.isprintable() for c in s), s
                assert "\x1b" not in s and "\u202e" not in s
    assert "\\x1b" in found[0].evidence[0].source


def test_printable_escapes_controls_and_cuts():
    assert printable("a\tb\x1b[0m\u202e") == "a\\tb\\x1b[0m\\u202e"
    assert printable("z" * 400).endswith("... [100 more characters]")
    assert match_text("") == [] and match_text("\n\r\r\n\x00") == []


REAL_ENGINE = Path(__file__).resolve().parents[1] / "fixtures" / "real-engine" / "0.5.23" / "tp2-slow-rank"


def test_the_slow_rank_line_as_the_real_engine_printed_it():
    """SGLang 0.5.23 itself, TP=2 on this CPU, rank 0 failing at load (tests/fixtures/real-engine/0.5.23/README.md):
    rank 1's log is recognised by the line SGLang printed there; rank 0's log, which holds the cause, is not called
    a slow rank."""
    rank1 = (REAL_ENGINE / "rank1.log").read_text(encoding="utf-8")
    found = {f.signature: f for f in match_text(rank1, "rank1.log")}
    assert "sglang-rank-did-not-finish-loading" in found, sorted(found)
    ev = found["sglang-rank-did-not-finish-loading"].evidence[0]
    assert ev.text.startswith("ValueError: TP rank 1 could finish the model loading") and ev.line == 71
    rank0 = (REAL_ENGINE / "rank0.log").read_text(encoding="utf-8")
    assert "sglang-rank-did-not-finish-loading" not in {f.signature for f in match_text(rank0, "rank0.log")}
