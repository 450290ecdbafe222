"""Benchmark (not a test): a rolling update end to end through the router, and its failed-request count.

Embedded cluster (emulated engines, labelled so), 2 replicas x TP=1 behind sglang-router 0.3.2. First a first `up`
booted all at once vs one replica at a time (alternated, best of two each). Then `up` profile A,
then, while C clients loop /generate requests through the router, `up` profile B (a changed flag: every replica is
detached, drained, redeployed, gated and attached in turn). Prints the update's wall time, each step's time from the
journal, requests done during it, failures, and client latency during vs before the update. One run. Run:
    .venv/bin/python benchmarks/bench_rolling_update.py [--concurrency 4] [--tokens 64] [--smoke]
--smoke: one first up each way (the first one counted), boot_s 0.3, 16 tokens, 2 clients, 0.5 s of load before
the update (CI's smoke run: the code path, not the figures).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--boot-s", type=float, default=2.0)
    ap.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    a = ap.parse_args()
    # the first up also pays the cold imports: not counted (the smoke run counts it: it measures nothing)
    order: tuple[bool, ...] = (True, True, False, True, False)
    counted, load_before_s, load_after_s = 1, 3.0, 1.0
    if a.smoke:
        a.concurrency, a.tokens, a.boot_s = 2, 16, 0.3
        order, counted, load_before_s, load_after_s = (True, False), 0, 0.5, 0.2
    tmp = Path(tempfile.mkdtemp(prefix="bench-roll-"))
    os.environ["SPARKCTL_STATE_DIR"] = str(tmp / "state")
    for k in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        del os.environ[k]
    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy.replicated import ReplicatedDeployer
    from sparkctl.state.replicated import Record
    from testrig.embedded import write_embedded_inventory, write_replicated_profile

    inv = load_inventory(write_embedded_inventory(tmp / "inv.yml", {"boot_s": a.boot_s, "decode_tps": 2000},
                                                  prefix="bench", nodes=2))
    d = ReplicatedDeployer(inv)
    try:
        # A first up, all at once vs one replica at a time, alternated in one run (the first one also pays the
        # cold imports and is not counted); the best of two each.
        first: dict[bool, list[float]] = {False: [], True: []}
        for i, parallel in enumerate(order):
            d.parallel_first_up = parallel
            t0 = time.perf_counter()
            endpoint = d.up(load_profile(str(write_replicated_profile(tmp / "a.yml", 16)))).endpoint
            if i >= counted:
                first[parallel].append(time.perf_counter() - t0)
            if i < len(order) - 1:
                d.down()
        d.parallel_first_up = True
        seq, par = min(first[False]), min(first[True])
        print(f"[emulated] first up of 2 replicas (router start included): one at a time {seq:.2f} s, all at once "
              f"{par:.2f} s (ratio {seq / par:.2f}x)")
        stop = threading.Event()
        samples: list[tuple[float, float, bool]] = []      # (start, latency, ok)
        lock = threading.Lock()

        def client() -> None:
            body = {"text": "rolling", "sampling_params": {"max_new_tokens": a.tokens}}
            with httpx.Client(timeout=120, trust_env=False) as c:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    try:
                        ok = c.post(endpoint + "/generate", json=body).status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    with lock:
                        samples.append((t0, time.perf_counter() - t0, ok))

        threads = [threading.Thread(target=client) for _ in range(a.concurrency)]
        for t in threads:
            t.start()
        time.sleep(load_before_s)
        u0 = time.perf_counter()
        d.up(load_profile(str(write_replicated_profile(tmp / "b.yml", 24))))
        u1 = time.perf_counter()
        time.sleep(load_after_s)
        stop.set()
        for t in threads:
            t.join()
        before = [lat for s, lat, ok in samples if s < u0]
        during = [(lat, ok) for s, lat, ok in samples if u0 <= s < u1]
        failed = sum(1 for _, _, ok in samples if not ok)
        print(f"[emulated] rolling update of 2 replicas x TP=1 (boot_s {a.boot_s:g}), {a.concurrency} clients, "
              f"/generate {a.tokens} tokens:")
        print(f"  update wall time {u1 - u0:.2f} s; requests during it {len(during)}; failed requests "
              f"{failed} of {len(samples)} in the whole run")
        print(f"  client latency median before {statistics.median(before) * 1000:.1f} ms, during "
              f"{statistics.median([x for x, _ in during]) * 1000:.1f} ms")
        journal = Record.load(d.ledger.root).doc.model_dump(mode="json")["journal"]
        last = max(i for i, e in enumerate(journal) if e["step"] == "settle" and e["phase"] == "intent")
        began: dict[tuple[str, int | None], float] = {}
        for e in journal[last:]:
            key = (e["step"], e["replica"])
            at = datetime.fromisoformat(e["at"].replace("Z", "+00:00")).timestamp()
            if e["phase"] == "intent":
                began[key] = at
            elif e["phase"] == "ok" and key in began:
                print(f"    {e['step']:<15} replica {e['replica'] if e['replica'] is not None else '-'}: "
                      f"{at - began[key]:.2f} s")
    finally:
        d.down()


if __name__ == "__main__":
    main()
