"""`sparkctl up` of a TP=4 profile for real over SSH and Docker on the four-node test cluster (`test_cluster4`:
spark-a .. spark-d, one fabric subnet through a switch, tests/cluster/conftest.py).

One deployment for the whole module (a short emulator boot): preflight checked every pair over the fabric (a
ping and a don't-fragment full-MTU ping to every peer, from every node), ranks 3, 2, 1 started before rank 0
(the record's journal), `status --json` shows four healthy ranks, `down` stops all four containers.
"""
from __future__ import annotations

import itertools
import json
import resource
from pathlib import Path

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.nodes.container import MEMLOCK_ENV
from sparkctl.state.ledger import Ledger
from testrig.cluster import TestCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

SIM = {"boot_s": 1.0, "decode_tps": 4000, "peer_timeout_s": 5}
NODES = ("spark-a", "spark-b", "spark-c", "spark-d")


@pytest.fixture
def four_env(test_cluster4: TestCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path):
    """The four-node cluster's inventory with fast emulator knobs, the model directory on every node, a TP=4
    profile; every engine container of this test's cluster is removed at teardown."""
    doc = yaml.safe_load(Path(test_cluster4.inventory_path).read_text())
    doc["all"]["vars"]["sparkctl_sim"] = SIM
    doc["all"]["vars"]["sparkctl_cluster"] = f"{doc['all']['vars']['sparkctl_cluster']}-{tmp_path.name[-12:]}"
    inv_path = tmp_path / "inv.yml"
    inv_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    inv = load_inventory(inv_path)
    assert inv.fabric_topology == "switch" and [n.name for n in inv.nodes] == list(NODES)
    for node in inv.nodes:
        Path(node.host_paths.models, "GLM-5.3-Flash-NVFP4").mkdir(parents=True, exist_ok=True)
    profile = tmp_path / "tp4.yml"
    profile.write_text("description: dflash-off at TP=4 on four nodes\nextends: dflash-off\n"
                       "server:\n  tp_size: 4\nwarmup:\n  requests: 1\n  max_tokens: 16\n")
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(inv_path))
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    if hard != resource.RLIM_INFINITY:  # this sandbox's dockerd cannot raise RLIMIT_MEMLOCK
        monkeypatch.setenv(MEMLOCK_ENV, str(hard))
    yield {"inv": inv, "profile": str(profile), "cluster": inv.cluster.name}
    for node in NODES:
        ids = _docker(test_cluster4, node, "ps", "-aq", "--filter", f"label=sparkctl.cluster={inv.cluster.name}").split()
        if ids:
            _docker(test_cluster4, node, "rm", "-f", *ids)


def _docker(cluster: TestCluster, node: str, *args: str) -> str:
    return cluster.run_on(node, ["docker", "-H", cluster.docker_host(node), *args], check=False, timeout=120).stdout


def _running(cluster: TestCluster, node: str, name: str) -> list[str]:
    out = _docker(cluster, node, "ps", "--filter", f"label=sparkctl.cluster={name}", "--format", "{{.Names}}")
    return [line for line in out.splitlines() if line.strip()]


def test_tp4_up_checks_every_pair_boots_workers_first_and_down_stops_all(cli, test_cluster4, four_env):
    code, out, err = cli("up", "--profile", four_env["profile"], "--yes", "--json")
    assert code == 0, err[-4000:]
    up = json.loads(out)
    assert up["outcome"] == "deployed" and all(g["ok"] for g in up["gates"]), up["gates"]

    record = Ledger.for_cluster(four_env["cluster"]).load(up["deployment"])
    # preflight: from every node to every peer, a ping and a full-MTU don't-fragment ping over the switch
    peer_checks = {(c.node, c.name): c for c in record.preflight if c.name.startswith("fabric peer ")}
    for node, peer in itertools.permutations(NODES, 2):
        check = peer_checks.get((node, f"fabric peer {peer}"))
        assert check is not None and check.ok, (node, peer, check)
        assert "9000-byte packets pass unfragmented" in check.seen, check.seen
    assert all(c.ok for c in record.preflight if c.severity == "error"), record.preflight
    # boot: ranks 3, 2, 1 started (the journal's order) before rank 0
    started = [e.what for e in record.journal if e.step == "boot" and e.phase == "ok" and "started" in e.what]
    assert started == ["rank 3 started", "rank 2 started", "rank 1 started", "rank 0 started"], started
    assert [(s.rank, s.node) for s in sorted(record.specs, key=lambda s: s.rank)] == list(enumerate(NODES))
    rank3 = next(s for s in record.specs if s.rank == 3).argv
    assert rank3[rank3.index("--tp-size") + 1] == "4" and rank3[rank3.index("--nnodes") + 1] == "4"
    assert rank3[rank3.index("--node-rank") + 1] == "3"
    assert rank3[rank3.index("--dist-init-addr") + 1] == f"{four_env['inv'].rank0.fabric_address}:25000"

    code, out, err = cli("status", "--json")
    assert code == 0, err[-2000:]
    st = json.loads(out)
    assert st["healthy"] is True
    assert sorted((r["rank"], r["node"], r["alive"]) for r in st["ranks"]) == \
        [(i, n, True) for i, n in enumerate(NODES)]
    for node in NODES:
        assert len(_running(test_cluster4, node, four_env["cluster"])) == 1, node

    code, out, err = cli("down", "--yes", "--json")
    assert code == 0 and json.loads(out)["changed"], err[-2000:]
    for node in NODES:
        assert _running(test_cluster4, node, four_env["cluster"]) == [], node
