"""`replicas: K`: K groups of tp nodes in rank order, each its own TP group, the router in front on rank 0's node."""
from __future__ import annotations

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError
from sparkctl.router.replicas import render_replicas, router_endpoint, router_spec
from sparkctl.sglang.render import render
from testrig.nnode_inputs import sparks_inventory


def _profile(tmp_path, tp: int, k: int, extra: str = ""):
    p = tmp_path / f"r{k}tp{tp}.yml"
    p.write_text(f"description: x\nextends: d5\nreplicas: {k}\nserver:\n  tp_size: {tp}\n{extra}")
    return load_profile(str(p))


def _flag(argv, name):
    return argv[argv.index(name) + 1]


def test_two_by_tp2_on_four_sparks(tmp_path):
    inv = load_inventory(sparks_inventory(tmp_path / "inv.yml", 4))
    profile = _profile(tmp_path, 2, 2)
    reps = render_replicas(profile, inv, environ={})
    assert [r.nodes for r in reps] == [["spark-0", "spark-1"], ["spark-2", "spark-3"]]
    for r, head in zip(reps, ("192.168.100.10", "192.168.100.12")):
        for spec in r.result.specs:
            assert (_flag(spec.argv, "--tp-size"), _flag(spec.argv, "--nnodes")) == ("2", "2")
            # each replica rendezvouses on a port of its own (SGLang's TCPStore listens on every interface)
            assert _flag(spec.argv, "--dist-init-addr") == f"{head}:{profile.api.dist_port + r.index}"
        assert [s.rank for s in r.result.specs] == [0, 1]
    assert [r.url for r in reps] == ["http://spark-0.local:30000", "http://spark-2.local:30000"]
    router = router_spec(profile, inv, reps)
    assert router.worker_urls == ("http://spark-0.local:30000", "http://spark-2.local:30000")
    assert router.host == "0.0.0.0" and router.port == 30080 and router.policy == "cache_aware"
    assert router_endpoint(profile, inv) == "http://spark-0.local:30080"


def test_two_by_tp1_on_two_sparks(tmp_path):
    inv = load_inventory(sparks_inventory(tmp_path / "inv.yml", 2))
    reps = render_replicas(_profile(tmp_path, 1, 2), inv, environ={})
    assert [r.nodes for r in reps] == [["spark-0"], ["spark-1"]]
    assert all(_flag(r.result.specs[0].argv, "--tp-size") == "1" for r in reps)


def test_one_replica_is_exactly_render(tmp_path):
    inv = load_inventory(sparks_inventory(tmp_path / "inv.yml", 2))
    profile = load_profile("d5")
    (rep,) = render_replicas(profile, inv, environ={})
    assert rep.inventory is inv and rep.result.specs == render(profile, inv, environ={}).specs


@pytest.mark.parametrize("n,tp,k", [(4, 2, 3), (3, 2, 2), (4, 4, 2)])
def test_count_that_does_not_fit_is_refused(tmp_path, n, tp, k):
    inv = load_inventory(sparks_inventory(tmp_path / "inv.yml", n))
    with pytest.raises(ConfigError, match=rf"replicas: {k} x server.tp_size {tp} needs {k * tp} node\(s\); "
                                          rf"the inventory .* has {n}"):
        render_replicas(_profile(tmp_path, tp, k), inv, environ={})


def test_api_key_with_replicas_is_refused(tmp_path):
    inv = load_inventory(sparks_inventory(tmp_path / "inv.yml", 4))
    profile = _profile(tmp_path, 2, 2, "api:\n  api_key_env: SGL_KEY\n")
    with pytest.raises(ConfigError, match=r"\$SGL_KEY is set\): sglang-router 0.3.2 takes the workers' key only as "
                                          r"--api-key in its argv"):
        render_replicas(profile, inv, environ={"SGL_KEY": "sk-1"})
    assert len(render_replicas(profile, inv, environ={})) == 2      # the variable unset: no key, no refusal


def test_router_port_collision_is_refused(tmp_path):
    inv = load_inventory(sparks_inventory(tmp_path / "inv.yml", 4))
    profile = _profile(tmp_path, 2, 2, "router:\n  port: 30000\n")
    with pytest.raises(ConfigError, match="collide with api.port 30000"):
        router_spec(profile, inv, render_replicas(profile, inv, environ={}))


def test_render_of_the_whole_inventory_points_to_the_replicas(tmp_path, cli):
    inv_path = sparks_inventory(tmp_path / "inv.yml", 4)
    profile = _profile(tmp_path, 2, 2)
    with pytest.raises(ConfigError, match="the 4 nodes hold 2 replicas of 2 rank\\(s\\) each, not one group"):
        render(profile, load_inventory(inv_path), environ={})
    code, out, err = cli("render", "-p", profile.path, "-i", str(inv_path))
    assert code == 0, err
    assert "## replica 0 on spark-0, spark-1: http://spark-0.local:30000" in out
    assert "## replica 1 on spark-2, spark-3: http://spark-2.local:30000" in out
    assert out.count("--dist-init-addr 192.168.100.12:") == 2
