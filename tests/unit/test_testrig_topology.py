"""The test cluster's shape without root: names, addresses and the inventory it writes for 2, 3 and 4 nodes (the
two-node one unchanged: a direct cable, no topology keys; more through a switch on one fabric subnet)."""
from __future__ import annotations

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from testrig.cluster import TestCluster
from testrig.hostops import ClusterError


@pytest.mark.parametrize("count", [2, 3, 4])
def test_inventory_of_n_nodes_loads_with_the_right_topology(tmp_path, count):
    cluster = TestCluster(tmp_path / "c", name_prefix="zz", net_index=5, node_count=count)
    cluster.workdir.mkdir()
    cluster._write_inventory()
    inv = load_inventory(cluster.inventory_path)
    names = ["spark-a", "spark-b", "spark-c", "spark-d"][:count]
    assert [n.name for n in inv.nodes] == names
    assert [n.fabric_address for n in inv.nodes] == [f"198.18.5.{i + 1}" for i in range(count)]
    assert [n.ssh.host for n in inv.nodes] == [f"198.19.5.{i + 1}" for i in range(count)]
    assert {n.fabric_interface for n in inv.nodes} == {"enp1s0f0np0"}
    cluster_vars = yaml.safe_load(cluster.inventory_path.read_text())["all"]["vars"]
    if count == 2:
        assert inv.fabric_topology == "direct" and not cluster.switched
        assert "sparkctl_fabric_topology" not in cluster_vars and "sparkctl_fabric_subnet" not in cluster_vars
    else:
        assert inv.fabric_topology == "switch" and cluster.switched
        assert cluster_vars["sparkctl_fabric_subnet"] == "198.18.5.0/24"
        assert cluster.fabric_bridge == "zz-fab"


def test_link_names_fit_the_kernel_limit_for_the_longest_prefix(tmp_path):
    cluster = TestCluster(tmp_path / "c", name_prefix="abcdef", node_count=4)
    names = [cluster.bridge, cluster.fabric_bridge, *(f"abcdef-{n}" for n in cluster.nodes),
             *(cluster._fabric_port(n) for n in cluster.nodes.values())]
    assert len(set(names)) == len(names) and max(map(len, names)) <= 15   # IFNAMSIZ - 1


@pytest.mark.parametrize("count", [0, 1, 5])
def test_node_count_outside_2_to_4_is_refused(tmp_path, count):
    with pytest.raises(ClusterError, match="bad node count"):
        TestCluster(tmp_path / "c", node_count=count)


def test_every_embedded_cluster_waits_on_a_silent_peer_for_the_one_shared_bound_unless_it_sets_its_own(tmp_path):
    import yaml

    from testrig.embedded import PEER_TIMEOUT_S, REAL_ENGINE_STORE_PORTS, write_embedded_inventory

    def knobs(sim: dict) -> dict:
        return yaml.safe_load(write_embedded_inventory(tmp_path / "inv.yml", sim).read_text())["all"]["vars"][
            "sparkctl_sim"]
    reserved = ",".join(map(str, REAL_ENGINE_STORE_PORTS))     # and the real engines' store ports, reserved
    assert knobs({"boot_s": 0.3}) == {"peer_timeout_s": PEER_TIMEOUT_S, "reserved_ports": reserved, "boot_s": 0.3}
    assert knobs({"peer_timeout_s": 1.5})["peer_timeout_s"] == 1.5
