"""The lifecycle on the emulator's vLLM dialect: the embedded cluster (process runtime, `python -m sparkctl.sim
serve ...`) runs an `engine: vllm` profile at emulator speed, the path `sparkctl tune` takes on vLLM. The module
shares one cluster, in order: `up` of a speculative (ngram) cpu-tiny-vllm at TP=2 with every gate judged from the
emulator's vLLM answers (config line, /metrics, /v1/models; the headless rank by its log) -> `status` / `logs --rank
1` -> `bench` (a small card: decode, acceptance from vLLM's spec-decode counters) -> `rollback --to cpu-tiny` (the
SGLang dialect replaces the vLLM one on the same nodes and ports) and back -> `down` leaves no process.

The same steps on the real vLLM: tests/realengine/test_vllm_lifecycle_real.py.
"""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.observe import process_engines
from sparkctl.nodes import procfs
from sparkctl.nodes.process import local_port_free
from testrig.controller import cli_ok, passed_gates
from testrig.embedded import emulated_vllm_profile, stop_recorded_engines, write_embedded_inventory
from testrig.sweep import files_holding, processes_holding
from testrig.testenv import free_port

FAST_SIM = {"boot_s": 0.4, "decode_tps": 4000, "vllm_stats_interval_s": 0.5}
KEY = f"sk-vllm-{secrets.token_hex(8)}"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def emu_cluster(tmp_path_factory: pytest.TempPathFactory):
    """The embedded two-node cluster with cpu-tiny-vllm (ngram, 4 drafted tokens) and cpu-tiny on free ports."""
    root = tmp_path_factory.mktemp("vllm-emu")
    inv = write_embedded_inventory(root / "inventory.yml", FAST_SIM, prefix="e")
    node = load_inventory(inv).rank0.api_bind
    port, store = free_port(node), free_port(node)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKCTL_INVENTORY", str(inv))
        mp.setenv("SPARKCTL_STATE_DIR", str(root / "state"))
        mp.setenv("SPARKCTL_PROFILES_DIR", str(root / "profiles"))
        mp.setenv("SPARKCTL_API_KEY", KEY)
        for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_") or k == "SPARKCTL_CRASH_AT"]:
            mp.delenv(key)
        _profiles(root / "profiles", inv, port, store)
        try:
            yield inv, root, port, store
        finally:
            stop_recorded_engines(inv)


def _profiles(profiles: Path, inv: Path, port: int, store: int) -> None:
    """cpu-tiny and cpu-tiny-vllm as shipped, both on this test's ports, with the API key in force; the vLLM one
    speculative (ngram), with the tiny model's KV cell (testrig.embedded.emulated_vllm_profile)."""
    profiles.mkdir()
    shipped = REPO / "profiles"
    tiny = yaml.safe_load((shipped / "cpu-tiny.yml").read_text())
    tiny.setdefault("api", {}).update(port=port, dist_port=store)
    vllm = emulated_vllm_profile(inv, port=port, dist_port=store)
    vllm["speculative"] = {"algorithm": "NGRAM", "num_draft_tokens": 5}
    for name, doc in (("cpu-tiny", tiny), ("cpu-tiny-vllm", vllm)):
        doc["api"]["api_key_env"] = "SPARKCTL_API_KEY"
        (profiles / f"{name}.yml").write_text(yaml.safe_dump(doc))
    (profiles / "base.yml").write_text((shipped / "base.yml").read_text())


def _running_engines(inv: Path) -> dict[int, str]:
    """rank -> the emulator dialect its process runs (its own command line: `sparkctl.sim serve` is vLLM's)."""
    out = {}
    for e in process_engines(Cluster(load_inventory(inv))):
        pid = getattr(e.handle, "pid", None)
        assert isinstance(pid, int), e
        argv = [procfs.cmdline(p) for p in [pid, *procfs.descendants(pid)]]
        sim = [a for a in argv if a[1:3] == ["-m", "sparkctl.sim"]]     # the emulator (its log pipe names it too)
        assert len(sim) == 1, argv
        out[e.handle.rank] = "vllm" if sim[0][3:4] == ["serve"] else "sglang"
    return out


