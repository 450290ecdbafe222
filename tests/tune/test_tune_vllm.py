"""`sparkctl tune` on vLLM: the same search, gates and A/B promotion over vLLM's envelope, on the emulator's vLLM
dialect (sparkctl/sim/vllm_*.py, held to real vLLM 0.32.0 by tests/sim/test_sim_vs_real_vllm.py) with the planted
optimum of conftest.py (`vllm_tune_cluster`): speculative.num_draft_tokens is vLLM's num_speculative_tokens + 1 in
its --speculative-config, server.mem_fraction_static its --gpu-memory-utilization (above 0.92 the emulated host
refuses the boot). Each trial's accept length is vLLM's own (1 + accepted / drafts from its /metrics counters) and
what ran before is restored; a candidate below `expect` refused by the gate called capacity is test_tune_settle.py's
(no timing in it). A TIMING_MODULE (tests/conftest.py): the promotion depends on measured decode. The same tune on
the real vLLM was measured by hand, not in CI (each real trial is a minute of boot on a 2-core machine)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from testrig.controller import active_profile

WORK = ("--runs", "3", "--max-tokens", "161", "--warmup", "0")


def test_tune_on_vllm_finds_the_planted_optimum_through_vllms_own_flags(cli, vllm_tune_cluster, profiles_dir):
    code, out, err = cli("up", "--profile", "tv-off", "--yes", "--json")
    assert code == 0, err
    before = json.loads(out)["deployment"]

    code, out, err = cli("tune", "--profile", "tv", "--vary", "speculative.num_draft_tokens=4,6",
                         "--vary", "server.mem_fraction_static=0.88,0.95", *WORK, "--json")
    assert code == 0, err
    data = json.loads(out)
    trials = data["trials"]
    assert [t["changes"] for t in trials[1:]] == [
        {"speculative.num_draft_tokens": d, "server.mem_fraction_static": f} for d in (4, 6) for f in (0.88, 0.95)]
    # --gpu-memory-utilization 0.95 does not boot on the emulated host: infeasible for memory (vLLM refuses the
    # budget before it allocates, where SGLang's boot is OOM-killed: both "oom", by the kind of the fatal line)
    oom = [t for t in trials if t["changes"].get("server.mem_fraction_static") == 0.95]
    assert all(t["status"] == "infeasible" and t["reason"] == "oom" for t in oom), oom
    # vLLM's own refusal, named by the doctor's finding (a real capture: fail-gpu-memory-utilization-too-low.log)
    assert all("memory_budget" in t["error"] and "--gpu-memory-utilization" in t["error"] for t in oom), oom
    feasible = {t["changes"].get("speculative.num_draft_tokens", 8): t for t in trials if t["status"] == "feasible"}
    assert set(feasible) == {4, 6, 8}, trials
    # each trial's accept length is vLLM's own figure from its counters (the baseline's too)
    assert all(t["accept_len"] and t["accept_len"] > 1 for t in feasible.values()), feasible
    speeds = {d: t["objective"]["median"] for d, t in feasible.items()}
    assert max(speeds, key=lambda d: speeds[d]) == 6, speeds
    assert trials[0]["g6"]["verdict"] == "reference"
    assert all(t["g6"]["verdict"] == "identical" for t in feasible.values() if not t["baseline"])

    # the best feasible candidate confirmed against the baseline, interleaved, and promoted beyond the noise band;
    # tv leaves the memory fraction unset (vLLM's own 0.92), so the winner's 0.88 is a change it writes down
    conf, w = data["confirmation"], data["winner"]
    assert conf["order"] == ["baseline", "winner", "baseline", "winner"] and conf["verdict"] == "better", conf
    assert w["promoted"] and w["changes"] == {"speculative.num_draft_tokens": 6, "server.mem_fraction_static": 0.88}
    doc = yaml.safe_load(Path(w["path"]).read_text())
    assert doc["extends"] == "tv" and doc["speculative"] == {"num_draft_tokens": 6}
    assert doc["server"] == {"mem_fraction_static": 0.88}
    code, out, err = cli("render", "--profile", w["profile"], "--json")
    assert code == 0, err
    argv = json.loads(out)["ranks"][0]["argv"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == 5, spec
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.88", argv

    assert data["restore"]["ok"] and active_profile(cli) == "tv-off" and data["original"] == before
