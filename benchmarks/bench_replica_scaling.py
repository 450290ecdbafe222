"""Benchmark (not a test): aggregate decode at concurrency 1, 2, 4, 8 through the router, 1 replica vs 2 replicas.

EMULATED: the engines are sparkctl's SGLang emulator with its performance model (sparkctl/sim/perf.py); the router is
the real sglang-router 0.3.2 (a local process). Each configuration is an embedded replicated deployment made by the
real `up` (ReplicatedDeployer: TP=1 replicas on loopback nodes) and measured by the real `sparkctl bench` library
call (cold request, then the concurrency gate: identical streamed requests started together, aggregate = total
completion tokens / (last finish - first start), per-replica split from the router's metrics). One run, ratios.

Two engine configurations, one run each:
  * capped: the seed's hybrid-model flags (--mamba-full-memory-ratio 2): the mamba state cache caps every engine to
    1 running request (`up` says "capped to 1 by the mamba state cache"), so a pair serialises at c2 as the seed's
    did (30.2 vs 29.4 tok/s) and a second replica is the only way to run two requests at once;
  * uncapped: no mamba flags (48 running requests): the engine batches, and a step costs the same up to
    batch_no_slowdown tokens (perf.step_seconds), so a second replica buys little at c <= 8.
Run:
    .venv/bin/python benchmarks/bench_replica_scaling.py [--decode-tps 200] [--max-tokens 200] [--only capped] [--smoke]
--smoke: capped only, concurrency 1 and 2, 16 tokens at 2,000 tok/s (CI's smoke run: the code path, not the figures).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparkctl.state.runs import RouterBench

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
LEVELS = (1, 2, 4, 8)


def _profile(path: Path, replicas: int, capped: bool) -> Path:
    mamba = "  mamba_full_memory_ratio: 2\n" if capped else ""
    path.write_text(f"description: {replicas} TP=1 replica(s) behind the router\nextends: base\nreplicas: {replicas}\n"
                    f"server:\n  tp_size: 1\n  enable_metrics: true\n{mamba}"
                    "router:\n  policy: round_robin\n  health_check_interval_s: 1\nwarmup:\n  requests: 0\n")
    return path


def _measure(tmp: Path, replicas: int, capped: bool, knobs: dict[str, Any], max_tokens: int,
             levels: tuple[int, ...]) -> tuple[RouterBench, str]:
    """One configuration deployed and benched through its router: the card's router section and its path."""
    from sparkctl.bench.run import BenchOptions, bench
    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy.replicated import ReplicatedDeployer
    from testrig.embedded import write_embedded_inventory

    name = f"{'capped' if capped else 'uncapped'}-{replicas}"
    inv = load_inventory(write_embedded_inventory(tmp / f"{name}.yml", knobs, nodes=replicas))
    d = ReplicatedDeployer(inv)
    try:
        d.up(load_profile(str(_profile(tmp / f"{name}-profile.yml", replicas, capped))))
        opts = BenchOptions(gates=("cold", "concurrency"), max_tokens=max_tokens, warmup=0, runs=1,
                            router_concurrency=levels, out_dir=tmp / f"{name}-card")
        record = bench(inv, opts)
    finally:
        d.down()
    if record.router is None:
        raise RuntimeError(f"{name}: the card has no router section: {record.files.get('markdown')}")
    return record.router, record.files["markdown"]


def _figure(value: float | None) -> float:
    """A level's aggregate; nan (printed as such) for one that was not measured."""
    return float("nan") if value is None else value


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--decode-tps", type=float, default=200.0, help="the emulator's per-stream decode rate")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--only", choices=("capped", "uncapped"), default=None)
    ap.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    a = ap.parse_args()
    levels: tuple[int, ...] = LEVELS
    if a.smoke:
        a.only, a.max_tokens, a.decode_tps, levels = "capped", 16, 2000.0, (1, 2)
    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")] + ["SPARKCTL_API_KEY"]:
        os.environ.pop(key, None)
    tmp = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    os.environ["SPARKCTL_STATE_DIR"] = str(tmp / "state")
    knobs = {"boot_s": 0.3, "decode_tps": a.decode_tps, "peer_timeout_s": 2, "ttft_base_s": 0.002}
    print(f"[EMULATED] aggregate decode through the router (sglang-router 0.3.2), tok/s; emulator decode_tps "
          f"{a.decode_tps:g}, max_tokens {a.max_tokens}, TP=1 replicas, one run")
    for capped in ((True, False) if a.only is None else (a.only == "capped",)):
        runs = {k: _measure(tmp, k, capped, knobs, a.max_tokens, levels) for k in (1, 2)}
        rows = {k: {lv.concurrency: _figure(lv.aggregate_tok_s) for lv in r.levels} for k, (r, _) in runs.items()}
        caps = [x.max_running_requests for x in runs[2][0].replicas]
        print(f"\n{'capped' if capped else 'uncapped'}: max_running_requests per replica {caps}"
              + (" (the mamba state cache)" if capped else ""))
        print("  concurrency   " + "".join(f"{c:>10}" for c in levels))
        for k in (1, 2):
            print(f"  {k} replica{'s' if k > 1 else ' '}    " + "".join(f"{rows[k][c]:10.1f}" for c in levels))
        print("  ratio 2/1     " + "".join(f"{rows[2][c] / rows[1][c]:10.2f}" for c in levels))
        print("  vs c1, 1 rep  " + "".join(f"{rows[1][c] / rows[1][1]:10.2f}" for c in levels))
        split = ["/".join("-" if s.requests is None else f"{s.requests:g}" for s in lv.replicas)
                 for lv in runs[2][0].levels]
        print("  2-replica split, requests per replica (router metrics): "
              + ", ".join(f"c{c} {s}" for c, s in zip(levels, split)))
        print(f"  cards: {runs[1][1]}  {runs[2][1]}")


if __name__ == "__main__":
    main()
