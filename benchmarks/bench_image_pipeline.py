"""Benchmark (not a test): the image pipeline on the real two-node test cluster, in one run.

Needs root (like tests/cluster). Brings up a test cluster (prefix/net from SPARKCTL_TEST_CLUSTER_PREFIX/NET,
default `bimg`/6), builds the SGLang 0.5.23 test base on spark-a, then measures:
  1. full: engine (patch series applied in docker build) + launch build on spark-a, then copy to spark-b, from a
     clean state (no pipeline images on either node, empty registry cache, spark-b without the base);
  2. flag-only: one SGLang flag changed -> launch build + copy;
  3. bytes on spark-b's fabric interface for the flag-only copy vs the launch image's size;
  4. the full copy's throughput (fabric bytes / pull time, which includes spark-b unpacking the layers) vs a raw
     stream of the same registry blobs over SSH between the same fabric addresses (`cat | ssh peer cat`, the
     issue's baseline), vs a raw TCP stream of them (what the link alone gives, no encryption), and vs
     spark-b's own `docker load` of the same image from local disk (the unpack ceiling, no network); the pull is
     also measured over its wire window (first to last byte on spark-b's fabric interface, sampled every 5 ms);
  5. for reference, the old way: `docker save | docker load` of the whole launch image through the controller.
Every copy here goes through the registry (``distribute(..., stream=False)``); the first-copy stream and the
copy to three peers at once are benchmarks/bench_image_fanout.py.
Run:  SPARKCTL_TEST_CLUSTER_PREFIX=pa SPARKCTL_TEST_CLUSTER_NET=3 .venv/bin/python benchmarks/bench_image_pipeline.py
--smoke: the same run (it has no round to shorten: each step once), on the test cluster testrig.benchrig.bench_cluster
names (a test session's) or one of its own (CI's smoke run: the code path, not the figures), with images of a few
MB: the profile's base is testrig.benchrig.tiny_base (4 MiB, `docker import`ed on spark-a) with no patch series, and
spark-b loses only dangling layers (`docker image prune`, not `-a`: the session's engine image stays). Seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sparkctl.config.inventory import load_inventory  # noqa: E402
from sparkctl.config.profile import load_profile  # noqa: E402
from sparkctl.images import manage, pipeline  # noqa: E402
from sparkctl.images.build import build_images, ensure_base  # noqa: E402
from sparkctl.images.copy import distribute  # noqa: E402
from sparkctl.images.plan import plan_images  # noqa: E402
from sparkctl.images.registry import Endpoint, Registry  # noqa: E402
from sparkctl.nodes.ssh import SSHConnector  # noqa: E402
from sparkctl.prepare.plays import prepare  # noqa: E402
from testrig.benchrig import bench_cluster, drop_smoke_images, tiny_base  # noqa: E402
from testrig.engine_image import EngineImages  # noqa: E402

_SERVE = ("import os,socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
          "s.bind((sys.argv[1],int(sys.argv[2])));s.listen(1);c,_=s.accept()\n"
          "for p in sys.argv[3:]:\n    f=open(p,'rb');c.sendfile(f);f.close()\nc.close()\n")
_RECV = ("import socket,sys,time\nt=time.time();c=socket.create_connection((sys.argv[1],int(sys.argv[2])),10)\n"
         "n=0\nwhile True:\n    b=c.recv(1<<20)\n    if not b: break\n    n+=len(b)\nprint(n,time.time()-t)\n")


def _profile(base_tag: str, watchdog: int, smoke: bool = False):
    prof = load_profile("d5")
    image = {"base_image": base_tag} | ({"patch_series": None} if smoke else {})   # the tiny base has no Python
    prof = prof.model_copy(update={"image": prof.image.model_copy(update=image)})
    return prof.model_copy(update={"server": prof.server.model_copy(update={"watchdog_timeout": watchdog})})


def _build_and_copy(prof, inv, a, src, dst):
    t0 = time.perf_counter()
    plan = plan_images(prof, inv, ensure_base(a, prof.image.base_image, node="spark-a", pull=False))
    steps = build_images(plan, a)
    t1 = time.perf_counter()
    transfers = distribute([plan.engine_tag, plan.launch_tag], src, [dst], stream=False)   # the registry path
    t2 = time.perf_counter()
    return plan, steps, transfers, t1 - t0, t2 - t1


def main() -> None:
    prefix = os.environ.get("SPARKCTL_TEST_CLUSTER_PREFIX", "bimg")
    net = int(os.environ.get("SPARKCTL_TEST_CLUSTER_NET", "6"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    smoke = ap.parse_args().smoke
    with tempfile.TemporaryDirectory() as tmpdir, bench_cluster(Path(tmpdir) / "cluster", prefix, net) as (
            cluster, attached):
        made: list[str] = []
        conns: dict[str, SSHConnector] = {}
        try:
            inv = load_inventory(cluster.inventory_path)
            conns = pipeline.connections(inv)
            a, b = conns["spark-a"], conns["spark-b"]
            base_tag = tiny_base(a) if smoke else EngineImages(cluster).ensure_sglang_base("spark-a")
            src, dst = Endpoint.of(inv, inv.node("spark-a")), Endpoint.of(inv, inv.node("spark-b"))
            manage.prune_images(conns, keep=set())                       # clean state: spark-b holds no image
            # smoke: the tiny base shares no layer with the session's engine image, which stays
            b.run(["docker", "image", "prune", "-f" if smoke else "-af"], timeout=600, check=True)
            a.run(["rm", "-rf", f"{src.cache_dir}/sparkctl-registry"])
            run = int(time.time()) % 100_000

            plan1, _, t_full, full_build, full_copy = _build_and_copy(_profile(base_tag, 600 + run, smoke), inv, a,
                                                                      src, dst)
            plan2, steps2, t_flag, flag_build, flag_copy = _build_and_copy(_profile(base_tag, 601 + run, smoke), inv,
                                                                           a, src, dst)
            made[:] = list(dict.fromkeys((plan1.launch_tag, plan2.launch_tag, plan1.engine_tag, plan2.engine_tag)))
            full_pull = next(t for t in t_full if t.image == plan1.engine_tag)
            flag_rx = sum(t.rx_bytes for t in t_flag)
            size = int(a.run(["docker", "image", "inspect", "--format", "{{.Size}}", plan2.launch_tag]).stdout)

            # raw TCP stream of the same registry blobs over the same fabric link
            with Registry(src, [dst]) as reg:
                blobs = [f"{reg.storage}/docker/registry/v2/blobs/sha256/{d[7:9]}/{d[7:]}/data"
                         for d, _ in reg.manifest_layers(plan1.engine_tag)]
            port = "5056"
            a.run(["sh", "-c", 'exec python3 -c "$0" "$@" >/dev/null 2>&1 </dev/null &', _SERVE,
                   src.fabric_address, port, *blobs], check=True)
            time.sleep(0.5)
            raw_bytes, raw_s = (float(x) for x in b.run(["python3", "-c", _RECV, src.fabric_address, port],
                                                        check=True, timeout=600).stdout.split())

            # the same blobs as a raw stream over SSH on the same fabric link (the baseline: what every
            # `docker save | ssh | docker load` recipe is bound by), with the fabric key `prepare` installs
            prepare(inv, tags=["fabric-ssh"])
            t0 = time.perf_counter()
            a.run(["sh", "-c", 'cat "$@" | ssh -i /root/.ssh/sparkctl_fabric_ed25519 -o IdentitiesOnly=yes -o '
                   'BatchMode=yes -o UserKnownHostsFile=/root/.ssh/sparkctl_fabric_known_hosts '
                   f'root@{dst.fabric_address} "cat >/dev/null"', "_", *blobs], check=True, timeout=900)
            ssh_s = time.perf_counter() - t0

            # unpack ceiling on spark-b: docker load of the same image from its own disk (no network, no gzip)
            b.run(["docker", "save", "-o", "/tmp/sparkctl-bench.tar", plan2.launch_tag], check=True, timeout=600)
            b.run(["docker", "image", "prune", "-af"], timeout=600, check=True)
            b.run(["docker", "rmi", plan2.launch_tag, plan2.engine_tag, plan1.launch_tag], timeout=600)
            t0 = time.perf_counter()
            b.run(["docker", "load", "-q", "-i", "/tmp/sparkctl-bench.tar"], check=True, timeout=600)
            load_s = time.perf_counter() - t0
            b.run(["rm", "-f", "/tmp/sparkctl-bench.tar"])

            # the old way, for reference: whole launch image, docker save | docker load through the controller
            b.run(["docker", "rmi", plan2.launch_tag], timeout=600)
            b.run(["docker", "image", "prune", "-f" if smoke else "-af"], timeout=600)
            t0 = time.perf_counter()
            moved, _, _ = a.pipe_to(b, ["docker", "save", plan2.launch_tag], ["docker", "load"])
            old_s = time.perf_counter() - t0

            pull_rate = full_pull.rx_bytes / full_pull.seconds
            raw_rate = raw_bytes / raw_s
            out = {
                "full": {"build_s": round(full_build, 2), "copy_s": round(full_copy, 2),
                         "push_and_registry_s": round(full_copy - sum(t.seconds for t in t_full), 2),   # gzip
                         "pull_s": round(sum(t.seconds for t in t_full), 2),
                         "total_s": round(full_build + full_copy, 2),
                         "layers_sent": sum(x.sent for t in t_full for x in t.layers),
                         "fabric_bytes": sum(t.rx_bytes for t in t_full)},
                "flag_only": {"build_s": round(flag_build, 2), "copy_s": round(flag_copy, 2),
                              "total_s": round(flag_build + flag_copy, 2),
                              "rebuilt": [s.role for s in steps2 if s.built],
                              "layers_sent": sum(x.sent for t in t_flag for x in t.layers),
                              "fabric_bytes": flag_rx},
                "flag_vs_full_time": round((flag_build + flag_copy) / (full_build + full_copy), 4),
                "launch_image_bytes": size, "flag_bytes_vs_image_size": round(flag_rx / size, 6),
                "pull": {"fabric_bytes": full_pull.rx_bytes, "seconds": full_pull.seconds,
                         "MB_s": round(pull_rate / 1e6, 1), "wire_window_s": full_pull.wire_seconds,
                         "wire_MB_s": round(full_pull.rx_bytes / full_pull.wire_seconds / 1e6, 1)
                         if full_pull.wire_seconds else None},
                "raw_tcp_same_blobs": {"bytes": int(raw_bytes), "seconds": round(raw_s, 3),
                                       "MB_s": round(raw_rate / 1e6, 1)},
                "pull_vs_raw_throughput": round(pull_rate / raw_rate, 4),
                "ssh_stream_same_blobs": {"bytes": int(raw_bytes), "seconds": round(ssh_s, 3),
                                          "MB_s": round(raw_bytes / ssh_s / 1e6, 1)},
                "pull_vs_ssh_stream_throughput": round(pull_rate / (raw_bytes / ssh_s), 3),
                "copy_vs_ssh_stream_throughput": round((full_pull.rx_bytes / full_copy) / (raw_bytes / ssh_s), 3),
                "pull_wire_window_vs_raw_throughput": round(full_pull.rx_bytes / full_pull.wire_seconds / raw_rate, 3)
                if full_pull.wire_seconds else None,
                # the target: the peer transfer (bytes on the fabric while the pull receives them) vs SSH
                "pull_wire_window_vs_ssh_stream_throughput": round(ssh_s / full_pull.wire_seconds, 3)
                if full_pull.wire_seconds else None,
                # what any copy could reach end to end even if the transfer took no time: spark-b's docker still
                # registers the layers, which alone takes local_docker_load_s
                "end_to_end_ceiling_vs_ssh_stream": round(ssh_s / load_s, 3),
                "pull_image_bytes_per_s_vs_local_docker_load": round((size / full_pull.seconds) / (size / load_s), 3),
                "local_docker_load_s": round(load_s, 2),
                "old_save_load_via_controller": {"bytes": moved, "seconds": round(old_s, 2),
                                                 "MB_s": round(moved / old_s / 1e6, 1)},
            }
            print(json.dumps(out, indent=2))
        finally:
            if smoke:        # this run's images off both nodes, the tiny base's layers with them
                drop_smoke_images(conns, made)
            elif attached:   # spark-b's images were pruned: the session's engine image back where it was
                cluster.ensure_engine_image()


if __name__ == "__main__":
    main()
