"""Benchmark (not a test): sparkctl on the real SGLang 0.5.23 engine (CPU, tiny model), against the engine alone.

One run, on a real-engine embedded cluster (testrig.realengine; built if missing), for TP=1 and TP=2:
  1. `sparkctl up --profile cpu-tiny[-tp1]` in a fresh process: wall time, and its warm-up requests' service
     time and verify step as recorded in its --json result;
  2. `down`, then the same engine commands `up` ran (the runtime's own argv and environment, rank N-1 first) started
     by hand, polling rank 0's /health until 200 (SGLang answers 503 until its own warm-up): the engine's boot;
  3. sparkctl's overhead = up wall - boot by hand - warm-up requests (target <= 1.5 s), with and without the
     verify step (its smoke generation is engine work; its /health, /v1/models and /server_info reads are not).
Then, on one TP=2 deployment, the card (`sparkctl bench`: decode tok/s and TTFT at c=1) against SGLang's own
`python -m sglang.benchmark.serving` (random-ids, same output length, same prompt size, c=1) on the same server:
decode tok/s (1 / median TPOT) and median TTFT, and their ratio (target: within 2%).

Real boot figures move with the machine's load (2 shared cores here): read the ratios of one run, not absolutes.
Run:
    .venv/bin/python benchmarks/bench_real_engine.py [--runs 3] [--max-tokens 64] [--skip-card]
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

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _sparkctl(env: dict[str, str], *args: str, timeout: float = 900) -> tuple[float, dict]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "sparkctl", *args, "--json"], env=env, capture_output=True, text=True,
                       timeout=timeout)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"sparkctl {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return wall, json.loads(p.stdout)


def _by_hand(inventory_path: Path, profile: str) -> float:
    """Start the ranks as `up` would (same argv and engine environment, rank N-1 .. 0), time to rank 0's /health 200;
    then stop them."""
    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy.cluster import Cluster

    inv = load_inventory(inventory_path)
    cluster = Cluster(inv)
    specs = sorted(cluster.render(load_profile(profile)).specs, key=lambda s: -s.rank)
    runtimes = cluster.runtimes("by-hand")
    procs = []
    t0 = time.perf_counter()
    try:
        for spec in specs:
            argv = runtimes.for_node(spec.node).launch_argv(spec, "by-hand")
            env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True))
        url = Cluster.endpoint(next(s for s in specs if s.rank == 0)) + "/health"
        while True:
            try:
                if httpx.get(url, timeout=2, trust_env=False).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            if any(p.poll() is not None for p in procs):
                raise SystemExit(f"a rank started by hand exited ({[p.returncode for p in procs]})")
            time.sleep(0.1)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
            p.wait()


def _warm_s(res: dict) -> float:
    warm = res.get("warmup") or {}
    return (warm["cold"]["elapsed_s"] if warm.get("cold") else 0) + sum(w["elapsed_s"] for w in warm.get("warm", []))


def _card(env: dict[str, str], out: Path, max_tokens: int, runs: int) -> dict:
    _sparkctl(env, "bench", "--runs", str(runs), "--max-tokens", str(max_tokens), "--warmup", "1",
              "--ttft-sizes", "256", "--ttft-runs", str(runs), "--concurrency", "1", "--gates", "decode,ttft",
              "--out", str(out), timeout=1800)
    return json.loads((out / "report.json").read_text())


def _bench_serving(engine, endpoint: str, served: str, input_len: int, output_len: int, runs: int,
                   tmp: Path) -> dict:
    result = tmp / "bench_serving.jsonl"
    argv = [str(engine.python), "-m", "sglang.benchmark.serving", "--backend", "sglang", "--base-url", endpoint,
            "--dataset-name", "random-ids", "--random-input-len", str(input_len), "--random-output-len",
            str(output_len), "--random-range-ratio", "1.0", "--num-prompts", str(runs), "--max-concurrency", "1",
            "--request-rate", "inf", "--tokenizer", str(engine.model), "--model", served, "--served-model-name",
            served, "--disable-tqdm", "--warmup-requests", "1", "--output-file", str(result)]
    # sglang.benchmark.serving imports HF `datasets` at module level (for the mmmu dataset) and the real-engine venv
    # does not carry it: a stub module answers that import (random-ids never calls it)
    stub = tmp / "stub"
    (stub / "datasets").mkdir(parents=True, exist_ok=True)
    (stub / "datasets" / "__init__.py").write_text(
        "def load_dataset(*a, **k):\n    raise RuntimeError('datasets is not in the real-engine venv')\n")
    env = {**os.environ, **engine.env(), "PYTHONPATH": str(stub)}
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800, cwd=str(tmp))
    if p.returncode != 0:
        raise SystemExit(f"sglang.benchmark.serving exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return json.loads(result.read_text().strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="measured requests per figure of the card comparison")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--skip-card", action="store_true", help="only the up-vs-by-hand part")
    args = ap.parse_args()
    from testrig.embedded import stop_recorded_engines, write_real_engine_inventory
    from testrig.realengine import ensure_real_engine

    engine = ensure_real_engine()
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        invs = {1: write_real_engine_inventory(tmp / "inventory-1.yml", engine, prefix="rb", nodes=1),
                2: write_real_engine_inventory(tmp / "inventory-2.yml", engine, prefix="rb")}
        profiles = tmp / "profiles"
        profiles.mkdir()
        (profiles / "cpu-tiny-tp1.yml").write_text("extends: cpu-tiny\nserver:\n  tp_size: 1\n")
        base_env = dict(os.environ, SPARKCTL_STATE_DIR=str(tmp / "state"), SPARKCTL_PROFILES_DIR=str(profiles))
        card = serving = None
        env = base_env
        try:
            for profile, nodes in (("cpu-tiny-tp1", 1), ("cpu-tiny", 2)):
                inv = invs[nodes]
                env = dict(base_env, SPARKCTL_INVENTORY=str(inv))
                os.environ.update({k: env[k] for k in ("SPARKCTL_STATE_DIR", "SPARKCTL_INVENTORY",
                                                       "SPARKCTL_PROFILES_DIR")})
                wall, res = _sparkctl(env, "up", "--profile", profile, "--yes")
                stages = {s["name"]: s["elapsed_s"] for s in res["stages"]}
                if profile == "cpu-tiny" and not args.skip_card:
                    card = _card(env, tmp / "card", args.max_tokens, args.runs)
                    dec = card["arms"][0]["results"]["decode"]["classes"]
                    prompt = int(statistics.median(r["prompt_tokens"] for c in dec.values() for r in c["runs"]))
                    serving = (prompt, _bench_serving(engine, res["endpoint"], "tiny-qwen2", prompt,
                                                      args.max_tokens, args.runs, tmp),
                               _bench_serving(engine, res["endpoint"], "tiny-qwen2", 256, 8, args.runs, tmp))
                _sparkctl(env, "down", "--yes")
                hand = _by_hand(inv, profile)
                warm = _warm_s(res)
                rows.append({"profile": profile, "wall": wall, "hand": hand, "warm": warm,
                             "verify": stages.get("verify", 0.0), "stages": stages})
        finally:
            for inv in invs.values():
                subprocess.run([sys.executable, "-m", "sparkctl", "down", "--yes"],
                               env=dict(base_env, SPARKCTL_INVENTORY=str(inv)), capture_output=True)
                os.environ["SPARKCTL_INVENTORY"] = str(inv)
                stop_recorded_engines(inv)
    print(f"real SGLang 0.5.23 on CPU ({os.cpu_count()} cores), tiny model {engine.model}")
    for r in rows:
        over = r["wall"] - r["hand"] - r["warm"]
        st = ", ".join(f"{k} {v:.2f}s" for k, v in r["stages"].items())
        print(f"  {r['profile']:<13} up wall {r['wall']:.2f}s; by hand to /health 200 {r['hand']:.2f}s; warm-up "
              f"requests {r['warm']:.2f}s; verify {r['verify']:.2f}s")
        print(f"  {'':<13} sparkctl overhead {over:.2f}s incl. verify, {over - r['verify']:.2f}s excl. verify "
              f"(up/by-hand ratio {r['wall'] / r['hand']:.3f})  [{st}]")
    if card and serving:
        prompt, dec_ref, ttft_ref = serving
        res = card["arms"][0]["results"]
        dec = [r["decode_tok_s"] for c in res["decode"]["classes"].values() for r in c["runs"] if r["decode_tok_s"]]
        card_dec = statistics.median(dec)
        ref_dec = 1000.0 / dec_ref["median_tpot_ms"]
        size = next(s for s in res["ttft"]["sizes"] if s["status"] == "measured")
        card_ttft = size["ttft_s"]["median"] * 1000
        ref_ttft = ttft_ref["median_ttft_ms"]
        print(f"card vs sglang.benchmark.serving on the same TP=2 server (c=1, {args.runs} requests each):")
        print(f"  decode: card {card_dec:.2f} tok/s (median of {len(dec)} runs, {args.max_tokens} tokens) vs "
              f"1/median TPOT {ref_dec:.2f} tok/s (random-ids, {prompt} in / {args.max_tokens} out): ratio "
              f"{card_dec / ref_dec:.3f}")
        print(f"  TTFT ~{size['target_tokens']} tokens: card {card_ttft:.1f} ms vs median TTFT {ref_ttft:.1f} ms "
              f"(random-ids 256 in / 8 out): ratio {card_ttft / ref_ttft:.3f}")


if __name__ == "__main__":
    main()
