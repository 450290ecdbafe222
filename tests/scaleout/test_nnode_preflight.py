"""The cross-node preflight on four Sparks (deploy/host_checks.evaluate, pure): every node against rank 0 for the
model manifests and the fabric MTU, rank 0's fabric SSH to each of its three peers; and NCCL_IB_HCA per node."""
from __future__ import annotations

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.deploy.host_checks import HostFacts, evaluate
from sparkctl.nodes.facts import FabricSsh, Manifest
from sparkctl.sglang.render import render
from testrig.nnode_inputs import sparks_inventory, tp_profile

NODES = ["spark-0", "spark-1", "spark-2", "spark-3"]
FILES = {"config.json": "aa", "model.safetensors": "bb"}


def _facts(**over) -> dict[str, HostFacts]:
    out = {}
    for n in NODES:
        f = HostFacts(n, fabric_interface="enp1s0f0np0", mtu=9000)
        f.manifests[("model", "/models/GLM")] = Manifest("cached", "/models/GLM", dict(FILES))
        out[n] = f
    out["spark-0"].fabric_ssh = {p: FabricSsh(ok=True) for p in NODES[1:]}
    for fn in over.values():
        fn(out)
    return out


def _failing(checks):
    return sorted((c.node, c.name) for c in checks if not c.ok)


def test_four_healthy_nodes_pass_every_pair():
    checks = evaluate(_facts(), "spark-0")
    assert _failing(checks) == []
    names = {c.name for c in checks}
    assert {"model parity", "fabric mtu equal", "fabric ssh spark-1", "fabric ssh spark-2", "fabric ssh spark-3"} \
        <= names


def test_the_one_bad_node_of_four_is_named():
    def mtu(f):
        f["spark-3"].mtu = 1500

    def manifest(f):
        f["spark-2"].manifests[("model", "/models/GLM")] = Manifest("cached", "/models/GLM",
                                                                    {**FILES, "model.safetensors": "cc"})

    def ssh(f):
        f["spark-0"].fabric_ssh["spark-1"] = FabricSsh(ok=False, error="Connection timed out")
    assert _failing(evaluate(_facts(a=mtu, b=manifest, c=ssh), "spark-0")) == \
        [("spark-0", "fabric ssh spark-1"), ("spark-2", "model parity"), ("spark-3", "fabric mtu equal")]


def test_nccl_ib_hca_per_node(tmp_path):
    path = sparks_inventory(tmp_path / "inv.yml", 4, hcas={2: ["rocep1s0f1", "roceP2p1s0f1"]})
    specs = render(load_profile(str(tp_profile(tmp_path / "p.yml", 4))), load_inventory(path), environ={}).specs
    assert [s.env["NCCL_IB_HCA"] for s in specs] == ["rocep1s0f0,roceP2p1s0f0"] * 2 + \
        ["rocep1s0f1,roceP2p1s0f1", "rocep1s0f0,roceP2p1s0f0"]      # each node its own cabled port's twins
    assert all(s.env["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0" for s in specs)
