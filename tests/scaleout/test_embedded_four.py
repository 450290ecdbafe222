"""The embedded cluster with four loopback nodes: `up` a TP=4 profile (ranks 3, 2, 1 boot before rank 0), every
worker in verify and status, `down` stops all four."""
from __future__ import annotations

import json
import os

import httpx

from testrig.embedded import stop_recorded_engines, write_embedded_inventory

FAST = {"boot_s": 0.3, "decode_tps": 4000}


def test_four_node_embedded_up_status_down(tmp_path, monkeypatch, cli, state_dir):
    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    inv = write_embedded_inventory(tmp_path / "inventory.yml", FAST, nodes=4)
    profile = tmp_path / "tp4.yml"
    profile.write_text("description: base at TP=4\nextends: base\nserver:\n  tp_size: 4\n")
    try:
        code, out, err = cli("up", "-p", str(profile), "-i", str(inv), "--yes")
        assert code == 0, err[-3000:]
        code, out, err = cli("status", "-i", str(inv), "--json")
        assert code == 0, err[-2000:]
        status = json.loads(out)
        assert status["healthy"] is True
        # the ledger's handles in boot order: the workers N-1 .. 1, then rank 0
        assert [(r["rank"], r["node"], r["alive"]) for r in status["ranks"]] == \
            [(3, "spark-d", True), (2, "spark-c", True), (1, "spark-b", True), (0, "spark-a", True)]
        r = httpx.get(f"http://{_rank0_host(inv)}:30000/server_info", timeout=5).json()
        assert (r["tp_size"], r["nnodes"]) == (4, 4)
        code, out, err = cli("down", "-i", str(inv), "--yes")
        assert code == 0, err[-2000:]
        try:
            httpx.get(f"http://{_rank0_host(inv)}:30000/health", timeout=2)
            raise AssertionError("rank 0 still answers after down")
        except httpx.TransportError:
            pass
    finally:
        stop_recorded_engines(inv)


def _rank0_host(inv) -> str:
    import yaml
    hosts = yaml.safe_load(inv.read_text())["all"]["children"]["sparks"]["hosts"]
    return hosts["spark-a"]["api_bind"]
