"""Any two listeners of a layout that would be one address and port are refused before anything starts, naming
both hosts (sparkctl/sglang/endpoints.py): generated over the shapes (one group of N, K replicas of tp) x which
two hosts share an API address, and over which profile port lands on which other listener, on Sparks (a machine
per ansible_host) and on the embedded cluster (every node on this machine)."""
from __future__ import annotations

import itertools

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError
from sparkctl.router.replicas import render_replicas, router_spec
from testrig.embedded import write_embedded_inventory
from testrig.nnode_inputs import sparks_inventory

SHAPES = [(2, 2, 1), (4, 4, 1), (2, 1, 2), (4, 2, 2), (4, 1, 4)]          # (nodes, tp_size, replicas)


def _profile(tmp_path, tp: int, k: int, extra: str = ""):
    p = tmp_path / f"r{k}tp{tp}.yml"
    p.write_text(f"description: x\nextends: d5\nreplicas: {k}\nserver:\n  tp_size: {tp}\n{extra}")
    return load_profile(str(p))


def _layout(profile, inv):
    reps = render_replicas(profile, inv, environ={})
    if profile.replicas > 1:
        router_spec(profile, inv, reps)
    return reps


def _rewrite(path, change):
    doc = yaml.safe_load(path.read_text())
    change(doc["all"]["children"]["sparks"]["hosts"])
    path.write_text(yaml.safe_dump(doc))
    return path


CASES = [(n, tp, k, i, j) for n, tp, k in SHAPES for i, j in itertools.combinations(range(n), 2)]


@pytest.mark.parametrize("n,tp,k,i,j", CASES, ids=[f"{n}n-tp{tp}x{k}-hosts{i}{j}" for n, tp, k, i, j in CASES])
def test_two_hosts_with_one_api_address_are_refused_naming_both(tmp_path, n, tp, k, i, j):
    profile = _profile(tmp_path, tp, k)
    path = sparks_inventory(tmp_path / "inv.yml", n)
    _layout(profile, load_inventory(path))                                # distinct addresses: it renders
    _rewrite(path, lambda h: h[f"spark-{j}"].update(ansible_host=f"spark-{i}.local"))
    with pytest.raises(ConfigError) as exc:
        _layout(profile, load_inventory(path))
    msg = exc.value.message
    assert f"spark-{i}" in msg and f"spark-{j}" in msg and "one address and port" in msg, msg
    assert "ansible_host" in (exc.value.hint or "")


URL_CASES = [c for c in CASES if c[2] > 1 and c[3] % c[1] == 0 and c[4] % c[1] == 0]   # two replicas' rank 0s


@pytest.mark.parametrize("n,tp,k,i,j", URL_CASES, ids=[f"{n}n-tp{tp}x{k}-binds{i}{j}" for n, tp, k, i, j in URL_CASES])
def test_two_hosts_binding_one_explicit_address_are_one_url(tmp_path, n, tp, k, i, j):
    """Different machines, one explicit api_bind on two replicas' rank 0: the controller would reach both at one
    URL. (A rank other than 0 serves only a health server nobody reaches by URL: the machine rule covers it.)"""
    profile = _profile(tmp_path, tp, k)
    path = _rewrite(sparks_inventory(tmp_path / "inv.yml", n),
                    lambda h: [h[f"spark-{x}"].update(api_bind="10.9.9.9") for x in (i, j)])
    with pytest.raises(ConfigError, match=rf"spark-{i}.*spark-{j}"):
        _layout(profile, load_inventory(path))


PORTS = ("api.port", "api.dist_port", "router.port", "router.prometheus_port")


@settings(max_examples=60, deadline=None)
@given(shape=st.sampled_from([s for s in SHAPES if s[2] > 1]), embedded=st.booleans(),
       moved=st.sampled_from(("router.port", "router.prometheus_port")),
       onto=st.sampled_from(("api.port", "api.dist_port", "replica dist port")), replica=st.integers(1, 3))
def test_a_profile_port_landing_on_another_listener_is_refused_when_they_share_a_machine(
        tmp_path_factory, shape, embedded, moved, onto, replica):
    n, tp, k = shape
    tmp = tmp_path_factory.mktemp("ports")
    replica = min(replica, k - 1)
    base = load_profile("d5")
    target = {"api.port": base.api.port, "api.dist_port": base.api.dist_port,
              "replica dist port": base.api.dist_port + replica}[onto]
    section, key = moved.split(".")
    profile = _profile(tmp, tp, k, f"{section}:\n  {key}: {target}\n")
    path = (write_embedded_inventory(tmp / "inv.yml", {}, nodes=n) if embedded
            else sparks_inventory(tmp / "inv.yml", n))
    # the router runs on rank 0's node: it shares a machine with replica 0's API and store always, with replica
    # R's store only on the embedded cluster (every node on this machine) or when R's rank 0 is that node
    same_machine = onto != "replica dist port" or embedded
    if same_machine:
        with pytest.raises(ConfigError, match="router"):
            _layout(profile, load_inventory(path))
    else:
        _layout(profile, load_inventory(path))


def test_the_cli_refuses_the_layout_with_a_clear_error(cli, tmp_path):
    path = _rewrite(sparks_inventory(tmp_path / "inv.yml", 2),
                    lambda h: h["spark-1"].update(ansible_host="spark-0.local"))
    code, out, err = cli("render", "--profile", "d5", "--inventory", str(path))
    assert code == 2 and "spark-0" in err and "spark-1" in err and "Traceback" not in err, err
    assert "sparkctl." not in err.replace("sparkctl.", "", 0) or "router.replicas" not in err
