"""Benchmark (not a test): images to N peers on the real four-node test cluster, in one run.

Needs root (like tests/cluster). Brings up a four-node test cluster (prefix/net from SPARKCTL_TEST_CLUSTER4_PREFIX /
SPARKCTL_TEST_CLUSTER4_NET, default `bfan`/5), prepares the fabric SSH key on spark-a (`prepare --tags
fabric-ssh`), builds the d5 engine + launch images on the SGLang 0.5.23 test base on spark-a, then measures, each
copy from a clean peer (no pipeline image, no base, `docker image prune -af`):
  1. the whole-image stream baseline: `docker save engine launch | ssh peer docker load` run on spark-a between the
     nodes' fabric addresses with OpenSSH's defaults (what the other Spark tools do);
  2. sparkctl's first copy of the same images (`distribute`: it chooses the stream for an empty peer) to one peer;
     1 and 2 in ABBA order four times (after a sync each): ratio baseline / first copy per round and of the medians
     (target >= 1.0);
  3. the first copy to three peers at once vs to one peer (wall times), by the stream and by the registry (registry
     cache emptied before each, so each includes the push);
  4. a flag-only copy (peers hold the previous engine + launch: one thin layer missing) to one and to three peers,
     through the registry as chosen; and one right after the streamed first copy (see the note in `run`).
Run:  SPARKCTL_TEST_CLUSTER4_PREFIX=nfq SPARKCTL_TEST_CLUSTER4_NET=9 .venv/bin/python benchmarks/bench_image_fanout.py
--smoke: one ABBA half-round (baseline and first copy once each), the rest as above, on the four-node test cluster
testrig.benchrig.bench_cluster names (a test session's) or one of its own (CI's smoke run: the code path, not the
figures), with images of a few MB: the profile's base is testrig.benchrig.tiny_base (4 MiB, `docker import`ed on
spark-a) with no patch series, and a clean peer loses only this run's images (`docker rmi` + dangling layers, not
`docker image prune -a`: the session's engine image stays). Seconds, not minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sparkctl.config.inventory import Inventory, load_inventory  # noqa: E402
from sparkctl.config.profile import load_profile  # noqa: E402
from sparkctl.images import pipeline  # noqa: E402
from sparkctl.images.build import build_images, ensure_base  # noqa: E402
from sparkctl.images.copy import distribute  # noqa: E402
from sparkctl.images.plan import plan_images  # noqa: E402
from sparkctl.images.registry import Endpoint  # noqa: E402
from sparkctl.nodes.fanout import fan_out, raise_first  # noqa: E402
from sparkctl.nodes.ssh import SSHConnector  # noqa: E402
from sparkctl.prepare.plays import prepare  # noqa: E402
from testrig.benchrig import bench_cluster, drop_smoke_images, tiny_base  # noqa: E402
from testrig.cluster import TestCluster  # noqa: E402
from testrig.engine_image import EngineImages  # noqa: E402

ROUNDS = 4            # baseline and first copy in ABBA order, each from a clean peer: the box is shared, so medians
_BASELINE = ('addr=$1; shift; docker save "$@" | ssh -i ~/.ssh/sparkctl_fabric_ed25519 -o IdentitiesOnly=yes '
             '-o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile=~/.ssh/sparkctl_fabric_known_hosts '
             '"root@$addr" docker load')


def _profile(base_tag: str, watchdog: int, smoke: bool = False):
    prof = load_profile("d5")
    image = {"base_image": base_tag} | ({"patch_series": None} if smoke else {})   # the tiny base has no Python
    prof = prof.model_copy(update={"image": prof.image.model_copy(update=image)})
    server = prof.server.model_copy(update={"watchdog_timeout": watchdog, "tp_size": 4})   # four nodes: TP=4
    return prof.model_copy(update={"server": server})


def main() -> None:
    prefix = os.environ.get("SPARKCTL_TEST_CLUSTER4_PREFIX", "bfan")
    net = int(os.environ.get("SPARKCTL_TEST_CLUSTER4_NET", "5"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    smoke = ap.parse_args().smoke
    with tempfile.TemporaryDirectory() as tmpdir, bench_cluster(Path(tmpdir) / "cluster", prefix, net,
                                                                node_count=4) as (cluster, attached):
        try:
            print(json.dumps(run(cluster, rounds=1 if smoke else ROUNDS, smoke=smoke), indent=2))
        finally:
            if attached and not smoke:   # the peers' images were pruned: the session's engine image back
                cluster.ensure_engine_image()


def run(cluster: TestCluster, rounds: int = ROUNDS, smoke: bool = False) -> dict:
    inv = load_inventory(cluster.inventory_path)
    conns = pipeline.connections(inv)
    a = conns["spark-a"]
    src = Endpoint.of(inv, inv.node("spark-a"))
    peers = [Endpoint.of(inv, n) for n in inv.nodes[1:]]
    base_tag = tiny_base(a) if smoke else EngineImages(cluster).ensure_sglang_base("spark-a")
    made: list[str] = []
    try:
        return _measure(inv, conns, src, peers, base_tag, rounds, smoke, made)
    finally:
        if smoke:    # this run's images off every node, the tiny base's layers with them
            drop_smoke_images(conns, made)


def _measure(inv: Inventory, conns: dict[str, SSHConnector], src: Endpoint, peers: list[Endpoint], base_tag: str,
             rounds: int, smoke: bool, made: list[str]) -> dict:
    a = conns["spark-a"]
    prepare(inv, tags=["fabric-ssh"])
    stamp = int(time.time()) % 100_000
    base = ensure_base(a, base_tag, node="spark-a", pull=False)
    plans = [plan_images(_profile(base_tag, 600 + stamp + i, smoke), inv, base) for i in range(4)]
    made.extend(dict.fromkeys(t for p in plans for t in (p.launch_tag, p.engine_tag)))
    for p in plans:
        build_images(p, a)
    first = [plans[0].engine_tag, plans[0].launch_tag]
    size = int(a.run(["docker", "image", "inspect", "--format", "{{.Size}}", plans[0].launch_tag], check=True).stdout)

    def clean(targets: list[Endpoint]) -> None:
        tags = list(dict.fromkeys(t for p in plans for t in (p.engine_tag, p.launch_tag)))
        # smoke: this run's images only (`prune -a` would take the session's engine image too)
        prune = ["docker", "image", "prune", "-f"] if smoke else ["docker", "image", "prune", "-af"]
        raise_first(fan_out(targets, lambda e: (e.conn.run(["docker", "rmi", *tags], timeout=600),
                                                e.conn.run(prune, timeout=600, check=True))))

    def empty_registry() -> None:
        a.run(["rm", "-rf", f"{src.cache_dir}/sparkctl-registry"], check=True)

    def copy(images: list[str], targets: list[Endpoint], **kw) -> tuple[float, list]:
        t0 = time.perf_counter()
        transfers = distribute(images, src, targets, **kw)
        return time.perf_counter() - t0, transfers

    def baseline(target: Endpoint) -> float:
        t0 = time.perf_counter()
        a.run(["sh", "-c", _BASELINE, "_", target.fabric_address, *first], check=True, timeout=900)
        took = time.perf_counter() - t0
        ids = conns[target.name].run(["docker", "image", "inspect", "--format", "{{.Id}}", *first], check=True)
        assert len(ids.stdout.split()) == 2
        return took

    b = peers[0]
    base_s: list[float] = []
    first_s: list[float] = []
    def ours() -> float:
        took, ts = copy(first, [b])
        assert {t.via for t in ts} == {"stream"}, [t.line() for t in ts]
        return took

    for i in range(rounds):   # ABBA order, each after a clean peer and a sync (the last load's writeback done)
        for which in (("base", "ours") if i % 2 == 0 else ("ours", "base")):
            clean([b])
            a.run(["sync"], timeout=300)
            (base_s if which == "base" else first_s).append(baseline(b) if which == "base" else ours())
    clean(peers)
    stream3, ts3 = copy(first, peers)
    assert {t.via for t in ts3} == {"stream"}
    # a flag-only copy right after a streamed first copy: the registry may send the loaded layers once (Docker's
    # pull cache knows only layers its daemon pulled; data roots that pulled them in an earlier run know them)
    after_stream, tas = copy([plans[3].engine_tag, plans[3].launch_tag], [b])
    after_stream_bytes = sum(t.rx_bytes for t in tas)
    clean(peers)
    empty_registry()
    reg1, _ = copy(first, [b], stream=False)
    clean(peers)
    empty_registry()
    reg3, _ = copy(first, peers, stream=False)
    # flag-only: every peer holds plans[0]'s engine + launch; plans[1] / plans[2] differ by one flag
    flag1, tf1 = copy([plans[1].engine_tag, plans[1].launch_tag], [b])
    flag3, tf3 = copy([plans[2].engine_tag, plans[2].launch_tag], peers)
    assert {t.via for t in tf1 + tf3 if not t.skipped} == {"registry"}
    return {
        "launch_image_bytes": size, "nodes": len(inv.nodes), "cpus": os.cpu_count(),
        "first_copy_one_peer": {
            "baseline_docker_save_ssh_load_s": [round(x, 2) for x in base_s],
            "sparkctl_first_copy_s": [round(x, 2) for x in first_s],
            "ratio_per_round": [round(x / y, 3) for x, y in zip(base_s, first_s)],
            "ratio_baseline_over_first_copy_median": round(statistics.median(base_s) / statistics.median(first_s), 3),
            "ratio_baseline_over_first_copy_best": round(min(base_s) / min(first_s), 3)},
        "first_copy_stream_three_peers_s": round(stream3, 2),
        "ratio_stream_three_over_one": round(stream3 / statistics.median(first_s), 3),
        "first_copy_registry_one_peer_s": round(reg1, 2),
        "first_copy_registry_three_peers_s": round(reg3, 2),
        "ratio_registry_three_over_one": round(reg3 / reg1, 3),
        "ratio_registry_over_stream_first_copy": round(reg1 / statistics.median(first_s), 3),
        "flag_only_right_after_stream_one_peer_s": round(after_stream, 2),
        "flag_only_right_after_stream_fabric_bytes": after_stream_bytes,
        "flag_only_one_peer_s": round(flag1, 2),
        "flag_only_three_peers_s": round(flag3, 2),
        "flag_only_fabric_bytes_three_peers": sum(t.rx_bytes for t in tf3),
    }


if __name__ == "__main__":
    main()
