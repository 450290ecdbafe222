"""Replicas behind SGLang's router on the two-node SSH + Docker test cluster: a profile with `replicas: 2` and
server.tp_size 1 (2 x TP=1 on two "Sparks"). One deployment shared across the steps:

* `up` starts both replicas (one engine container per node) and the router as a container from the same engine
  image on rank 0's node (spark-a), reached at spark-a's address;
* `status --json` shows the router (its /readiness and its Prometheus view, read through the container) and each
  replica;
* a router container a dead controller left is found, not duplicated: the record losing it -> the running one of
  the same launch is kept; one that exited -> replaced under the same name;
* a rolling update (`up` with a changed flag) under a bounded client loop through the router (at concurrency 4, until
  the update is over, at most 400 requests): zero failed requests, every replica's steps in replicated.json's journal;
* `repair` of replicated.json damaged while all of it runs rebuilds it from what runs (the router container by its
  label, the replicas' own records), and `status` is healthy again;
* `down` stops the router container and the replicas (checked with `docker ps` on each node).
"""
from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import httpx
import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.nodes.container import MEMLOCK_ENV
from sparkctl.router.container import router_container_name
from sparkctl.state.ledger import Ledger
from testrig.cluster import TestCluster
from testrig.embedded import write_replicated_profile
from testrig.traffic import Traffic

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

SIM = {"boot_s": 1.0, "decode_tps": 2000, "peer_timeout_s": 5, "ttft_base_s": 0.002}
# The cap only bounds a loop whose update never ends: 1000 requests a client of 0.4 s each (800 tokens at the
# emulator's 2000 tok/s) span ~400 s of update. 100 (~40 s) was reached inside an update of 55.6 s (2026-12-06, a
# less loaded machine: faster requests), and the check that the update ran under load failed on the bound itself.
CLIENTS, CAP, AFTER = 4, 1000, 2    # 2 requests each after the update
TOKENS = 800


def _docker(tc: TestCluster, node: str, *args: str) -> str:
    return tc.run_on(node, ["docker", "-H", tc.docker_host(node), *args], check=False).stdout


def _routers(tc: TestCluster, node: str, cluster: str, *, all_states: bool = False) -> list[list[str]]:
    out = _docker(tc, node, "ps", *(["-a"] if all_states else []), "--no-trunc", "--filter",
                  "label=sparkctl.role=router", "--filter", f"label=sparkctl.router-cluster={cluster}",
                  "--format", "{{.ID}} {{.Names}} {{.Image}} {{.State}}")
    return [line.split() for line in out.splitlines() if line.strip()]


def _engines(tc: TestCluster, node: str, cluster: str) -> list[str]:
    out = _docker(tc, node, "ps", "--format", '{{.Names}} {{.Label "sparkctl.cluster"}}')
    return [line for line in out.splitlines() if line.split()[-1:] and line.split()[-1].startswith(f"{cluster}.r")]


@pytest.fixture
def replicated_env(test_cluster: TestCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path):
    """The cluster's inventory with fast emulator knobs under a cluster name of this test; at teardown every
    container of this cluster (router and replicas) is removed, whatever the test left."""
    doc = yaml.safe_load(Path(test_cluster.inventory_path).read_text())
    doc["all"]["vars"]["sparkctl_sim"] = SIM
    doc["all"]["vars"]["sparkctl_cluster"] = f"{doc['all']['vars']['sparkctl_cluster']}-rep"
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    for node in load_inventory(inv).nodes:          # the base profile's model, as an empty directory
        Path(node.host_paths.models, "GLM-5.3-Flash-NVFP4").mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(inv))
    monkeypatch.delenv("SPARKCTL_API_KEY", raising=False)     # a replicated deployment refuses an API key
    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    if hard != resource.RLIM_INFINITY:              # this sandbox's dockerd cannot raise RLIMIT_MEMLOCK
        monkeypatch.setenv(MEMLOCK_ENV, str(hard))
    yield inv
    cluster = load_inventory(inv).cluster.name
    for name in ("spark-a", "spark-b"):
        ids = [r[0] for r in _routers(test_cluster, name, cluster, all_states=True)]
        for sub in (f"{cluster}-r0", f"{cluster}-r1"):
            ids += _docker(test_cluster, name, "ps", "-aq", "--filter", f"label=sparkctl.cluster={sub}").split()
        if ids:
            _docker(test_cluster, name, "rm", "-f", *ids)


def _json(cli, *args: str) -> tuple[int, dict, str]:
    code, out, err = cli(*args, "--json")
    return code, (json.loads(out) if out.strip() else {}), err


