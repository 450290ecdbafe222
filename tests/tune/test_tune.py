"""`sparkctl tune` on the embedded cluster with a planted optimum: it finds it, refuses the OOM candidate,
promotes nothing when every candidate lies within the noise, restores what ran before, and resumes after a
kill -9 without redoing finished trials (and promotes the optimum then), refuses a candidate whose G6 sample
diverges. Each asserts what tune measured against the emulator's planted timing (a promotion, or none), so this
module is a TIMING_MODULE (tests/conftest.py: run alone, after the others); tune's refusals, budget and settling of
a dead tune, whose outcome no timing moves, are test_tune_settle.py."""
from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from testrig.controller import active_profile, killed_at

WORK = ("--runs", "3", "--max-tokens", "161", "--warmup", "0")


def test_tune_finds_the_planted_optimum_and_refuses_the_oom_candidate(cli, tune_cluster, profiles_dir):
    code, out, err = cli("up", "--profile", "t5-off", "--yes", "--json")
    assert code == 0, err
    before = json.loads(out)["deployment"]

    code, out, err = cli("tune", "--profile", "t5", "--vary", "speculative.num_draft_tokens=4,6",
                         "--vary", "server.mem_fraction_static=0.88,0.95", *WORK, "--json")
    assert code == 0, err
    data = json.loads(out)
    trials = data["trials"]
    assert [t["changes"] for t in trials[1:]] == [
        {"speculative.num_draft_tokens": d, "server.mem_fraction_static": f} for d in (4, 6) for f in (0.88, 0.95)]
    oom = [t for t in trials if t["changes"].get("server.mem_fraction_static") == 0.95]
    assert all(t["status"] == "infeasible" and t["reason"] == "oom" for t in oom), oom
    feasible = {t["changes"].get("speculative.num_draft_tokens", 8): t["objective"]["median"]
                for t in trials if t["status"] == "feasible"}
    assert set(feasible) == {4, 6, 8} and max(feasible, key=lambda d: feasible[d]) == 6, feasible
    # every trial that booted took its G6 sample: the baseline's is the reference, each candidate identical to it
    assert trials[0]["g6"]["verdict"] == "reference" and len(trials[0]["g6_outputs"]) == 2
    assert all(t["g6"]["verdict"] == "identical" and t["g6"]["n"] == 2 for t in trials[1:] if t["status"] == "feasible")
    # infeasible trials were recorded and the search went on: the trial after the first OOM was measured
    assert trials[3]["status"] == "feasible" and trials[3]["card"]

    conf = data["confirmation"]
    assert conf["order"] == ["baseline", "winner", "baseline", "winner"] and conf["verdict"] == "better"
    w = data["winner"]
    assert w["promoted"] and w["changes"] == {"speculative.num_draft_tokens": 6}
    text = Path(w["path"]).read_text()
    assert Path(w["path"]).parent == profiles_dir and data["run_id"] in text.splitlines()[0]
    doc = yaml.safe_load(text)
    assert doc["extends"] == "t5" and doc["speculative"] == {"num_draft_tokens": 6}
    assert set(doc) == {"description", "extends", "speculative"}           # only the changed keys
    code, out, err = cli("render", "--profile", w["profile"], "--json")
    assert code == 0 and "--speculative-num-draft-tokens" in out

    # the deployment that ran before is back, the marker is gone, an estimate was made after the first trial
    assert data["restore"]["ok"] and active_profile(cli) == "t5-off"
    assert data["original"] == before
    e, tm = data["estimate"], data["timing"]
    assert e["after_trial_s"] == trials[0]["elapsed_s"] and e["trials"] == 5 and tm["total_s"] >= tm["trials_sum_s"]
    code, table, err = cli("tune", "--resume", data["run_id"])
    assert code == 2 and "already finished" in err
    # every trial's card is in the card index
    code, out, err = cli("bench", "history", "--json")
    cards = {r["run_id"] for r in json.loads(out)["cards"]}
    assert {t["card"] for t in trials if t["card"]} <= cards


