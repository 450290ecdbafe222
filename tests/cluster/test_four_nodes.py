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
from sparkctl.nodes.facts import FABRIC_KNOWN_HOSTS
from sparkctl.router import strip_colour
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
    for name in NODES:
        ids = _docker(test_cluster4, name, "ps", "-aq", "--filter",
                      f"label=sparkctl.cluster={inv.cluster.name}").split()
        if ids:
            _docker(test_cluster4, name, "rm", "-f", *ids)


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


def test_images_reach_three_peers_at_once_streamed_when_missing_and_layered_when_thin(test_cluster4, tmp_path):
    """spark-a gives its images to spark-b, -c, -d at once: the engine image, which spark-c and spark-d lack entirely,
    as one docker save streamed over the fabric SSH into both (spark-b has it: nothing sent), and to spark-d alone;
    then images one thin layer above it to all three, one stream without the layers they hold. Same image IDs
    everywhere after each copy."""
    from sparkctl.images import pipeline
    from sparkctl.images.copy import distribute
    from sparkctl.images.registry import PULLED_FILE, Endpoint
    from sparkctl.prepare.plays import prepare

    inv = load_inventory(test_cluster4.inventory_path)
    conns = pipeline.connections(inv)
    engine, engine_id = test_cluster4.engine_image, test_cluster4.engine_image_id
    prepare(inv, tags=["fabric-ssh"])                     # the fabric key on spark-a, every peer's host key pinned
    src, peers = Endpoint.of(inv, inv.node("spark-a")), [Endpoint.of(inv, inv.node(n)) for n in NODES[1:]]
    thin = [f"sparkctl-test-thin:{tmp_path.name[-8:]}-{i}" for i in (1, 2)]
    try:
        for node in ("spark-c", "spark-d"):   # nothing left there sharing its layers (data roots outlive runs)
            _forget(conns[node], engine)
        lines: list[str] = []
        transfers = distribute([engine], src, peers, report=lines.append)
        by_node = {t.node: t for t in transfers}
        assert by_node["spark-b"].skipped and by_node["spark-b"].rx_bytes == 0
        for node in ("spark-c", "spark-d"):
            assert by_node[node].via == "stream" and by_node[node].image_id == engine_id, "\n".join(lines)
            assert by_node[node].rx_bytes > 100_000_000, by_node[node]          # the whole image, >100 MB
        assert any(ln.startswith("spark-c, spark-d <- ") and "one docker save on spark-a" in ln for ln in lines), lines
        assert "spark-c: copy done (stream)" in lines and "spark-d: copy done (stream)" in lines
        # one peer lacking it: docker save writes straight into that peer's ssh
        _forget(conns["spark-d"], engine)
        (alone,) = [t for t in distribute([engine], src, peers) if not t.skipped]
        assert (alone.node, alone.via, alone.image_id) == ("spark-d", "stream", engine_id)
        assert abs(alone.rx_bytes - by_node["spark-d"].rx_bytes) < 1_000_000      # the same stream, counted alike
        # a stream that fails (here spark-a's pinned fabric host key for spark-d is another node's: its SSH is
        # refused) is retried through the registry, and the image still arrives with its ID
        _forget(conns["spark-d"], engine)
        pinned = conns["spark-a"].run(["sh", "-c", f"cat {FABRIC_KNOWN_HOSTS}"], check=True).stdout
        d_addr = inv.node("spark-d").fabric_address
        rows = [ln.split() for ln in pinned.splitlines() if ln.strip()]
        other = next(r for r in rows if d_addr not in r[0].split(","))
        wrong = "\n".join(" ".join([r[0], *other[1:3]]) if d_addr in r[0].split(",") else " ".join(r)
                          for r in rows) + "\n"
        assert wrong != pinned
        conns["spark-a"].run(["sh", "-c", f"cat > {FABRIC_KNOWN_HOSTS}"], stdin=wrong, check=True)
        try:
            lines.clear()
            (retried,) = [t for t in distribute([engine], src, peers, report=lines.append) if not t.skipped]
        finally:
            conns["spark-a"].run(["sh", "-c", f"cat > {FABRIC_KNOWN_HOSTS}"], stdin=pinned, check=True)
        assert (retried.node, retried.via, retried.image_id) == ("spark-d", "registry", engine_id), "\n".join(lines)
        assert any(ln.startswith("spark-d: the stream failed (spark-a could not SSH to spark-d over the fabric")
                   and ln.endswith("copying through the registry instead") for ln in lines), lines
        assert "spark-d: copy done (registry)" in lines

        # One thin layer above the engine (a flag-only change) to all three, which hold the engine by stream or
        # load: Docker's pull would send the engine's layers again, so one docker save feeds all three, without
        # the engine's layers (the registry's path for a thin layer is tests/cluster/test_image_pipeline.py's)
        for node in NODES[1:]:
            conns[node].run(["rm", "-f", f"{inv.node(node).host_paths.cache}/{PULLED_FILE}"], check=True)
        for flag in thin:
            conns["spark-a"].run(["env", "DOCKER_BUILDKIT=0", "docker", "build", "-q", "-t", flag, "-"], check=True,
                                 timeout=300, stdin=f"FROM {engine}\nRUN echo {flag} > /flag\n")
        n = len(json.loads(conns["spark-a"].run(["docker", "image", "inspect", "--format", "{{json .RootFS.Layers}}",
                                                 thin[0]], check=True).stdout))
        for flag in thin:
            lines.clear()
            transfers = distribute([engine, flag], src, peers, report=lines.append)
            copied = [t for t in transfers if t.image == flag]
            assert [t.node for t in copied] == list(NODES[1:]) and all(t.via == "stream" for t in copied), lines
            assert all(t.skipped for t in transfers if t.image == engine)
            assert any(ln.startswith("spark-b, spark-c, spark-d <- ") and "one docker save on spark-a" in ln
                       and f"without the {n - 1} layers" in ln for ln in lines), lines
            assert {ln for ln in lines if ln.endswith("copy done (stream)")} == \
                {f"{node}: copy done (stream)" for node in NODES[1:]}
            flag_id = conns["spark-a"].run(["docker", "image", "inspect", "--format", "{{.Id}}", flag]).stdout.strip()
            assert {t.image_id for t in copied} == {flag_id}
            assert all(t.stream_layers == (1, n) and t.rx_bytes < 1_000_000 for t in copied), \
                [t.line() for t in copied]
    finally:
        for node in NODES:
            conns[node].run(["docker", "rmi", *thin], timeout=120)
        test_cluster4.ensure_engine_image()               # every node holds the engine image again


