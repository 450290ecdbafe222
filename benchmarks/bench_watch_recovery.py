"""Benchmark (not a test): how fast `sparkctl watch` sees a dead rank and brings the group back, against the
engine's own boot.

On an embedded cluster (loopback addresses of its own, emulator boot_s configured), in one run:
  1. `sparkctl up --profile d5`, then `sparkctl watch --interval I` as a user runs them (fresh processes);
  2. rank 1 killed (SIGKILL) `--runs` times, each once the cluster serves again;
  3. time to detect = the watcher's `detected_at` - the kill (target: <= 2 poll intervals);
  4. time to recover = its `recovered_at` - the kill, next to the restart's own stages read from the new
     deployment's record: boot (the engine's share: the emulator's boot_s plus process start), warm-up, verify.
Prints figures measured in this one run (the machine is shared and noisy). Run:
    .venv/bin/python benchmarks/bench_watch_recovery.py [--interval 0.5] [--boot-s 2] [--runs 3] [--smoke]
--smoke: one kill, boot_s 0.3 (CI's smoke run: the code path, not the figures).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _wait(pred, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise SystemExit(f"bench: timed out waiting for {what}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=0.5, help="the watcher's --interval (s)")
    ap.add_argument("--boot-s", type=float, default=2.0, help="the emulator's boot time (s)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.boot_s = 1, 0.3

    from sparkctl.config.inventory import load_inventory
    from sparkctl.nodes.handles import ProcessHandle
    from sparkctl.state.ledger import Ledger
    from sparkctl.state.watchfile import load_watch
    from testrig.embedded import stop_recorded_engines, write_embedded_inventory

    with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp_s:
        tmp = Path(tmp_s)
        inv = write_embedded_inventory(tmp / "inventory.yml", {"boot_s": args.boot_s, "decode_tps": 4000},
                                       prefix="bench")
        env = {**os.environ, "SPARKCTL_STATE_DIR": str(tmp / "state"), "SPARKCTL_INVENTORY": str(inv)}
        env.pop("SPARKCTL_API_KEY", None)
        os.environ.update({"SPARKCTL_STATE_DIR": env["SPARKCTL_STATE_DIR"], "SPARKCTL_INVENTORY": str(inv)})
        sparkctl = [sys.executable, "-m", "sparkctl"]
        up = subprocess.run(sparkctl + ["up", "--profile", "d5", "--yes", "--json"], env=env, cwd=REPO,
                            capture_output=True, text=True)
        if up.returncode != 0:
            raise SystemExit(f"bench: up failed:\n{up.stderr}")
        ledger = Ledger.for_cluster(load_inventory(inv).cluster.name)
        watcher = subprocess.Popen(sparkctl + ["watch", "--interval", str(args.interval), "-q"], env=env, cwd=REPO,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        rows = []
        try:
            _wait(lambda: (st := load_watch(ledger.root)) and st.healthy, "the watcher's first healthy check")
            for _ in range(args.runs):
                active = ledger.active()
                assert active is not None
                before = load_watch(ledger.root)
                t_kill = time.time()
                rank1 = active.handle_of(1)
                assert isinstance(rank1, ProcessHandle), f"rank 1 is not a local process: {rank1}"
                os.kill(rank1.pid, signal.SIGKILL)
                st = _wait(lambda b=before: (s := load_watch(ledger.root)) and s.detected_at and s.detected_at !=
                           b.detected_at and s, "the failure to be seen")
                detect = _ts(st.detected_at) - t_kill
                st = _wait(lambda b=before: (s := load_watch(ledger.root)) and s.recovered_at and s.recovered_at !=
                           b.recovered_at and s, "the recovery", timeout=300)
                recover = _ts(st.recovered_at) - t_kill
                new = ledger.active()
                assert new is not None and new.id != active.id
                stages = {s.name: s.elapsed_s or 0.0 for s in new.steps}
                rows.append({"detect": detect, "recover": recover, "boot": stages.get("boot", 0.0),
                             "warmup": stages.get("warm-up", 0.0), "verify": stages.get("verify", 0.0),
                             "up": new.elapsed_s or 0.0})
        finally:
            watcher.send_signal(signal.SIGTERM)
            watcher.wait(timeout=120)
            subprocess.run(sparkctl + ["down", "--yes"], env=env, cwd=REPO, capture_output=True)
            stop_recorded_engines(inv)

    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(f"sparkctl watch on the embedded cluster: interval {args.interval:g}s, emulator boot_s {args.boot_s:g}s, "
          f"{len(rows)} kills of rank 1 (median of the runs; each run listed below)")
    print(f"  time to detect:   {med['detect']:.2f}s = {med['detect'] / args.interval:.2f} poll intervals "
          f"(target <= 2)")
    print(f"  time to recover:  {med['recover']:.2f}s from the kill to serving again")
    print(f"  the restart's up: {med['up']:.2f}s, of which boot {med['boot']:.2f}s (the engine's own boot), "
          f"warm-up {med['warmup']:.2f}s, verify {med['verify']:.2f}s")
    print(f"  recover / engine boot: {med['recover'] / med['boot']:.2f}x; beyond boot + warm-up + verify: "
          f"{med['recover'] - med['boot'] - med['warmup'] - med['verify']:.2f}s (detection, stop of the survivor, "
          f"preflight, the watcher's own checks)")
    for i, r in enumerate(rows, 1):
        print(f"  run {i}: detect {r['detect']:.2f}s, recover {r['recover']:.2f}s, boot {r['boot']:.2f}s, "
              f"up {r['up']:.2f}s")
    print(json.dumps({"interval_s": args.interval, "boot_s": args.boot_s, "runs": rows}))


if __name__ == "__main__":
    main()
