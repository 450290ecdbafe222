"""Benchmark (not a test): what a `sparkctl tune` of 12 candidates costs beyond its trials, and how good the
estimate printed after the first trial was.

On an embedded cluster of its own (emulator with the planted optimum of tests/tune/conftest.py), one run of
    sparkctl tune --profile t5 --vary speculative.num_draft_tokens=3,4,5,6,7,9 \
                  --vary server.mem_fraction_static=0.86,0.88 --runs 3 --max-tokens 161 --warmup 0
(12 candidates + the baseline, A B A B confirmation, restore), in a fresh process. Prints, from the journal:
the wall time of the command, the sum of the 13 trials, the confirmation, the restore, tune's own overhead
(wall - trials - confirmation - restore; includes interpreter start-up and the journal writes), and the estimate
after the first trial against the actual total. One run on a shared, noisy machine. Run:
    .venv/bin/python benchmarks/bench_tune_overhead.py [--smoke]
--smoke: 1 candidate (num_draft_tokens=4), one run of 32 tokens each, one A B confirmation round (CI's smoke run:
the code path, not the figures).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PLANTED = {"boot_s": 0.3, "decode_tps": 300, "verify_cost": 1.5, "verify_cost_per_token": 0.25,
           "accept_len_code": 4.6, "ttft_base_s": 0.01, "prefill_tps": 100000, "peer_timeout_s": 2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    smoke = ap.parse_args().smoke
    vary = (["--vary", "speculative.num_draft_tokens=4"] if smoke else
            ["--vary", "speculative.num_draft_tokens=3,4,5,6,7,9", "--vary", "server.mem_fraction_static=0.86,0.88"])
    runs = (["--runs", "1", "--max-tokens", "32", "--confirm-rounds", "1"] if smoke else
            ["--runs", "3", "--max-tokens", "161"])
    from testrig.embedded import stop_recorded_engines, write_embedded_inventory
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        profiles = tmp / "profiles"
        profiles.mkdir()
        (profiles / "t5.yml").write_text("extends: d5\nwarmup:\n  requests: 1\n  max_tokens: 16\n")
        inv = write_embedded_inventory(tmp / "inventory.yml", PLANTED, prefix="bench")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCTL_SIM_")}
        env.update(SPARKCTL_STATE_DIR=str(tmp / "state"), SPARKCTL_INVENTORY=str(inv),
                   SPARKCTL_PROFILES_DIR=str(profiles))
        try:
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "sparkctl", "-q", "tune", "--profile", "t5", *vary, *runs,
                                  "--warmup", "0", "--json"],
                                 env=env, capture_output=True, text=True, check=True, cwd=str(REPO))
            wall = time.perf_counter() - t0
        finally:
            os.environ.update(SPARKCTL_STATE_DIR=env["SPARKCTL_STATE_DIR"])
            stop_recorded_engines(inv)
    data = json.loads(out.stdout)
    tm, est = data["timing"], data["estimate"]
    trials = [t for t in data["trials"]]
    work = tm["trials_sum_s"] + tm.get("confirm_s", 0) + tm["restore_s"]
    print(f"candidates: {len(trials) - 1} (+ baseline); feasible {sum(t['status'] == 'feasible' for t in trials)}")
    print(f"winner: {data['winner'].get('changes') or data['winner'].get('why')}")
    print(f"wall (fresh process): {wall:.1f} s; journal total: {tm['total_s']:.1f} s")
    print(f"sum of trials: {tm['trials_sum_s']:.1f} s (median trial "
          f"{sorted(t['elapsed_s'] for t in trials)[len(trials) // 2]:.2f} s); confirmation "
          f"{tm.get('confirm_s', 0):.1f} s; restore {tm['restore_s']:.1f} s")
    print(f"tune's own overhead: {wall - work:.1f} s of {wall:.1f} s ({100 * (wall - work) / wall:.1f}%), "
          f"in-process {tm['total_s'] - work:.2f} s")
    print(f"estimate after the first trial ({est['after_trial_s']:.2f} s): {est['total_s']:.1f} s vs actual "
          f"{tm['total_s']:.1f} s ({100 * (est['total_s'] - tm['total_s']) / tm['total_s']:+.1f}%)")


if __name__ == "__main__":
    main()