def _forget(conn, image: str) -> None:
    """The node holds neither ``image`` nor any image sharing its layers (a bench run's leftovers would)."""
    conn.run(["docker", "rmi", image], check=True, timeout=120)
    conn.run(["docker", "image", "prune", "-af"], check=True, timeout=300)


def test_two_tp2_replicas_behind_the_router_container(cli, test_cluster4, four_env, tmp_path):
    """2 x TP=2 on four Sparks over SSH + Docker: each replica a TP=2 group (its rank 1 before its rank 0), the
    router a container from the engine image on rank 0's node, a generation through it reaches both replicas,
    `status` shows every rank of every replica, `down` stops the router and all four engines."""
    import httpx

    prof = tmp_path / "r2tp2.yml"
    prof.write_text("description: 2 x TP=2 on four Sparks\nextends: dflash-off\nreplicas: 2\nserver:\n  tp_size: 2\n"
                    "router:\n  policy: round_robin\n  health_check_interval_s: 1\nwarmup:\n  requests: 0\n")
    cluster = four_env["cluster"]
    try:
        code, out, err = cli("up", "--profile", str(prof), "--yes", "--json")
        assert code == 0, err[-4000:]
        up = json.loads(out)
        assert up["outcome"] == "deployed" and up["updated"] == [0, 1] and up["parallel"], up
        routers = _docker(test_cluster4, "spark-a", "ps", "--filter", f"label=sparkctl.router-cluster={cluster}",
                          "--format", "{{.Names}} {{.Image}}").split("\n")
        assert [r.split() for r in routers if r.strip()] == [[f"sparkctl-{cluster}-router",
                                                                test_cluster4.engine_image]], routers
        for i, nodes in enumerate((NODES[:2], NODES[2:])):
            for node in nodes:
                assert len(_running(test_cluster4, node, f"{cluster}.r{i}")) == 1, (node, i)
        for k in range(4):          # round robin: both replicas answer through the router
            r = httpx.post(up["endpoint"] + "/generate", json={"text": f"hi {k}", "sampling_params":
                           {"max_new_tokens": 4}}, timeout=30, trust_env=False)
            assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4, r.text[:300]
        code, out, err = cli("status", "--json")
        assert code == 0, err[-2000:]
        st = json.loads(out)
        assert st["healthy"] and st["router"]["kind"] == "container" and st["router"]["healthy_workers"] == 2
        assert [[(x["rank"], x["node"], x["alive"]) for x in rep["ranks"]] for rep in st["replicas"]] == \
            [[(1, "spark-b", True), (0, "spark-a", True)], [(1, "spark-d", True), (0, "spark-c", True)]]
        assert all(v >= 1 for v in st["router"]["requests_per_replica"].values()), st["router"]
        # logs: the router container's Docker log (as `docker logs` on spark-a has it, colour codes stripped) and a
        # replica's rank on its own node
        code, out, err = cli("logs", "--router", "--tail", "0")
        assert code == 0 and out.strip() and "\x1b[" not in out, err[-2000:]
        res = test_cluster4.run_on("spark-a", ["docker", "-H", test_cluster4.docker_host("spark-a"), "logs",
                                               f"sparkctl-{cluster}-router"], check=False, timeout=120)
        assert out.split() == strip_colour(res.stdout + res.stderr).split()
        code, out, err = cli("logs", "--replica", "1", "--rank", "1")
        # rank 1's own log: only a rank > 0 serves SGLang's dummy health server (the long server_args line is cut to an
        # excerpt by the output policy, so its node_rank is not looked for)
        assert code == 0 and "Dummy health check server started" in out, err[-2000:]
        code, out, err = cli("down", "--yes", "--json")
        assert code == 0 and json.loads(out)["stopped"] == ["router", "replica 0", "replica 1"], err[-2000:]
        for i, nodes in enumerate((NODES[:2], NODES[2:])):
            for node in nodes:
                assert _running(test_cluster4, node, f"{cluster}.r{i}") == [], node
        assert _docker(test_cluster4, "spark-a", "ps", "-aq", "--filter",
                       f"label=sparkctl.router-cluster={cluster}").strip() == ""
    finally:
        cli("down", "--yes")