def test_replicas_behind_the_router_container(cli, capsys, test_cluster, replicated_env, tmp_path):
    cluster = load_inventory(replicated_env).cluster.name
    name = router_container_name(cluster)
    prof = write_replicated_profile(tmp_path / "rep.yml", 16)
    try:
        # ---- up: both replicas and the router container on rank 0's node -----------------------------------
        code, up, err = _json(cli, "up", "-p", str(prof), "--yes")
        assert code == 0, err[-4000:]
        assert up["outcome"] == "deployed" and up["updated"] == [0, 1]
        endpoint = up["endpoint"]
        a = test_cluster.node("spark-a")
        assert endpoint == f"http://{a.mgmt_address}:30080"
        routers = _routers(test_cluster, "spark-a", cluster)
        assert [(r[1], r[2], r[3]) for r in routers] == [(name, test_cluster.engine_image, "running")], routers
        assert _routers(test_cluster, "spark-b", cluster, all_states=True) == []
        assert len(_engines(test_cluster, "spark-a", cluster)) == 1
        assert len(_engines(test_cluster, "spark-b", cluster)) == 1
        first_id = routers[0][0]

        # ---- status: the router (readiness and metrics through the container) and each replica ---------------
        r = httpx.post(endpoint + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 4}},
                       timeout=30, trust_env=False)
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4
        code, st, err = _json(cli, "status")
        assert code == 0, err[-3000:]
        assert st["replicated"] and st["healthy"], st
        router = st["router"]
        assert router["runtime"] == router["kind"] == "container" and router["url"] == endpoint
        assert router["live"] and router["ready"] and router["healthy_workers"] == router["total_workers"] == 2
        urls = [rep["url"] for rep in st["replicas"]]
        assert set(router["requests_per_replica"]) == set(urls)          # smg_* metrics read from the container
        assert [(rep["nodes"], rep["healthy"], rep["in_router"], rep["router_healthy"]) for rep in st["replicas"]] \
            == [(["spark-a"], True, True, True), (["spark-b"], True, True, True)]
        record_path = Ledger.for_cluster(cluster).root / "replicated.json"
        record = json.loads(record_path.read_text())
        assert record["router"]["container_id"] == first_id and record["router"]["node"] == "spark-a"

        # ---- a dead controller's router: the record lost it (killed after docker run) -> kept, not duplicated -
        record.pop("router")
        record_path.write_text(json.dumps(record))
        code, again, err = _json(cli, "up", "-p", str(prof), "--yes")
        assert code == 0 and again["outcome"] == "unchanged", err[-3000:]
        assert [r[0] for r in _routers(test_cluster, "spark-a", cluster, all_states=True)] == [first_id]
        # ... one that exited -> replaced under the same name (no "name already in use")
        _docker(test_cluster, "spark-a", "stop", "--time", "1", first_id)
        code, again, err = _json(cli, "up", "-p", str(prof), "--yes")
        # the router was started again (a change), no replica was redeployed
        assert code == 0 and again["outcome"] == "deployed" and again["updated"] == [], err[-3000:]
        routers = _routers(test_cluster, "spark-a", cluster, all_states=True)
        assert len(routers) == 1 and routers[0][1] == name and routers[0][3] == "running"
        assert routers[0][0] != first_id

        # ---- rolling update under a bounded client loop through the router ------------------------------------
        write_replicated_profile(prof, 24)                               # a changed flag: a rolling update
        # requests until the update is over and AFTER more beyond it each, at most CAP each (the loop's bound)
        with Traffic(endpoint, clients=CLIENTS, at_least=0, at_most=CAP, after=AFTER, max_new_tokens=TOKENS,
                     join_s=600) as load:
            while load.done < CLIENTS:                                   # traffic flows before the update starts
                time.sleep(0.05)
            before, t0 = load.done, time.monotonic()
            code, rolled, err = _json(cli, "up", "-p", str(prof), "--yes")
            at_end, took = load.done, time.monotonic() - t0
        assert code == 0, err[-4000:]
        assert load.failures == [], load.failures[:5]
        # the whole update ran under load: requests before it, during it, and after it (not cut by the bound)
        assert before >= CLIENTS and at_end > before and load.done < CLIENTS * CAP, (before, at_end, load.done, took)
        with capsys.disabled():                                          # the figure, outside the CLI's output
            print(f"\nrolling update {took:.1f}s; requests before/during/after: {before}/{at_end - before}/"
                  f"{load.done - at_end}, failed {len(load.failures)}")
        assert rolled["outcome"] == "deployed" and rolled["updated"] == [0, 1]
        journal = json.loads(record_path.read_text())["journal"]
        ok = [(e["step"], e["replica"]) for e in journal if e["phase"] == "ok"]
        last = len(ok) - 1 - ok[::-1].index(("settle", None))
        assert ok[last:] == [("settle", None), ("replica-detach", 0), ("replica-up", 0), ("replica-attach", 0),
                             ("replica-detach", 1), ("replica-up", 1), ("replica-attach", 1),
                             ("router-gates", None), ("hand-off", None)]
        for url in urls:
            info = httpx.get(url + "/server_info", timeout=5, trust_env=False).json()
            assert info["max_running_requests"] == 24

        # ---- repair on docker: the record damaged while everything runs -> rebuilt from the router container ----
        routers = _routers(test_cluster, "spark-a", cluster)
        record_path.write_text("\x00\xff not json {{{")
        code, _, err = _json(cli, "status")
        assert code == 6, err[-2000:]                                    # damaged: exit 6, never "nothing runs"
        code, repaired, err = _json(cli, "repair", "--yes")
        assert code == 0 and repaired["changed"], err[-3000:]
        rebuilt = json.loads(record_path.read_text())
        assert rebuilt["router"]["runtime"] == "container" and rebuilt["router"]["container_id"] == routers[0][0]
        code, st, err = _json(cli, "status")
        assert code == 0 and st["replicated"] and st["healthy"], (st, err[-2000:])
        assert [rep["in_router"] for rep in st["replicas"]] == [True, True]

        # ---- down: router container and replicas stopped ------------------------------------------------------
        code, down, err = _json(cli, "down", "--yes")
        assert code == 0 and down["stopped"] == ["router", "replica 0", "replica 1"], err[-3000:]
        for node in ("spark-a", "spark-b"):
            assert _routers(test_cluster, node, cluster, all_states=True) == []
            assert _engines(test_cluster, node, cluster) == []
        with pytest.raises(httpx.TransportError):
            httpx.get(endpoint + "/liveness", timeout=2, trust_env=False)
    finally:
        cli("down", "--yes")
