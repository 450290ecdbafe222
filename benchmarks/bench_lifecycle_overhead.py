"""Benchmark (not a test): how much time `sparkctl up` adds on top of the engine's own work.

On an embedded cluster (loopback addresses of its own, emulator boot_s configured), in one run:
  1. `sparkctl up --profile d5` as a user runs it (a fresh process), wall time;
  2. the engine's share: the emulator's configured boot time + the warm-up and verify requests' service
     time as the client measured them (read from the deployment record);
  3. orchestration overhead = 1 - 2 (target < 1 s);
  4. a no-op `up` on the healthy deployment (target < 1 s), and the same without interpreter start-up.
Prints ratios measured in this one run (the machine is shared and noisy). Run:
    .venv/bin/python benchmarks/bench_lifecycle_overhead.py [--boot-s 3] [--runs 3] [--smoke]
--smoke: one run, boot_s 0.3, decode_tps 4000 (CI's smoke run: the code path, not the figures).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testrig.benchrig import compile_sparkctl  # noqa: E402


def _inventory(tmp: Path, boot_s: float, decode_tps: float) -> Path:
    from testrig.embedded import write_embedded_inventory
    return write_embedded_inventory(tmp / "inventory.yml", {"boot_s": boot_s, "decode_tps": decode_tps}, prefix="bench")


def _sparkctl(env: dict[str, str], *args: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "sparkctl", *args, "--json"], env=env, capture_output=True,
                         text=True, check=True)
    return time.perf_counter() - t0, json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--boot-s", type=float, default=3.0, help="emulator boot time (s)")
    ap.add_argument("--decode-tps", type=float, default=400.0, help="emulator decode rate (tok/s)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    args = ap.parse_args()
    print(compile_sparkctl())
    if args.smoke:
        args.runs, args.boot_s, args.decode_tps = 1, 0.3, 4000.0
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        env = dict(os.environ, SPARKCTL_STATE_DIR=str(tmp / "state"),
                   SPARKCTL_INVENTORY=str(_inventory(tmp, args.boot_s, args.decode_tps)))
        rows, noops = [], []
        try:
            for i in range(args.runs):
                profile = "d5" if i % 2 == 0 else "dflash-off"   # alternate so every run really deploys
                wall, res = _sparkctl(env, "up", "--profile", profile, "--yes")
                stages = {s["name"]: s["elapsed_s"] for s in res["steps"]}
                warm = res["warmup"]
                service = (warm["cold"]["elapsed_s"] if warm["cold"] else 0) + sum(w["elapsed_s"] for w in warm["warm"])
                engine = args.boot_s + service
                rows.append({"profile": profile, "wall": wall, "engine": engine, "overhead": wall - engine,
                             "stages": stages})
            for _ in range(args.runs):
                wall, res = _sparkctl(env, "up", "--profile", rows[-1]["profile"], "--yes")
                assert res["outcome"] == "unchanged", res
                noops.append(wall)
            # in-process no-op (interpreter start-up excluded)
            os.environ.update(env)
            from sparkctl.config.inventory import resolve_inventory
            from sparkctl.config.profile import load_profile
            from sparkctl.deploy.commands import Deployer, UpOptions
            d = Deployer(resolve_inventory(None))
            inproc = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                assert d.up(load_profile(rows[-1]["profile"]), UpOptions()).outcome == "unchanged"
                inproc.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import sparkctl.cli.main"], env=env, check=True)
            startup = time.perf_counter() - t0
        finally:
            subprocess.run([sys.executable, "-m", "sparkctl", "down", "--yes"], env=env, capture_output=True)
    print(f"emulator boot_s={args.boot_s}, decode_tps={args.decode_tps}, runs={args.runs}")
    for r in rows:
        st = ", ".join(f"{k} {v:.2f}s" for k, v in r["stages"].items())
        print(f"  up {r['profile']:<10} wall {r['wall']:.2f}s = engine {r['engine']:.2f}s "
              f"(boot {args.boot_s:.2f} + requests {r['engine'] - args.boot_s:.2f}) + overhead {r['overhead']:.2f}s"
              f"  [{st}]")
    ov = [r["overhead"] for r in rows]
    print(f"orchestration overhead: median {statistics.median(ov):.2f}s (min {min(ov):.2f}, max {max(ov):.2f}); "
          f"wall/engine ratio median {statistics.median(r['wall'] / r['engine'] for r in rows):.3f}")
    print(f"no-op up (new process): median {statistics.median(noops):.2f}s (min {min(noops):.2f}, "
          f"max {max(noops):.2f}); in-process {statistics.median(inproc) * 1000:.0f} ms; "
          f"interpreter + CLI import {startup:.2f}s")


if __name__ == "__main__":
    main()
