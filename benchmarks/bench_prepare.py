"""Benchmark (not a test): `sparkctl prepare` on the real two-node test cluster.

Needs root, like tests/cluster. In one run:
  - brings the test cluster up (prefix/net from SPARKCTL_TEST_CLUSTER_PREFIX/NET, default `bprep`/200; no engine
    image), runs prepare once (the changing run), then no-change runs with SSH pipelining + ControlPersist
    (sparkctl's settings) and without pipelining, and prints the times and their ratio;
  - syncs a model directory of --mib MiB from spark-a to spark-b (models.yml: rsync over the fabric SSH) and
    streams the same bytes over the same fabric link twice: through ssh (`cat | ssh peer 'cat >/dev/null'`, the
    transport rsync uses) and as a plain TCP stream (python sockets, no encryption); prints MB/s and ratios.
Run:  .venv/bin/python benchmarks/bench_prepare.py [--mib 256] [--runs 3] [--tags docker,fabric] [--smoke]
--smoke: one run each, 8 MiB, prepare's plays limited to --tags fabric-ssh,drop-caches (the `always` tasks and what
the model sync needs; not the docker tasks, whose daemon.json change restarts both nodes' dockerd, here and again at
the restore), on the test cluster testrig.benchrig.bench_cluster names (a test session's: prepare restores what it
changed on the nodes after) or one of its own (CI's smoke run: the code path, not the figures).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sparkctl.config.inventory import load_inventory  # noqa: E402
from sparkctl.prepare import runner  # noqa: E402
from sparkctl.prepare.plays import prepare  # noqa: E402
from sparkctl.prepare.runner import PLAYBOOK_DIR, run_playbook  # noqa: E402
from testrig.benchrig import bench_cluster  # noqa: E402

SSH_FABRIC = ["ssh", "-i", "/root/.ssh/sparkctl_fabric_ed25519", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
              "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=/root/.ssh/sparkctl_fabric_known_hosts"]
TCP_RECV = ("import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
            "s.bind((sys.argv[1],5999));s.listen(1);c,_=s.accept();n=0\n"
            "while (b:=c.recv(1<<20)): n+=len(b)\nprint(n)")
TCP_SEND = ("import socket,sys,os,time\ntime.sleep(0.5);c=socket.create_connection((sys.argv[1],5999))\n"
            "for f in sorted(os.listdir(sys.argv[2])):\n  c.sendfile(open(os.path.join(sys.argv[2],f),'rb'))\n"
            "c.close()")


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sync-only", action="store_true", help="skip the no-change prepare timings")
    ap.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    ap.add_argument("--tags", default="", help="prepare's tags, comma-separated (default: every play)")
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.mib, args.tags = 1, 8, args.tags or "fabric-ssh,drop-caches"
    work = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    os.environ["SPARKCTL_STATE_DIR"] = str(work / "state")
    with bench_cluster(work / "cluster", os.environ.get("SPARKCTL_TEST_CLUSTER_PREFIX", "bprep"),
                       int(os.environ.get("SPARKCTL_TEST_CLUSTER_NET", "200")), build_image=False) as (cluster,
                                                                                                       attached):
        _run(args, cluster, attached)


def _run(args: argparse.Namespace, cluster, attached: bool) -> None:
    inv = load_inventory(cluster.inventory_path)
    tags = [t for t in args.tags.split(",") if t] or None
    try:
        first, res = timed(lambda: prepare(inv, tags=tags))
        print(f"prepare, first run: {first:.1f}s, changed {({h: s['changed'] for h, s in res.stats.items()})}")
        fast: list[float] = []
        rounds = 0
        for _ in range(0 if args.sync_only else args.runs):
            t, res = timed(lambda: prepare(inv, tags=tags))
            assert all(s["changed"] == 0 for s in res.stats.values()), res.stats
            fast.append(t)
            # task rounds that ran a module on a node (skipped ones cost no round trip)
            rounds = len({(run.playbook, r.task) for run in res.runs for r in run.results if r.status != "skipped"})
        slow: list[float] = []
        for _ in range(0 if args.sync_only else args.runs):
            t, run = timed(lambda: run_playbook(inv, "prepare.yml", tags=tags, env={"ANSIBLE_PIPELINING": "False"}))
            run.raise_for_failures()
            slow.append(t)
        floor: list[float] = []
        if rounds:
            # Ansible's own floor here: the same number of task rounds of `ping` (a no-op module), same settings
            floor_book = PLAYBOOK_DIR / "bench-floor.yml"
            floor_book.write_text("- hosts: all\n  become: true\n  gather_facts: false\n  tasks:\n"
                                  + "".join(f"    - name: no-op {i}\n      ansible.builtin.ping:\n"
                                            for i in range(rounds)))
            known = runner.PLAYBOOKS
            # run_playbook accepts only the shipped playbooks: the floor one is added for this run
            runner.PLAYBOOKS = (*known, floor_book.name)  # type: ignore[assignment]
            try:
                for _ in range(args.runs):
                    t, run = timed(lambda: run_playbook(inv, floor_book.name))
                    run.raise_for_failures()
                    floor.append(t)
            finally:
                runner.PLAYBOOKS = known
                floor_book.unlink()
        if fast:
            f, s = statistics.median(fast), statistics.median(slow)
            print(f"no-change prepare, both nodes: {f:.1f}s median of {args.runs} (pipelining + ControlPersist); "
                  f"without pipelining {s:.1f}s; ratio {s / f:.2f}x; {rounds} task rounds, {f / rounds:.2f}s each; "
                  f"load average {os.getloadavg()[0]:.1f}")
            fl = statistics.median(floor)
            print(f"Ansible's floor here: {rounds} rounds of ping {fl:.1f}s ({fl / rounds:.2f}s each); no-change "
                  f"prepare / floor {f / fl:.2f}")

        a = Path(inv.node("spark-a").host_paths.models) / "bench-model"
        a.mkdir(parents=True, exist_ok=True)
        shard = 64 << 20
        left = args.mib << 20
        i = 0
        while left > 0:
            (a / f"shard-{i:03d}.safetensors").write_bytes(os.urandom(min(shard, left)))
            left -= shard
            i += 1
        total = args.mib << 20
        run = run_playbook(inv, "models.yml", extravars={"prepare_models": ["bench-model"]})
        run.raise_for_failures()
        rs = next(r for r in run.results if r.task == "Rsync over the fabric" and "item" in r.res
                  and r.status == "changed")
        h, m, sec = rs.res["delta"].split(":")
        t_rsync = int(h) * 3600 + int(m) * 60 + float(sec)
        peer = cluster.node("spark-b").fabric_address
        stream = ["sh", "-c", 'dir="$1"; shift; cat "$dir"/* | "$@"', "_", str(a), *SSH_FABRIC, f"root@{peer}",
                  "cat >/dev/null"]
        t_ssh, _ = timed(lambda: cluster.run_in_root("spark-a", stream, timeout=600))
        recv = subprocess.Popen([*cluster.roots["spark-b"].nsenter(), "python3", "-c", TCP_RECV, peer],
                                stdout=subprocess.PIPE, text=True)
        t_tcp, _ = timed(lambda: cluster.run_in_root("spark-a", ["python3", "-c", TCP_SEND, peer, str(a)],
                                                     timeout=600))
        got = int(recv.communicate(timeout=60)[0])
        t_tcp -= 0.5   # the sender's start delay
        assert got == total, (got, total)
        mb = total / 1e6
        print(f"model sync {args.mib} MiB spark-a -> spark-b over the fabric: rsync {mb / t_rsync:.0f} MB/s "
              f"({t_rsync:.2f}s); same bytes through ssh {mb / t_ssh:.0f} MB/s ({t_ssh:.2f}s); raw TCP "
              f"{mb / t_tcp:.0f} MB/s ({t_tcp:.2f}s); rsync/ssh {t_ssh / t_rsync:.2f}, rsync/tcp "
              f"{t_tcp / t_rsync:.2f}")
    finally:
        if attached:     # a test session's cluster: its nodes as they were (what prepare changed, put back)
            prepare(inv, restore=True)
            for node in inv.nodes:
                shutil.rmtree(Path(node.host_paths.models) / "bench-model", ignore_errors=True)


if __name__ == "__main__":
    main()
