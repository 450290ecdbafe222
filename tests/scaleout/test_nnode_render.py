"""N-node tensor parallel, the inputs half: an inventory of N Sparks validates (ranks 0..N-1 once each, one fabric
subnet through a switch, a direct cable only between two) and renders one argv per rank."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError
from sparkctl.sglang.render import render
from testrig.nnode_inputs import sparks_inventory, tp_profile


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_n_sparks_render_one_rank_each(tmp_path, n):
    inventory = load_inventory(sparks_inventory(tmp_path / "inv.yml", n))
    profile = load_profile(str(tp_profile(tmp_path / "p.yml", n)))
    specs = render(profile, inventory, environ={}).specs
    assert [s.rank for s in specs] == list(range(n))
    for spec in specs:
        assert (_flag(spec.argv, "--tp-size"), _flag(spec.argv, "--nnodes"), _flag(spec.argv, "--node-rank")) == \
            (str(n), str(n), str(spec.rank))
        assert _flag(spec.argv, "--dist-init-addr") == f"192.168.100.10:{profile.api.dist_port}"
        assert spec.env["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0"
    assert inventory.fabric_topology == ("direct" if n == 2 else "switch")


def test_rank_order_not_file_order(tmp_path):
    inventory = load_inventory(sparks_inventory(tmp_path / "inv.yml", 4, ranks=[2, 0, 3, 1]))
    assert [n.name for n in inventory.nodes] == ["spark-1", "spark-3", "spark-0", "spark-2"]
    specs = render(load_profile(str(tp_profile(tmp_path / "p.yml", 4))), inventory, environ={}).specs
    assert _flag(specs[0].argv, "--dist-init-addr").startswith("192.168.100.11:")   # spark-1 holds rank 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=9), min_size=3, max_size=8))
def test_ranks_accepted_iff_0_to_n_minus_1_once_each(tmp_path_factory, ranks):
    path = sparks_inventory(tmp_path_factory.mktemp("inv") / "inv.yml", len(ranks), ranks=ranks)
    if sorted(ranks) == list(range(len(ranks))):
        assert [n.rank for n in load_inventory(path).nodes] == list(range(len(ranks)))
    else:
        with pytest.raises(ConfigError, match=r"sparkctl_rank: the \d+ hosts must have ranks 0\.\.\d+ once each"):
            load_inventory(path)


def test_switch_address_outside_the_subnet_is_named(tmp_path):
    addrs = ["192.168.100.10", "192.168.100.11", "192.168.101.12", "192.168.100.13"]
    with pytest.raises(ConfigError) as info:
        load_inventory(sparks_inventory(tmp_path / "inv.yml", 4, addresses=addrs))
    assert "hosts.spark-2.fabric_address: 192.168.101.12 is not in the fabric subnet 192.168.100.0/24" \
        in info.value.message
    assert info.value.hint is not None and "sparkctl_fabric_subnet" in info.value.hint
    # the switch's real subnet, given, accepts it
    assert len(load_inventory(sparks_inventory(tmp_path / "ok.yml", 4, addresses=addrs,
                                               subnet="192.168.100.0/23")).nodes) == 4


def test_direct_links_join_two_nodes_only(tmp_path):
    assert load_inventory(sparks_inventory(tmp_path / "two.yml", 2, topology="direct")).fabric_topology == "direct"
    with pytest.raises(ConfigError, match="direct links join two nodes; this inventory has 4") as info:
        load_inventory(sparks_inventory(tmp_path / "four.yml", 4, topology="direct"))
    assert info.value.hint is not None and "switch" in info.value.hint


@pytest.mark.parametrize("subnet", ["192.168.100.1/24", "not-a-subnet", "10.0.0.0/33"])
def test_bad_subnet_is_refused_by_name(tmp_path, subnet):
    with pytest.raises(ConfigError, match="sparkctl_fabric_subnet"):
        load_inventory(sparks_inventory(tmp_path / "inv.yml", 4, subnet=subnet))


def test_tp_must_match_the_node_count(tmp_path):
    inventory = load_inventory(sparks_inventory(tmp_path / "inv.yml", 4))
    with pytest.raises(ConfigError, match="cannot hold the 2 ranks"):
        render(load_profile(str(tp_profile(tmp_path / "p.yml", 2))), inventory, environ={})