def test_up_emulated_vllm_tp2_passes_every_gate_from_the_emulators_vllm_answers(cli, emu_cluster):
    res = cli_ok(cli, "up", "--profile", "cpu-tiny-vllm")
    assert res["outcome"] == "deployed" and res["emulated"] is True
    gates = passed_gates(res)
    assert "tensor_parallel_size=2" in gates["settings"]["evidence"]
    assert "speculative_method='ngram'" in gates["settings"]["evidence"]
    assert "num_speculative_tokens=4" in gates["settings"]["evidence"]
    assert "max_model_len=1024" in gates["settings"]["evidence"]
    assert "kv_cache_size_tokens=131072" in gates["capacity"]["evidence"], gates["capacity"]
    assert "worker-ready" in gates["workers"]["evidence"]


def test_status_and_the_headless_ranks_own_log(cli, emu_cluster):
    code, out, err = cli("status", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["ok"] and data["engine"] == "vllm" and data["sglang_version"] == "0.32.0" and data["emulated"], data
    code, out, err = cli("logs", "--rank", "1", "--tail", "400")
    assert code == 0, err
    assert "headless multiproc executor" in out and "Worker_TP1" in out and "sparkctl vLLM emulator" in out
    inv = emu_cluster[0]
    assert _running_engines(inv) == {0: "vllm", 1: "vllm"}


def test_bench_card_reads_acceptance_from_the_vllm_counters(cli, emu_cluster, tmp_path):
    code, out, err = cli("bench", "--runs", "2", "--max-tokens", "24", "--warmup", "1", "--ttft-sizes", "128,256",
                         "--ttft-runs", "2", "--concurrency", "1,2", "--g6-max-tokens", "8",
                         "--out", str(tmp_path / "card"), "--json")
    assert code == 0, err[-3000:]
    card = json.loads((tmp_path / "card" / "report.json").read_text())
    assert card["emulated"] is True and card["status"] == "successful", card.get("errors")
    config, results = card["arms"][0]["config"], card["arms"][0]["results"]
    facts = config["engine_facts"]
    assert config["engine"] == "vllm" and config["server_info"] is None and facts["emulated"] is True
    assert facts["settings"]["tensor_parallel_size"] == 2 and facts["context_length"] == 1024
    assert facts["kv_tokens"] == 131072 and facts["speculative_method"] == "ngram" and facts["draft_tokens"] == 4
    for cls in ("code", "prose"):
        entry = results["decode"]["classes"][cls]
        assert entry["decode_tok_s"]["median"] > 0 and all(r["completion_tokens"] == 24 for r in entry["runs"])
    acc = results["acceptance"]["counters"]        # vLLM's own definitions over its /metrics counters
    assert "vllm:spec_decode_num_accepted_tokens_total" in acc["source"]
    assert acc["drafts"] > 0 and acc["draft_tokens"] == 4 * acc["drafts"] and acc["accepted_tokens"] > 0
    assert acc["mean_acceptance_length"] == round(1 + acc["accepted_tokens"] / acc["drafts"], 4) > 1
    assert results["acceptance"]["engine_log"]["spec_lines"] >= 1      # its SpecDecoding metrics lines
    md = (tmp_path / "card" / "report.md").read_text()
    assert "vLLM 0.32.0" in md and "EMULATED" in md.upper()


def test_rollback_across_engines_on_the_same_nodes_and_back(cli, emu_cluster):
    inv = emu_cluster[0]
    res = cli_ok(cli, "rollback", "--to", "cpu-tiny")
    assert res["outcome"] == "deployed", res
    assert "tp_size=2" in passed_gates(res)["settings"]["evidence"]
    code, out, _ = cli("status", "--json")
    assert json.loads(out)["engine"] == "sglang" and _running_engines(inv) == {0: "sglang", 1: "sglang"}
    res = cli_ok(cli, "rollback", "--to", "cpu-tiny-vllm")
    assert res["outcome"] == "deployed", res
    assert "tensor_parallel_size=2" in passed_gates(res)["settings"]["evidence"]
    assert _running_engines(inv) == {0: "vllm", 1: "vllm"}


def test_down_leaves_no_process_and_no_key(cli, emu_cluster):
    inv, root, port, store = emu_cluster
    state = Cluster(load_inventory(inv)).ledger.root
    assert not files_holding(state, (KEY,)), "the API key is in a state file"
    assert not processes_holding((KEY,)), "the API key is in a process's argv or environment"
    code, out, err = cli("down", "--yes")
    assert code == 0, err[-3000:]
    assert process_engines(Cluster(load_inventory(inv))) == []
    node = load_inventory(inv).rank0.api_bind
    assert local_port_free(node, port) and local_port_free(node, store)
    assert not [p for p in processes_holding((str(root),)) if "sparkctl.sim" in p]