def test_tune_promotes_nothing_when_all_lie_within_noise(cli, tune_cluster, profiles_dir):
    # max_total_tokens 100000 still resolves the pool's 64,832 tokens: the same engine, the same speed;
    # 20000 resolves 20,000 < d5's expect.min_max_total_num_tokens 32,768: the capacity gate refuses it
    code, out, err = cli("tune", "--profile", "t5", "--vary", "server.max_total_tokens=20000,100000", *WORK, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert [t["status"] for t in data["trials"]] == ["feasible", "infeasible", "feasible"]
    assert data["trials"][1]["reason"] == "capacity below expect", data["trials"][1]
    assert data["confirmation"]["candidate"] == 2
    assert data["confirmation"]["verdict"] == "within noise", data["confirmation"]["comparison"]
    assert data["winner"]["promoted"] is False and "noise band" in data["winner"]["why"]
    assert list(profiles_dir.glob("t5-tuned-*")) == []
    assert data["original"] is None and data["restore"] == {"ok": True, "action": "down", "serving": None,
                                                          "serving_deployment": None}    # read back: nothing runs


def test_kill_9_then_resume_redoes_no_finished_trial(cli, tune_cluster, state_dir):
    code, out, err = cli("up", "--profile", "t5-off", "--yes", "--json")
    assert code == 0, err
    killed_at("tune:trial@1:after", "tune", "--profile", "t5", "--vary", "speculative.num_draft_tokens=4,6", *WORK,
                    "--confirm-rounds", "1")
    (marker_path,) = list(state_dir.glob("*/tune.json"))
    marker = json.loads(marker_path.read_text())
    journal = json.loads((marker_path.parent / "runs" / marker["run"] / "tune.json").read_text())
    assert [t["status"] for t in journal["trials"]] == ["feasible", "feasible", "pending"]
    done = {t["index"]: (t["deployment"], t["card"]) for t in journal["trials"][:2]}

    code, out, err = cli("tune", "--resume", marker["run"], "--json")
    assert code == 0, err
    data = json.loads(out)
    assert "2 of 3 trials already done" in err
    assert {t["index"]: (t["deployment"], t["card"]) for t in data["trials"][:2]} == done   # not redone
    assert data["trials"][2]["status"] == "feasible" and data["winner"]["promoted"]
    assert data["restore"]["ok"] and active_profile(cli) == "t5-off" and not marker_path.exists()


def test_a_candidate_whose_g6_sample_diverges_is_infeasible(cli, tune_cluster, state_dir):
    # the candidate whose engine sees SPARKCTL_SIM_DIVERGENCE={"*":3} departs from the target's greedy output at
    # completion token 3 of every prompt when speculation is on (sim/decoding.py): its G6 sample differs from the
    # baseline's; the candidate with {} (no divergence) is the same engine as the baseline
    code, out, err = cli("tune", "--profile", "t5", "--vary", 'env.SPARKCTL_SIM_DIVERGENCE={},{"*":3}', *WORK,
                         "--confirm-rounds", "1", "--json")
    assert code == 0, err
    data = json.loads(out)
    base, same, lossy = data["trials"]
    assert lossy["changes"] == {"env.SPARKCTL_SIM_DIVERGENCE": '{"*":3}'}
    assert base["g6"]["verdict"] == "reference" and same["g6"]["verdict"] == "identical"
    assert same["status"] == "feasible" and lossy["status"] == "infeasible" and lossy["reason"] == "G6 failed"
    g = lossy["g6"]
    assert g["verdict"] == "diverged" and g["diverged"] == 2 and g["reference"] == "baseline trial 0"
    assert [v["index"] for v in g["verdicts"]] == [3, 3], g["verdicts"]
    assert "0/2 identical to the baseline" in lossy["error"]
    assert all(0 < t["g6"]["elapsed_s"] < t["elapsed_s"] for t in data["trials"])
    assert lossy["objective"] is not None        # measured, and still refused: speed never buys losslessness
    assert data["confirmation"]["candidate"] == 1
    # `tune --json` prints the journal tune() returns as its model: what runs/<id>/tune.json holds
    (journal_file,) = list(state_dir.glob(f"*/runs/{data['run_id']}/tune.json"))
    assert json.loads(journal_file.read_text()) == data

    # the table of this journal: plain text off a terminal, rich on one; the refused trial shows its reason
    import io

    from sparkctl.state.tunejournal import TuneJournal
    from sparkctl.tune.table import render, trial_table
    journal = TuneJournal.model_validate(data)
    plain = trial_table(journal)
    lines = plain.splitlines()
    assert lines[0].split()[:3] == ["#", "changes", "status"] and "\x1b[" not in plain
    row = next(x for x in lines if x.startswith("2 "))
    assert "infeasible" in row and "diverged 0/2" in row and "G6 failed: G6 sample: 0/2 identical" in row
    assert "reference" in lines[1] and "identical 2/2" in next(x for x in lines if x.startswith("1 "))
    piped = io.StringIO()
    render(journal, piped)                             # a StringIO is no terminal: the plain table
    assert piped.getvalue() == plain
    tty = io.StringIO()
    render(journal, tty, terminal=True, width=220)
    out = tty.getvalue()
    assert "\x1b[" in out and ("\u2503" in out or "\u2502" in out)    # ANSI styles and the box drawing
    assert data["run_id"] in out and "G6 failed: G6 sample: 0/2 identical" in out
    assert "nothing promoted" in out and "restored:" in out
    assert [ln for ln in out.splitlines() if "G6 failed" in ln][0].count("infeasible") == 1
    if os.environ.get("SPARKCTL_SHOW_TABLE"):
        print(out, json.dumps({t["index"]: [t["g6"]["elapsed_s"], t["elapsed_s"]] for t in data["trials"]}))
