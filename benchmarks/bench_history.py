"""Benchmark (not a test): what a long ledger history costs the commands that look across it.

The ledger keeps every deployment. On an embedded cluster: one real `up`, `down`, `up` (so one deployment is active
and one was stopped by `down`), then the same state directory twice: as it is, and with HISTORY older deployments
added (copies of the downed record, each with handles of its own whose processes are gone: testrig/history.py).
Each command runs as a user runs it (a fresh process), the two histories interleaved, and prints its median wall
time on each and the ratio, measured in this one run (the machine is shared and noisy).
Run:  .venv/bin/python benchmarks/bench_history.py [--history 300] [--runs 5] [--smoke]
--smoke: a history of 20, one run each (CI's smoke run: the code path, not the figures).
"""
from __future__ import annotations

import argparse
import json
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

from testrig.benchrig import compile_sparkctl  # noqa: E402

COMMANDS = (("status", "--json"), ("down", "--dry-run"), ("doctor", "--json", "--no-kernel-log"))


def _sparkctl(env: dict[str, str], *args: str, check: bool = True) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "sparkctl", *args], env=env, capture_output=True, text=True)
    if check and p.returncode not in (0, 8):
        raise SystemExit(f"sparkctl {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0, p.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--history", type=int, default=300, help="older deployments added to the long history")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    args = ap.parse_args()
    print(compile_sparkctl())
    if args.smoke:
        args.history, args.runs = 20, 1
    from sparkctl.config.inventory import load_inventory
    from sparkctl.state.ledger import Ledger
    from testrig.embedded import stop_recorded_engines, write_embedded_inventory
    from testrig.history import add_history

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        inv = write_embedded_inventory(tmp / "inventory.yml", {"boot_s": 0.3, "decode_tps": 4000}, prefix="hist")
        short = dict(os.environ, SPARKCTL_STATE_DIR=str(tmp / "short"), SPARKCTL_INVENTORY=str(inv))
        long = dict(short, SPARKCTL_STATE_DIR=str(tmp / "long"))
        try:
            _, out = _sparkctl(short, "up", "--profile", "d5", "--yes", "--json")
            downed = json.loads(out)["deployment"]
            _sparkctl(short, "down", "--yes")
            _sparkctl(short, "up", "--profile", "d5", "--yes")
            shutil.copytree(tmp / "short", tmp / "long", symlinks=True)
            name = load_inventory(inv).cluster.name
            ledger = Ledger(tmp / "long" / name)
            add_history(ledger, json.loads(ledger.deployment_path(downed).read_text()), 0, args.history)
            n_short = len(Ledger(tmp / "short" / name).record_ids())
            print(f"embedded cluster, one deployment active; histories of {n_short} and "
                  f"{len(ledger.record_ids())} deployments, {args.runs} run(s) each, interleaved")
            for command in COMMANDS:
                walls: dict[str, list[float]] = {"short": [], "long": []}
                for i in range(args.runs):
                    for which, env in (("short", short), ("long", long))[::1 if i % 2 == 0 else -1]:
                        walls[which].append(_sparkctl(env, *command)[0])
                s, lg = statistics.median(walls["short"]), statistics.median(walls["long"])
                print(f"{' '.join(command):34} {n_short} deployments {s:.3f} s; "
                      f"{n_short + args.history} deployments {lg:.3f} s; ratio {lg / s:.2f}")
        finally:
            os.environ["SPARKCTL_STATE_DIR"] = str(tmp / "short")
            stop_recorded_engines(inv)


if __name__ == "__main__":
    main()
