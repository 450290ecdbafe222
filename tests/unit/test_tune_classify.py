"""Why a tune candidate is infeasible is read from the lifecycle's typed error (the verify gates it names), never
from an engine's spelling of a number: SGLang's ``max_total_num_tokens`` and vLLM's KV cache size in tokens both
fail the gate called ``capacity``. Generated over every set of failing gates and both engines' evidence."""
from __future__ import annotations

import itertools

import pytest

from sparkctl.deploy.apply import gates_failed
from sparkctl.errors import BenchError, DeployError, PreflightError
from sparkctl.state.records import GateResult
from sparkctl.state.runs import AcceptanceResult, GenerateAcceptance
from sparkctl.tune.run import classify_failure

GATES = ("health", "models", "settings", "capacity", "workers", "smoke")
# The capacity gate's evidence as each engine's names make it (sparkctl.engines.resolved_capacity).
CAPACITY_EVIDENCE = {
    "sglang": "max_total_num_tokens=40960 < expected 65536 (max_total_num_tokens=40960, max_running_requests=8)",
    "vllm": "kv_cache_size_tokens=131072 < expected 262144 (kv_cache_size_tokens=131072, "
            "kv_cache_max_concurrency=32.0)",
    "future": "cache_blocks=12 < expected 99 (cache_blocks=12, slots=None)",
}


@pytest.mark.parametrize("engine", sorted(CAPACITY_EVIDENCE))
@pytest.mark.parametrize("failed", [set(c) for n in range(1, len(GATES) + 1)
                                    for c in itertools.combinations(GATES, n)], ids=lambda s: "+".join(sorted(s)))
def test_a_verify_failure_is_classified_by_the_gates_it_names(engine: str, failed: set[str]) -> None:
    gates = [GateResult(name=g, ok=False, evidence=CAPACITY_EVIDENCE[engine] if g == "capacity" else f"{g} failed")
             for g in GATES if g in failed]
    exc = gates_failed(gates).amended(message="verify gate(s) failed; restored dep-1")   # as apply re-raises it
    assert exc.failed_gates == tuple(g for g in GATES if g in failed)
    want = "capacity below expect" if failed == {"capacity"} else "gates failed"
    assert classify_failure(exc) == want


def test_the_other_failures_by_type() -> None:
    assert classify_failure(PreflightError("port 30000 held", where="spark-a")) == "preflight failed"
    assert classify_failure(BenchError("2 measurement(s) failed", where="bench")) == "bench failed"
    assert classify_failure(DeployError("boot failed on rank 1 (spark-b) after 3.0s: exit code: -9")) == "oom"
    assert classify_failure(DeployError("boot failed on rank 0 (spark-a) after 9.1s: bad flag")) == "no boot"
    # the engine's fatal line, by its kind: SGLang's CUDA OOM, vLLM's refused memory budget; not its wording
    for kind in ("oom", "memory_budget"):
        assert classify_failure(DeployError("boot failed on rank 1 (spark-b) after 2.3s: ValueError",
                                            failure_kind=kind)) == "oom"
    for other in ("config_error", "nccl_error", "traceback", None):
        assert classify_failure(DeployError("boot failed on rank 1 (spark-b) after 2.3s: ValueError",
                                            failure_kind=other)) == "no boot"
    # a gate's name in free text is not a gate failure
    assert classify_failure(DeployError("warm-up request 1/1 failed: the smoke gate said capacity")) == "no boot"


def test_accept_len_is_the_engines_own_figure() -> None:
    sglang = AcceptanceResult(speculative_algorithm="DFLASH", draft_tokens=6, sglang_version="0.5.23",
                              generate=GenerateAcceptance(
                                  source="/generate", prompt="code", per_request=[2.9, 3.1, 3.3],
                                  accept_len={"median": 3.1, "min": 2.9, "max": 3.3, "n": 3}, meta=[], error=None,
                                  note=None))
    assert sglang.accept_len() == 3.1
    vllm = AcceptanceResult(speculative_algorithm="ngram", draft_tokens=4, sglang_version="0.32.0", engine="vllm",
                            counters={"mean_acceptance_length": 3.0385, "drafts": 26.0})
    assert vllm.accept_len() == 3.0385
    none = AcceptanceResult(speculative_algorithm=None, draft_tokens=None, sglang_version="0.32.0", engine="vllm",
                            counters={"note": "no drafts counted during the code runs",
                                      "mean_acceptance_length": None})
    assert none.accept_len() is None
