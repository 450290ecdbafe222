"""`sparkctl tune`'s judgments no timing moves, on the embedded cluster with the planted optimum (conftest.py): a
budget stops trials and the next tune settles a killed one; a dead tune never takes down what the user deployed
since; what is not a profile, or changes nothing the engine runs, is refused before anything is deployed. (What
depends on tune's measurements, a promotion or its absence included, is test_tune.py, run alone after the others:
the G6 test's "nothing promoted" failed here once under load, an identical candidate measured faster than its
baseline beyond the noise.)"""
from __future__ import annotations

import json

import yaml

from testrig.controller import active_profile, killed_at

WORK = ("--runs", "3", "--max-tokens", "161", "--warmup", "0")


def test_budget_stops_trials_and_the_next_tune_restores_after_a_kill_9(cli, tune_cluster, state_dir):
    code, out, err = cli("up", "--profile", "t5-off", "--yes", "--json")
    assert code == 0, err
    killed_at("tune:trial@0:after", "tune", "--profile", "t5", "--vary", "server.max_total_tokens=100000", *WORK)
    (marker_path,) = list(state_dir.glob("*/tune.json"))
    killed = json.loads(marker_path.read_text())["run"]
    # the killed tune's baseline trial still runs; its trials are the lifecycle's compare arms, so `status` says
    # the transaction did not finish (exit 8) until it is settled
    assert active_profile(cli, expect_code=8) == "t5"
    code, out, err = cli("status", "--json")
    assert "did not finish" in json.loads(out)["unfinished_compare"]

    # the next tune settles the killed one first (restores t5-off), then keeps its own budget: after the
    # baseline trial the estimate says nothing more fits in 2 s, so no candidate starts and nothing is promoted
    code, out, err = cli("tune", "--profile", "t5", "--vary", "speculative.num_draft_tokens=6", *WORK,
                         "--budget", "2", "--json")
    assert code == 0, err
    assert f"tune {killed} was interrupted" in err
    old = json.loads((marker_path.parent / "runs" / killed / "tune.json").read_text())
    assert old["state"] == "interrupted" and old["restore"]["ok"] and old["restore"]["profile"] == "t5-off"
    data = json.loads(out)
    assert [t["status"] for t in data["trials"]] == ["feasible", "skipped"] and data["trials"][1]["reason"] == "budget"
    assert data["winner"] == {"promoted": False, "why": "no feasible candidate"}
    assert data["original"] == old["restore"]["deployment"]      # the restored t5-off is what ran before this tune
    assert active_profile(cli) == "t5-off" and not marker_path.exists()


def test_duration_and_vary_parsing():
    import pytest

    from sparkctl.cli.tune_cmds import parse_duration
    from sparkctl.errors import ConfigError
    from sparkctl.tune.space import grid, parse_vary
    assert [parse_duration(x) for x in ("2h", "90m", "1h30m", "600", "45s")] == [7200, 5400, 5400, 600, 45]
    for bad in ("", "h", "-5", "0", "2x", "1e9"):
        with pytest.raises(ConfigError):
            parse_duration(bad)
    space = parse_vary(["speculative.num_draft_tokens=4,6", "server.mem_fraction_static=0.85,0.88",
                        "speculative.draft_attention_backend=flashinfer"])
    assert space[0] == ("speculative.num_draft_tokens", [4, 6]) and space[1][1] == [0.85, 0.88]
    assert len(grid(space)) == 4 and grid(space)[1] == {"speculative.num_draft_tokens": 4,
                                                        "server.mem_fraction_static": 0.88,
                                                        "speculative.draft_attention_backend": "flashinfer"}
    for bad_vary in (["x=1"], ["server.x"], ["name.x=1"], ["server.a=1,1"], ["server.a=1", "server.a=2"],
                     ["server.a=1,"]):
        with pytest.raises(ConfigError):
            parse_vary(bad_vary)


def test_a_candidate_that_is_not_a_profile_fails_before_anything_is_deployed(cli, tune_cluster, state_dir):
    code, out, err = cli("tune", "--profile", "t5", "--vary", "server.mem_fraction_statc=0.9")
    assert code == 2 and "server.mem_fraction_statc" in err
    code, out, err = cli("tune", "--profile", "t5-off", "--vary", "speculative.num_draft_tokens=6")
    assert code == 2 and "no 'speculative' section" in err
    code, out, err = cli("tune", "--profile", "t5", "--vary", "server.mem_fraction_static=2")
    assert code == 2 and "mem_fraction_static" in err
    assert not list(state_dir.glob("*/deployments/*.json")) and not list(state_dir.glob("*/runs/*"))


