"""Is the client the bottleneck? Measure an emulated 2,000 tok/s stream with the bench harness.

Starts one emulator process (speculation off, ``decode_tps`` = 2000, one token per streamed chunk),
runs ``sparkctl.bench.measure.measure_decode`` on the code prompt (5 runs x 2,000 tokens by default) and
prints measured/configured. Within 2% means the harness (httpx streaming, SSE parsing, per-frame
timestamps) keeps up with 2,000 chunks/s. Not collected by pytest; run it by hand:

    .venv/bin/python benchmarks/bench_harness_throughput.py [--rate 2000] [--tokens 2000] [--runs 5] [--smoke]

--smoke: one run of 200 tokens (CI's smoke run: the code path, not the figures).
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from sparkctl.bench import measure
from sparkctl.bench.prompts import decode_prompts
from sparkctl.bench.run import arm_from_endpoint


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=2000.0, help="emulated decode tok/s (configured truth)")
    ap.add_argument("--tokens", type=int, default=2000, help="max_tokens per run")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.tokens = 1, 200

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCTL_SIM_")}
    env.update(SPARKCTL_SIM_BOOT_S="0.2", SPARKCTL_SIM_DECODE_TPS=str(args.rate), PYTHONUNBUFFERED="1",
               SPARKCTL_SIM_CONTENT_TOKENS=f"[{args.tokens * 2}, {args.tokens * 3}]")
    log = Path(tempfile.mkdtemp(prefix="bench-harness-")) / "engine.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "sparkctl.sim", "--model-path", "/m", "--served-model-name",
                                 "x", "--host", "127.0.0.1", "--port", str(port), "--tp-size", "1"],
                                stdout=fh, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        t0 = time.monotonic()
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() - t0 > 30:
                print(f"emulator did not come up; log: {log}", file=sys.stderr)
                return 1
            time.sleep(0.05)
        arm = arm_from_endpoint(url)
        code = decode_prompts()["code"]
        measure.warm_up(arm, code, 1, 200)
        d = measure.measure_decode(arm, {"code": code}, runs=args.runs, max_tokens=args.tokens)
        s = d.classes["code"].decode_tok_s
        assert s is not None, "the code class measured no decode rate"
        chunks = None
        res = arm.client.chat(code.messages(), max_tokens=args.tokens, temperature=0, stream=True, model=arm.model)
        chunks = sum(1 for x in res.deltas if x.has_token)
        print(f"configured {args.rate:.0f} tok/s (emulated), {args.runs} runs x {args.tokens} tokens, "
              f"{chunks} token-bearing chunks per stream")
        print(f"measured median {s['median']:.1f} tok/s (min {s['min']:.1f}, max {s['max']:.1f}, "
              f"spread {s['spread_pct']:.1f}%)")
        print(f"measured/configured = {s['median'] / args.rate:.4f}"
              f"  -> {'within' if abs(s['median'] / args.rate - 1) <= 0.02 else 'OUTSIDE'} 2%")
        arm.client.close()
        return 0
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main())
