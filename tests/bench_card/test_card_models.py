"""The card's measurements are models (`sparkctl.state.records`): cards written before they were load into them, and
dump back to the same ``report.json`` bytes and the same ``report.md`` text.

``cards/today-*.json`` and ``.md`` were written by ``sparkctl.bench.run.bench_endpoint`` on the dict-building code
these models replaced (two emulators from tests/bench_card/conftest.py: every gate with a compare arm and G6, and
the OFF arm alone with a TTFT size beyond its window and a serialised concurrency level). ``cards/d5*.json`` are
older cards (no ``router`` key), saved from embedded-cluster runs.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkctl.bench.card_files import CARD_LINE_LIMIT, write_report
from sparkctl.bench.outcome import failures, scrubbed
from sparkctl.bench.report import render_card
from sparkctl.state.cards import card_entry
from sparkctl.state.ledger import Ledger
from sparkctl.state.runs import (
    AcceptanceResult,
    ArmResults,
    ColdResult,
    ConcurrencyLevel,
    ConcurrencyResult,
    DecodeResult,
    GateFailure,
    RequestRun,
    RunRecord,
    TTFTResult,
)
from sparkctl.untrusted import clean

CARDS = Path(__file__).with_name("cards")
TODAY = ("today-card-all-gates", "today-card-off")


def _report_json(rec: RunRecord) -> str:
    """What `sparkctl.bench.card_files.write_report` writes for a record (no secrets to mask)."""
    return json.dumps(rec.as_json(), indent=2, sort_keys=True, default=str) + "\n"


@pytest.mark.parametrize("name", TODAY)
def test_todays_report_json_loads_into_models_and_dumps_byte_for_byte(name):
    text = (CARDS / f"{name}.json").read_text()
    rec = RunRecord.model_validate(json.loads(text))
    primary = rec.arms[0].results
    assert isinstance(primary.cold, ColdResult) and isinstance(primary.cold.first_request, RequestRun)
    assert isinstance(primary.decode, DecodeResult) and primary.decode.classes
    assert isinstance(primary.ttft, TTFTResult) and isinstance(primary.concurrency, ConcurrencyResult)
    assert all(isinstance(r, RequestRun) for r in primary.warmup or [])
    assert _report_json(rec) == text


@pytest.mark.parametrize("name", TODAY)
def test_the_record_write_report_returns_dumps_as_the_json_it_returned_before(name, tmp_path):
    """The bench returns `write_report`'s record, and `sparkctl bench --json` prints its ``as_json()``: the same
    keys in the same order as the masked JSON it returned before it returned a record, extra keys included."""
    rec = RunRecord.model_validate_json((CARDS / f"{name}.json").read_text())
    rec.errors.append("the server echoed sk-secret-1 and http://u:pw@host:1/v1")
    death = {"rank": 1, "node": "spark-b", "deployment": "d1", "at": "2026-01-01T00:00:09Z", "elapsed_s": 9.0,
             "during": "decode code run 1/3 (sk-secret-1)", "state": "exited", "exit_code": -9, "last_alive": None}
    setattr(rec, "rank_death", death)            # noqa: B010 (an extra key, as the bench sets it when a rank died)
    written = write_report(rec, tmp_path, {"sk-secret-1"})
    before = scrubbed(rec.as_json(), {"sk-secret-1"})          # what write_report returned, and the CLI printed
    assert json.dumps(written.as_json(), indent=2) == json.dumps(before, indent=2)
    assert "sk-secret-1" not in json.dumps(before) and "pw@" not in json.dumps(before)
    assert written.as_json() == json.loads((tmp_path / "report.json").read_text())


@pytest.mark.parametrize("name", TODAY)
def test_todays_card_text_renders_the_same_from_the_model(name):
    rec = RunRecord.model_validate_json((CARDS / f"{name}.json").read_text())
    assert clean(render_card(rec.as_json()), CARD_LINE_LIMIT) == (CARDS / f"{name}.md").read_text()


def test_the_cards_optional_keys_are_written_only_when_measured():
    data = json.loads((CARDS / "today-card-off.json").read_text())
    ttft = data["arms"][0]["results"]["ttft"]
    assert [set(s) - {"target_tokens"} for s in ttft["sizes"]][-1] == {"status", "note"}   # beyond the window
    rec = RunRecord.model_validate(data)
    assert isinstance(rec.arms[0].results.ttft, TTFTResult)
    unmeasurable = rec.arms[0].results.ttft.sizes[-1]
    assert unmeasurable.status == "unmeasurable" and unmeasurable.model_dump() == ttft["sizes"][-1]
    levels = rec.arms[0].results.concurrency
    assert isinstance(levels, ConcurrencyResult)
    assert "serialization" not in levels.levels[0].model_dump()                       # c=1 is never flagged
    assert levels.levels[1].serialization is not None and levels.levels[1].serialization.serialized
    # a level where every request failed: no totals, as the dict-building code wrote it
    failed = ConcurrencyLevel(concurrency=2, requests=[], errors=["ReadTimeout: x"])
    failed.vs_c1 = None
    assert failed.model_dump() == {"concurrency": 2, "requests": [], "errors": ["ReadTimeout: x"], "vs_c1": None}


def test_the_compare_arms_acceptance_and_g6_load_typed():
    rec = RunRecord.model_validate_json((CARDS / "today-card-all-gates.json").read_text())
    on, off = rec.arms
    assert (on.config["role"], off.config["role"]) == ("ON", "OFF")
    assert isinstance(on.results.acceptance, AcceptanceResult) and on.results.acceptance.generate is not None
    assert on.results.acceptance.generate.accept_len is not None
    assert isinstance(off.results.acceptance, AcceptanceResult)
    assert off.results.acceptance.status == "no speculative decoding on this arm"
    assert off.results.ttft is None and off.results.concurrency is None               # primary arm only
    assert rec.comparison["decode"] and rec.g6 is not None
    assert failures(rec) == []


@pytest.mark.parametrize("name", ("d5", "d5-dt6"))
def test_older_cards_still_load_with_the_same_measurements(name):
    data = json.loads((CARDS / f"{name}.json").read_text())
    rec = RunRecord.model_validate(data)
    assert isinstance(rec.arms[0].results.decode, DecodeResult)
    assert rec.as_json()["arms"] == data["arms"]


@pytest.mark.parametrize("name", TODAY)
def test_todays_card_through_the_ledger_and_the_card_index(name, tmp_path):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "report.json").write_text((CARDS / f"{name}.json").read_text())
    rec = Ledger(tmp_path).load_run("r1")
    assert _report_json(rec) == (CARDS / f"{name}.json").read_text()
    entry = card_entry(json.loads((run / "report.json").read_text()), run / "report.json")
    assert entry["arms"][0]["decode"]


def test_a_failed_gate_is_a_gate_failure_and_counted():
    res = ArmResults.model_validate({"decode": {"error": "EndpointError: boom\nmore"}, "ttft": None})
    assert isinstance(res.decode, GateFailure)
    assert res.model_dump() == {"decode": {"error": "EndpointError: boom\nmore"}, "ttft": None}
    rec = RunRecord.model_validate({"schema": "sparkctl.bench/1", "run_id": "r1", "mode": "endpoint",
                                    "started": "2026-01-01T00:00:00Z",
                                    "arms": [{"config": {"name": "a"}, "results": res.model_dump()}]})
    assert failures(rec) == ["a decode: EndpointError: boom"]
