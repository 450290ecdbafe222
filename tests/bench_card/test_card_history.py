"""Card history and diff: the index over real cards from bench runs on the embedded cluster, and the noise rule.

The embedded test runs two tiny benches (decode only) on two deployments that differ in one flag, then reads
them back through `sparkctl bench history` and `sparkctl bench diff`; the pure tests check the verdict rule and
the index's robustness on card JSON saved from such runs (tests/bench_card/cards/).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from sparkctl.bench.diff import FLOOR, compare_summaries, diff_entries
from sparkctl.state.cards import SCHEMA, CardIndex, card_entry, changes
from sparkctl.state.ledger import Ledger

CARDS = Path(__file__).with_name("cards")
BENCH = ("bench", "--gates", "decode", "--runs", "3", "--max-tokens", "41", "--warmup", "0", "--json")


def _s(median: float, lo: float, hi: float, n: int = 5) -> dict:
    return {"n": n, "median": median, "min": lo, "max": hi, "spread": (hi - lo) / median, "samples": []}


# ------------------------------------------------------------------------------------------- embedded

def test_history_and_diff_of_real_cards(cli, embedded_cluster, profiles_dir, state_dir, tmp_path):
    (profiles_dir / "d5-dt6.yml").write_text("extends: d5\nspeculative:\n  num_draft_tokens: 6\n")
    runs = []
    for prof in ("d5", "d5-dt6"):
        code, out, err = cli("up", "--profile", prof, "--yes", "--json")
        assert code == 0, err
        code, out, err = cli(*BENCH)
        assert code == 0, err
        runs.append(json.loads(out))
    a, b = (r["run_id"] for r in runs)

    code, out, err = cli("bench", "history", "--json")
    assert code == 0, err
    h = json.loads(out)
    assert [r["run_id"] for r in h["cards"]] == [a, b]
    assert h["cards"][0]["first"] and h["cards"][1]["changed"]
    assert "speculative.num_draft_tokens 8 -> 6" in h["cards"][1]["changed"]
    assert "profile d5 -> d5-dt6" in h["cards"][1]["changed"]
    for row, run in zip(h["cards"], runs):
        code_arm = run["arms"][0]["results"]["decode"]["classes"]["code"]["decode_tok_s"]
        assert row["on"]["decode"]["code"]["median"] == code_arm["median"]      # the card's own figure
    svg = Path(h["chart"]).read_text()
    assert svg.startswith("<svg") and "stroke-dasharray=\"3,3\"" in svg and "EMULATED" in svg
    assert oct(os.stat(Path(h["index"])).st_mode & 0o777) == "0o600"

    code, out, err = cli("bench", "history", "--profile", "d5-dt6", "--json")
    assert [r["run_id"] for r in json.loads(out)["cards"]] == [b]
    code, table, err = cli("bench", "history")
    assert code == 0 and a in table and b in table and "first card" in table and "num_draft_tokens 8 -> 6" in table

    code, out, err = cli("bench", "diff", a, b[:len(b) - 1], "--json")    # a unique prefix names a card too
    assert code == 0, err
    d = json.loads(out)
    (arm,) = d["arms"]
    assert arm["role"] == "ON" and set(arm["metrics"]) == {"decode.code", "decode.prose"}
    for name, m in arm["metrics"].items():
        ca = h["cards"][0]["on"]["decode"][name.split(".")[1]]
        cb = h["cards"][1]["on"]["decode"][name.split(".")[1]]
        band = max((ca["max"] - ca["min"]) / 2 + (cb["max"] - cb["min"]) / 2, FLOOR * ca["median"])
        assert m["band"] == pytest.approx(band, abs=1e-3) and m["verdict"] in ("better", "worse", "within noise")
        assert m["delta"] == pytest.approx(cb["median"] - ca["median"], abs=1e-3)
    assert {"what": "flag", "key": "speculative.num_draft_tokens", "a": 8, "b": 6} in arm["changed"]
    code, text, err = cli("bench", "diff", a, b)
    assert code == 0 and "decode.code" in text and "changed: " in text and "EMULATED" in text

    code, out, err = cli("bench", "diff", a, "no-such-run")
    assert code == 2 and "no card 'no-such-run'" in err and "bench history" in err

    # Save these real cards for the pure tests when asked (SPARKCTL_SAVE_CARDS=1): tests/bench_card/cards/.
    if os.environ.get("SPARKCTL_SAVE_CARDS"):
        CARDS.mkdir(exist_ok=True)
        for name, run in zip(("d5", "d5-dt6"), runs):
            shutil.copy(run["files"]["json"], CARDS / f"{name}.json")


# ----------------------------------------------------------------------------------------------- pure

@pytest.mark.parametrize("a,b,lower,verdict", [
    (_s(100, 99, 101), _s(110, 109, 111), False, "better"),
    (_s(100, 99, 101), _s(90, 89, 91), False, "worse"),
    (_s(100, 95, 105), _s(104, 99, 109), False, "within noise"),      # ranges overlap: band 10 > delta 4
    (_s(100, 100, 100), _s(100.5, 100.5, 100.5), False, "within noise"),   # 1% floor
    (_s(2.0, 1.98, 2.02), _s(1.5, 1.49, 1.51), True, "better"),        # TTFT: lower is better
    (_s(2.0, 1.98, 2.02), _s(2.5, 2.49, 2.51), True, "worse"),
])
def test_verdict_only_beyond_the_band(a, b, lower, verdict):
    m = compare_summaries(a, b, lower_is_better=lower)
    assert m["verdict"] == verdict
    assert m["band"] == pytest.approx(max((a["max"] - a["min"]) / 2 + (b["max"] - b["min"]) / 2, FLOOR * a["median"]))


def test_single_sample_band_says_so():
    m = compare_summaries(_s(30.2, 30.2, 30.2, n=1), _s(29.4, 29.4, 29.4, n=1))
    assert m["verdict"] == "worse" and "n=1" in m["band_basis"] and "floor" in m["band_basis"]


def _saved() -> tuple[dict, dict]:
    if not (CARDS / "d5.json").exists():
        pytest.skip("no saved cards")
    return json.loads((CARDS / "d5.json").read_text()), json.loads((CARDS / "d5-dt6.json").read_text())


def test_saved_cards_diff_names_the_change_and_every_metric():
    ca, cb = _saved()
    a, b = card_entry(ca, CARDS / "d5.json"), card_entry(cb, CARDS / "d5-dt6.json")
    assert a["profiles"] == ["d5"] and b["profiles"] == ["d5-dt6"] and a["patch_series"] == ["gb10-0.5.23"]
    d = diff_entries(a, b)
    (arm,) = d["arms"]
    assert set(arm["metrics"]) == {"decode.code", "decode.prose"}
    assert [c for c in arm["changed"] if c["what"] == "flag"] == [
        {"what": "flag", "key": "speculative.num_draft_tokens", "a": 8, "b": 6}]
    assert changes(a["arms"][0], a["arms"][0]) == []
    same = diff_entries(a, a)["arms"][0]["metrics"]
    assert all(m["verdict"] == "within noise" and m["delta"] == 0 for m in same.values())


def test_index_rebuilds_from_the_cards_and_skips_a_damaged_one(tmp_path):
    ca, cb = _saved()
    ledger = Ledger(tmp_path / "cluster")
    for card in (ca, cb):
        d = ledger.run_dir(card["run_id"])
        (d / "report.json").write_text(json.dumps(card))
    bad = ledger.run_dir("20990101T000000Z-bench-x-0000")
    (bad / "report.json").write_text("{not json")
    idx = CardIndex(ledger)
    assert [e["run_id"] for e in idx.query()] == [ca["run_id"], cb["run_id"]]
    assert len(idx.skipped) == 1 and "not readable JSON" in idx.skipped[0]
    idx.path.write_text("garbage")                    # a damaged index is derived data: rebuilt, never trusted
    assert [e["run_id"] for e in CardIndex(ledger).query(profile="d5-dt6")] == [cb["run_id"]]
    assert json.loads(idx.path.read_text())["schema"] == SCHEMA
    shutil.rmtree(ledger.root / "runs" / ca["run_id"])       # a card that is gone leaves the index
    assert [e["run_id"] for e in CardIndex(ledger).query()] == [cb["run_id"]]
    assert CardIndex(ledger).query(patch_series="gb10-0.5.23") and not CardIndex(ledger).query(profile="nope")
