"""Benchmark (not a test): what the router (sglang-router 0.3.2) adds per request, and aggregate decode through it.

One run, loopback, emulated engines (labelled so):
  1. router overhead: the same httpx client (one keep-alive connection), the same requests (/generate, N new tokens,
     sequential) direct to a replica and through the router in front of it (router with that one worker): median
     and p90 latency each, ratio router/direct (target <= 1.05 at a real request's length);
  2. aggregate decode at concurrency 1, 2, 4, 8 through the router with 1 replica vs 2 replicas (the emulator's
     decode model: each replica batches its own requests), tokens/s = completion tokens / wall time.
Run:
    .venv/bin/python benchmarks/bench_router_overhead.py [--requests 100] [--tokens 64] [--decode-tps 400] [--smoke]
--smoke: 5 requests of 16 tokens, one request per client in the aggregate, 2,000 tok/s (CI's smoke run: the code
path, not the figures).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def _workers(n: int, decode_tps: float):
    from testrig.simproc import MODEL, SimProc
    from testrig.testenv import free_port
    out = []
    for i in range(n):
        host = f"127.0.77.{i + 2}"
        port = free_port(host)
        env = {"SPARKCTL_SIM_BOOT_S": "0.3", "SPARKCTL_SIM_DECODE_TPS": str(decode_tps)}
        out.append(SimProc(["--model-path", MODEL, "--host", host, "--port", str(port), "--enable-metrics",
                            "--max-running-requests", "16"], env, host, port))
    for w in out:
        w.wait_ready()
    return out


def _latencies(url: str, n: int, tokens: int) -> list[float]:
    body = {"text": "Benchmark the router", "sampling_params": {"max_new_tokens": tokens}}
    out = []
    with httpx.Client(timeout=60, trust_env=False) as c:
        c.post(url + "/generate", json=body)                      # warm the connection
        for _ in range(n):
            t0 = time.perf_counter()
            r = c.post(url + "/generate", json=body)
            out.append(time.perf_counter() - t0)
            r.raise_for_status()
    return out


def _aggregate(url: str, conc: int, per_client: int, tokens: int) -> float:
    body = {"text": "Aggregate decode", "sampling_params": {"max_new_tokens": tokens}}

    def client(_: int) -> int:
        got = 0
        with httpx.Client(timeout=120, trust_env=False) as c:
            for _ in range(per_client):
                r = c.post(url + "/generate", json=body)
                r.raise_for_status()
                got += r.json()["meta_info"]["completion_tokens"]
        return got

    t0 = time.perf_counter()
    with ThreadPoolExecutor(conc) as ex:
        total = sum(ex.map(client, range(conc)))
    return total / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--decode-tps", type=float, default=400.0)
    ap.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    a = ap.parse_args()
    per_client = 4
    if a.smoke:
        a.requests, a.tokens, a.decode_tps, per_client = 5, 16, 2000.0, 1
    from sparkctl.router.client import RouterClient
    from sparkctl.router.process import RouterProcess
    from sparkctl.router.spec import RouterSpec
    from testrig.testenv import free_port

    workers = _workers(2, a.decode_tps)
    tmp = Path(tempfile.mkdtemp(prefix="bench-router-"))
    spec = RouterSpec("127.0.77.1", free_port("127.0.77.1"), (workers[0].url(""),), policy="round_robin",
                      prometheus_port=free_port("127.0.77.1"))
    router = RouterProcess.start(spec, tmp / "router.log")
    try:
        client = RouterClient(spec.url, metrics_url=spec.metrics_url)
        client._until("worker listed", lambda: (w := client.find(workers[0].url(""))) and w.healthy, 30)
        direct = _latencies(workers[0].url(""), a.requests, a.tokens)
        routed = _latencies(spec.url, a.requests, a.tokens)
        md, mr = statistics.median(direct), statistics.median(routed)
        p90 = lambda xs: sorted(xs)[int(0.9 * (len(xs) - 1))]   # noqa: E731
        print(f"[emulated] router overhead, {a.requests} sequential /generate of {a.tokens} tokens, one client:")
        print(f"  direct  median {md * 1000:.2f} ms  p90 {p90(direct) * 1000:.2f} ms")
        print(f"  router  median {mr * 1000:.2f} ms  p90 {p90(routed) * 1000:.2f} ms")
        print(f"  ratio router/direct median {mr / md:.3f}  (+{(mr - md) * 1000:.2f} ms per request)")
        print(f"[emulated] aggregate decode through the router, tok/s ({a.decode_tps:g} tok/s per replica model):")
        rows = {}
        for replicas in (1, 2):
            if replicas == 2:
                client.add_worker(workers[1].url(""))
            rows[replicas] = [_aggregate(spec.url, c, per_client, a.tokens * 4) for c in (1, 2, 4, 8)]
        print("  conc      1        2        4        8")
        for replicas, vals in rows.items():
            print(f"  {replicas} repl " + " ".join(f"{v:8.1f}" for v in vals))
        print("  ratio " + " ".join(f"{b / x:8.2f}" for x, b in zip(rows[1], rows[2])))
        m = client.metrics()
        print("  router's per-worker split (smg_worker_cb_outcomes_total):",
              {u: int(w.requests) for u, w in m.workers.items()})
    finally:
        router.stop()
        for w in workers:
            w.close()


if __name__ == "__main__":
    main()
