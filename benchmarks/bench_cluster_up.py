"""Benchmark (not a test): `sparkctl up` on the real two-node test cluster (SSH + Docker), split by stage,
and the SSH/Docker path's overhead against the embedded process runtime for the same emulator boot time.

Needs root (network namespaces, dockerd, sshd), like tests/cluster. In one run:
  - brings the test cluster up (prefix `bnch`, its own subnets; engine image cached between runs),
  - `up --profile d5` then `up --profile dflash-off` on it, and the same two on an embedded cluster,
  - prints each stage's time per runtime and the docker/process ratio.
Run:  .venv/bin/python benchmarks/bench_cluster_up.py [--boot-s 3] [--decode-tps 2000] [--smoke]
--smoke: `up --profile d5` only, boot_s 0.3, on the test cluster testrig.benchrig.bench_cluster names (a test
session's, left up) or one of its own (CI's smoke run: the code path, not the figures).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sparkctl.nodes.container import MEMLOCK_ENV  # noqa: E402
from testrig.benchrig import bench_cluster  # noqa: E402
from testrig.embedded import write_embedded_inventory  # noqa: E402


def _up(env: dict[str, str], profile: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "sparkctl", "up", "--profile", profile, "--yes", "--json"], env=env,
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"up {profile} failed:\n{res.stderr[-3000:]}")
    return time.perf_counter() - t0, json.loads(res.stdout)


def _down(env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "sparkctl", "down", "--yes"], env=env, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--boot-s", type=float, default=3.0)
    ap.add_argument("--decode-tps", type=float, default=2000.0)
    ap.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    args = ap.parse_args()
    profiles: tuple[str, ...] = ("d5", "dflash-off")
    if args.smoke:
        args.boot_s, profiles = 0.3, ("d5",)
    sim = {"boot_s": args.boot_s, "decode_tps": args.decode_tps}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        t0 = time.perf_counter()
        with bench_cluster(tmp / "cluster", "bnch", 5) as (cluster, attached):
            bring_up = time.perf_counter() - t0
            doc = yaml.safe_load(Path(cluster.inventory_path).read_text())
            for host in doc["all"]["children"]["sparks"]["hosts"].values():   # the model + drafter dirs
                for name in ("GLM-5.3-Flash-NVFP4", "GLM-5.3-Flash-DFlash2"):
                    Path(host["host_paths"]["models"], name).mkdir(parents=True, exist_ok=True)
            doc["all"]["vars"]["sparkctl_sim"] = sim
            docker_inv = tmp / "docker.yml"
            docker_inv.write_text(yaml.safe_dump(doc))
            local_inv = write_embedded_inventory(tmp / "local.yml", sim, prefix="bench")
            base = dict(os.environ, SPARKCTL_STATE_DIR=str(tmp / "state"))
            hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
            if hard != resource.RLIM_INFINITY:
                base[MEMLOCK_ENV] = str(hard)
            results: dict[str, list[tuple[str, float, dict]]] = {}
            for kind, inv in (("docker", docker_inv), ("process", local_inv)):
                env = dict(base, SPARKCTL_INVENTORY=str(inv))
                try:
                    for profile in profiles:
                        wall, res = _up(env, profile)
                        results.setdefault(kind, []).append((profile, wall, res))
                finally:
                    _down(env)
    if attached:
        print(f"test cluster: the session's, up already ({cluster.name_prefix})")
    else:
        print(f"test cluster bring-up {bring_up:.1f}s "
              f"({', '.join(f'{k} {v:.1f}s' for k, v in cluster.timings.items())})")
    print(f"emulator boot_s={args.boot_s}, decode_tps={args.decode_tps}")
    stages = ["preflight", "image", "stop-old", "boot", "warm-up", "verify"]
    print(f"{'runtime':<8} {'profile':<11} {'wall':>6} " + " ".join(f"{s:>9}" for s in stages))
    for kind, rows in results.items():
        for profile, wall, res in rows:
            st = {s["name"]: s["elapsed_s"] for s in res["steps"]}
            print(f"{kind:<8} {profile:<11} {wall:6.2f} " + " ".join(f"{st.get(s, 0):9.2f}" for s in stages))
    for i, profile in enumerate(profiles):
        d, p = results["docker"][i][1], results["process"][i][1]
        print(f"{profile}: docker/process wall ratio {d / p:.2f} (SSH+Docker path adds {d - p:.2f}s)")


if __name__ == "__main__":
    main()
