"""Replicas on the real engine: 2 x TP=1 real SGLang 0.5.23 (one per loopback node, one core each) behind the real
sglang-router, then a rolling update to a changed profile under a bounded client loop through the router: zero failed
requests, every replica replaced in turn, and `down` stops router and replicas."""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from testrig.embedded import stop_cluster_engines, write_real_engine_inventory
from testrig.testenv import need_module, need_real_engine
from testrig.traffic import Traffic

pytestmark = pytest.mark.real_engine
need_module("sglang_router", "the router extra (sglang-router) is not installed")


def _profile(path: Path, max_running_requests: int) -> Path:
    path.write_text("description: two TP=1 real replicas\nextends: cpu-tiny\nreplicas: 2\n"
                    f"server:\n  tp_size: 1\n  max_running_requests: {max_running_requests}\n"
                    "router:\n  policy: round_robin\n  health_check_interval_s: 1\n  drain_timeout_s: 60\n"
                    "warmup:\n  requests: 1\n  max_tokens: 8\n")
    return path


def test_real_replicas_rolling_update_under_load_fails_no_request(tmp_path, monkeypatch, state_dir):
    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy.replicated import ReplicatedDeployer, sub_inventory
    from sparkctl.router.replicas import render_replicas

    engine = need_real_engine()
    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    inv_path = write_real_engine_inventory(tmp_path / "inventory.yml", engine, prefix="rr")
    inv = load_inventory(inv_path)
    d = ReplicatedDeployer(inv)
    p1 = load_profile(str(_profile(tmp_path / "rep.yml", 16)))
    import time
    try:
        t0 = time.monotonic()
        first = d.up(p1)
        t1 = time.monotonic()
        assert first.outcome == "deployed" and first.updated == [0, 1] and not first.emulated
        endpoint = first.endpoint
        st = d.status()
        assert st.healthy and st.router is not None and st.router.healthy_workers == 2

        p2 = load_profile(str(_profile(tmp_path / "rep.yml", 24)))       # changed: a rolling update
        # at least 10 requests each and on until the update is over (at most 2000 each)
        # (each client waits 0.2 s between requests: the two engines on this CPU leave the booting ones a core)
        with Traffic(endpoint, clients=2, at_least=10, at_most=2000, max_new_tokens=8, timeout_s=120,
                     join_s=600, pause_s=0.2) as load:
            rolled = d.up(p2)
        print(f"first up {t1 - t0:.1f} s; rolling update {time.monotonic() - t1:.1f} s under {load.done} requests "
              f"({load.during} started during it)")
        assert load.failures == [], load.failures[:5]
        assert load.during > 0, (load.done, load.during)                   # the update ran under load
        assert rolled.outcome == "deployed" and rolled.updated == [0, 1]
        st = d.status()
        assert st.healthy and all(r.in_router for r in st.replicas)
        info = httpx.get(st.replicas[1].url + "/get_server_info", timeout=10, trust_env=False).json()
        assert info["max_running_requests"] == 24                        # the real server runs the new profile
        down = d.down()
        assert down.stopped == ["router", "replica 0", "replica 1"]
    finally:
        try:
            d.down()
        finally:
            for rep in render_replicas(p1, inv, environ={}):
                stop_cluster_engines(sub_inventory(rep, inv.cluster.name))
