"""Contract: four Sparks through a switch, d5 at TP=4: SGLang's real parser (the profile's version) reads every
rank's rendered argv back as --tp 4 --nnodes 4 --node-rank i --dist-init-addr <rank 0's fabric address>:port."""
from __future__ import annotations

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.sglang.render import render
from testrig.nnode_inputs import sparks_inventory, tp_profile
from testrig.realparser import parse_with_real_sglang
from testrig.testenv import need_real_parser

pytestmark = [pytest.mark.contract, pytest.mark.timeout(1800)]


def test_real_parser_reads_four_ranks(tmp_path):
    profile = load_profile(str(tp_profile(tmp_path / "d5-tp4.yml", 4)))
    version = profile.image.sglang_version
    need_real_parser(version)
    inventory = load_inventory(sparks_inventory(tmp_path / "four.yml", 4, subnet="192.168.100.0/24"))
    specs = render(profile, inventory, environ={}).specs
    assert [s.rank for s in specs] == [0, 1, 2, 3]
    for spec in specs:
        parsed = parse_with_real_sglang(version, spec.argv[3:])
        got = (parsed["tp_size"], parsed["nnodes"], parsed["node_rank"], parsed["dist_init_addr"])
        assert got == (4, 4, spec.rank, f"192.168.100.10:{profile.api.dist_port}"), (spec.node, got)
        assert parsed["model_path"] == profile.model.path
        assert spec.env["SGLANG_HOST_IP"] == f"192.168.100.{10 + spec.rank}"