def test_a_dead_tune_never_takes_down_what_was_deployed_since(cli, tune_cluster, state_dir, profiles_dir):
    """A tune killed in its A/B confirmation; the user then deploys a profile of their own; the next `tune` settles
    the dead one without restoring what ran before it (that would take the user's deployment down): the journal is
    closed as interrupted with a line saying why, and the user's deployment still serves."""
    code, out, err = cli("up", "--profile", "t5-off", "--yes", "--json")
    assert code == 0, err
    killed_at("tune:confirm@1:after", "tune", "--profile", "t5", "--vary", "speculative.num_draft_tokens=6", *WORK,
                    "--confirm-rounds", "1")
    (marker_path,) = list(state_dir.glob("*/tune.json"))
    killed = json.loads(marker_path.read_text())["run"]
    (profiles_dir / "mine.yml").write_text("extends: t5-off\nserver:\n  max_running_requests: 12\n")
    code, out, err = cli("up", "--profile", "mine", "--yes", "--json")
    assert code == 0, err
    mine = json.loads(out)["deployment"]
    code, out, err = cli("tune", "--profile", "t5", "--vary", "speculative.num_draft_tokens=6", *WORK,
                         "--budget", "2", "--json")
    assert code == 0, err
    assert f"tune {killed} was interrupted" in err and f"deployment {mine} (profile mine) was deployed" in err, err
    old = json.loads((marker_path.parent / "runs" / killed / "tune.json").read_text())
    assert old["state"] == "interrupted" and old["restore"]["action"] == "none", old["restore"]
    assert json.loads(out)["original"] == mine          # this tune restores what ran before it: the user's
    assert active_profile(cli) == "mine"


def test_only_keys_that_change_what_the_engine_runs_are_tunable(cli, tune_cluster, state_dir):
    """A --vary key whose every value renders the same launch as the profile (warm-up, expectations, the router
    without replicas) is refused before anything is deployed, naming it; nothing is journaled or deployed."""
    for vary, hint in (("warmup.requests=2,3", "server.*"), ("expect.min_max_total_num_tokens=1000,2000", "server.*"),
                       ("router.policy=random,round_robin", "only with replicas > 1")):
        code, out, err = cli("tune", "--profile", "t5", "--vary", vary, *WORK)
        key = vary.split("=")[0]
        assert code == 2 and f"--vary {key}: not a setting of what the engine runs" in err and hint in err, err
    assert not list(state_dir.glob("*/runs/*/tune.json")) and not list(state_dir.glob("*/deployments/*"))
    code, out, err = cli("tune", "--profile", "t5", "--vary", "speculative.num_draft_tokens=6", "--vary",
                         "warmup.requests=2", *WORK)
    assert code == 2 and "--vary warmup.requests" in err, err     # one inert key among real ones: refused too


def test_a_vary_value_the_profiles_engine_cannot_run_is_refused_naming_the_vary(cli, state_dir, monkeypatch):
    """Tune searches vLLM's envelope through the same renderer: `server.max_running_requests` is vLLM's
    --max-num-seqs; a value vLLM has no counterpart for (SGLang's KV cap in tokens, its mamba split) is refused before
    anything is journaled or deployed, naming the --vary and vLLM's counterpart (not the profile file, which does
    not hold it)."""
    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.engines import render
    from sparkctl.resources import shipped
    from sparkctl.tune import space as sp

    inv = shipped("inventory", "local-vllm.yml")
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(inv))
    for vary, counterpart in (("server.max_total_tokens=1000,2000", "--kv-cache-memory-bytes"),
                              ("server.mamba_full_memory_ratio=0.5", "no vLLM counterpart")):
        code, out, err = cli("tune", "--profile", "cpu-tiny-vllm", "--vary", vary, *WORK)
        key, first = vary.split("=")[0], vary.split("=")[1].split(",")[0]
        assert code == 2 and f"--vary {key}={first}: {key}: " in err and counterpart in err, err
        assert "cpu-tiny-vllm.yml" not in err, err
    assert not list(state_dir.glob("*/runs/*/tune.json")) and not list(state_dir.glob("*/deployments/*"))
    base = load_profile("cpu-tiny-vllm")
    for n in (4, 8):
        cand = sp.candidate_profile(base, {"server.max_running_requests": n}, f"cpu-tiny-vllm-t{n}")
        argv = render(cand, load_inventory(inv)).specs[0].argv
        assert argv[argv.index("--max-num-seqs") + 1] == str(n), argv


def test_tune_on_vllm_refuses_a_candidate_below_expect_by_the_capacity_gate(cli, vllm_tune_cluster, profiles_dir):
    """vLLM's capacity is its KV cache in tokens: with a 4x larger KV cell the same 64 MiB per rank hold 32,768
    tokens, below an `expect` of 65,536: the gate called capacity refuses it, whatever vLLM calls the number (the
    emulator's vLLM dialect, conftest.py's `vllm_tune_cluster`)."""
    doc = yaml.safe_load((profiles_dir / "tv-off.yml").read_text())
    doc["expect"] = {"min_max_total_num_tokens": 65536}
    (profiles_dir / "tv-cap.yml").write_text(yaml.safe_dump(doc))
    code, out, err = cli("tune", "--profile", "tv-cap", "--vary", "env.SPARKCTL_SIM_KV_BYTES_PER_TOKEN=512,2048",
                         *WORK, "--json")
    assert code == 0, err
    data = json.loads(out)
    by = {t["changes"].get("env.SPARKCTL_SIM_KV_BYTES_PER_TOKEN", "512"): t for t in data["trials"]}
    assert by["2048"]["status"] == "infeasible" and by["2048"]["reason"] == "capacity below expect", by["2048"]
    assert by["2048"]["error"].startswith("verify gate(s) failed: capacity;"), by["2048"]["error"]
    assert data["restore"]["ok"]
