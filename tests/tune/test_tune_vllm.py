"""`sparkctl tune` on vLLM: the same search, gates and A/B promotion over vLLM's envelope, on the emulator's vLLM
dialect (sparkctl/sim/vllm_*.py, held to real vLLM 0.32.0 by tests/sim/test_sim_vs_real_vllm.py) with the planted
optimum of conftest.py: speculative.num_draft_tokens is vLLM's num_speculative_tokens + 1 in its
--speculative-config, server.mem_fraction_static its --gpu-memory-utilization (above 0.92 the emulated host kills the
boot), server.max_running_requests its --max-num-seqs. Each trial's accept length is vLLM's own (1 + accepted / drafts
from its /metrics counters), a candidate whose capacity is below `expect` is refused by the gate of that name (vLLM's
KV cache in tokens), and what ran before is restored. A TIMING_MODULE (tests/conftest.py): the promotion depends on
measured decode. The same tune on the real vLLM: measured by hand (docs/benchmarks.md), not in CI (each real trial is
a minute of boot on a 2-core machine)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from testrig.controller import active_profile
from testrig.testenv import free_port
from tests.tune.conftest import PLANTED

WORK = ("--runs", "3", "--max-tokens", "161", "--warmup", "0")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def vllm_tune_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path, profiles_dir: Path):
    """The embedded cluster with the planted optimum; `tv`: cpu-tiny-vllm speculative (ngram, 8 draft tokens as
    d5 runs) with the tiny model's KV cell (its 64 MiB per rank hold 131,072 tokens), on free ports; `tv-off` the same
    without speculation."""
    from sparkctl.config.inventory import load_inventory
    from testrig.embedded import stop_recorded_engines, write_embedded_inventory

    inv = write_embedded_inventory(tmp_path / "inventory.yml", {**PLANTED, "vllm_stats_interval_s": 0.5}, prefix="tv")
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(inv))
    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    node = load_inventory(inv).rank0.api_bind
    doc = yaml.safe_load((REPO / "profiles" / "cpu-tiny-vllm.yml").read_text())
    doc["api"].update(port=free_port(node), dist_port=free_port(node))
    doc["env"]["SPARKCTL_SIM_KV_BYTES_PER_TOKEN"] = "512"
    doc["warmup"] = {"requests": 1, "max_tokens": 16, "timeout_s": 120}
    off = {**doc, "description": "tv without speculation"}
    doc["speculative"] = {"algorithm": "NGRAM", "num_draft_tokens": 8}
    (profiles_dir / "tv.yml").write_text(yaml.safe_dump(doc))
    (profiles_dir / "tv-off.yml").write_text(yaml.safe_dump(off))
    (profiles_dir / "base.yml").write_text((REPO / "profiles" / "base.yml").read_text())
    yield inv
    stop_recorded_engines(inv)


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


def test_tune_on_vllm_refuses_a_candidate_below_expect_by_the_capacity_gate(cli, vllm_tune_cluster, profiles_dir):
    """vLLM's capacity is its KV cache in tokens: with a 4x larger KV cell the same 64 MiB per rank hold 32,768
    tokens, below an `expect` of 65,536: the gate called capacity refuses it, whatever vLLM calls the number; the
    candidates of --max-num-seqs are measured."""
    doc = yaml.safe_load((profiles_dir / "tv-off.yml").read_text())
    doc["expect"] = {"min_max_total_num_tokens": 65536}
    (profiles_dir / "tv-cap.yml").write_text(yaml.safe_dump(doc))
    code, out, err = cli("tune", "--profile", "tv-cap", "--vary", "server.max_running_requests=4,8", "--trials", "2",
                         *WORK, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert [t["status"] for t in data["trials"]] == ["feasible"] * 3, data["trials"]
    code, out, err = cli("tune", "--profile", "tv-cap", "--vary", "env.SPARKCTL_SIM_KV_BYTES_PER_TOKEN=512,2048",
                         *WORK, "--json")
    assert code == 0, err
    data = json.loads(out)
    by = {t["changes"].get("env.SPARKCTL_SIM_KV_BYTES_PER_TOKEN", "512"): t for t in data["trials"]}
    assert by["2048"]["status"] == "infeasible" and by["2048"]["reason"] == "capacity below expect", by["2048"]
    assert by["2048"]["error"].startswith("verify gate(s) failed: capacity;"), by["2048"]["error"]
    assert data["restore"]["ok"]
