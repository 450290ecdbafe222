"""Timing model: decode rate, speculative acceptance, concurrency cap, losslessness divergence."""
from __future__ import annotations

import re
import statistics
import threading
import time

import httpx

from testrig.simproc import chat_body

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
DFLASH = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/models/drafter",
          "--speculative-num-draft-tokens", "8"]


def _stream_times(url: str, body: dict) -> tuple[list[float], int]:
    times: list[float] = []
    usage: dict[str, int] | None = None
    with httpx.stream("POST", url, json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            import json
            f = json.loads(line[6:])
            if f.get("usage"):
                usage = f["usage"]
            if f["choices"] and (f["choices"][0]["delta"].get("content") or
                                 f["choices"][0]["delta"].get("reasoning_content")):
                times.append(time.monotonic())
    assert usage is not None, "no usage frame in the stream"
    return times, usage["completion_tokens"]


def test_decode_rate_within_2_percent(sim):
    p = sim(["--max-running-requests", "4"], knobs={"decode_tps": 2000.0, "prefill_tps": 1e6})
    p.wait_ready()
    body = chat_body("Write a long essay", max_tokens=1200, stream=True, stream_options={"include_usage": True},
                     **NO_THINK)
    times, n = _stream_times(p.url("/v1/chat/completions"), body)
    assert n == 1200
    rate = (n - 1) / (times[-1] - times[0])
    assert abs(rate - 2000.0) / 2000.0 < 0.02, rate


def _accept_lens(text: str) -> list[float]:
    return [float(m) for m in re.findall(r"accept len: ([\d.]+)", text)]


def test_speculative_accept_len_lines_and_rate(sim):
    p = sim(DFLASH + ["--decode-log-interval", "10", "--max-running-requests", "2"],
            knobs={"decode_tps": 100.0, "prefill_tps": 1e6})
    p.wait_ready()
    assert "Max running requests is reset to 48 for speculative decoding" not in p.text
    t0 = time.monotonic()
    prose = httpx.post(p.url("/generate"), timeout=60,
                       json={"text": "Write an essay about the sea",
                             "sampling_params": {"max_new_tokens": 1200}}).json()
    dt = time.monotonic() - t0
    m = prose["meta_info"]
    per_req = m["completion_tokens"] / m["spec_verify_ct"]
    assert 3.0 < per_req < 3.7, per_req                     # accept_len_prose 3.3
    # throughput = decode_tps * L / verify_cost = 100 * 3.3 / 1.25 = 264 tok/s
    assert 264 * 0.85 < 1200 / dt < 264 * 1.15, 1200 / dt
    lens = _accept_lens(p.text)
    assert lens and 3.0 < statistics.mean(lens) < 3.6
    line = p.wait_for(r"Decode batch, #running-req: 1, #token: \d+, token usage: [\d.]+, accept len: ")
    found = re.search(r"accept len: ([\d.]+), accept rate: ([\d.]+)", line)
    assert found, line
    alen, rate = map(float, found.groups())
    assert abs(rate - (alen - 1) / 7) < 0.011                # (len-1)/(draft-1) on >= 0.5.16
    assert "cuda graph: True, gen throughput (token/s): " in line and line.endswith("#queue-req: 0")
    code = httpx.post(p.url("/generate"), timeout=60,
                      json={"text": "Implement a threaded queue in python", "sampling_params": {"max_new_tokens": 600}})
    cm = code.json()["meta_info"]
    assert 4.2 < cm["completion_tokens"] / cm["spec_verify_ct"] < 5.0   # accept_len_code 4.6
    info = httpx.get(p.url("/server_info")).json()
    assert info["speculative_algorithm"] == "DFLASH" and info["speculative_num_draft_tokens"] == 8
    assert info["internal_states"][0]["avg_spec_accept_length"] > 1


def test_mamba_cap_serializes_concurrent_requests(sim):
    p = sim(["--mamba-full-memory-ratio", "2", "--decode-log-interval", "5"],
            knobs={"decode_tps": 200.0, "prefill_tps": 1e6, "ttft_base_s": 0.001})
    p.wait_ready()
    done: dict[int, float] = {}
    t0 = time.monotonic()

    def run(i: int) -> None:
        httpx.post(p.url("/v1/chat/completions"), json=chat_body(f"question {i}", max_tokens=100, **NO_THINK),
                   timeout=30)
        done[i] = time.monotonic() - t0
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(done.values()) > 0.9       # 2 x 100 tokens at 200 tok/s, one after the other
    assert "#queue-req: 1" in p.text
    assert "#running-req: 2" not in p.text


def test_two_requests_run_together_when_allowed(sim):
    p = sim(["--max-running-requests", "2", "--decode-log-interval", "5"],
            knobs={"decode_tps": 200.0, "prefill_tps": 1e6, "ttft_base_s": 0.001})
    p.wait_ready()
    # Clients made first and a barrier before sending: on a loaded machine a thread that still had to build its
    # client sent its request after the other had finished (100 tokens, 0.5 s), and the two never overlapped.
    clients = [httpx.Client(timeout=30) for _ in range(2)]
    barrier = threading.Barrier(2)

    def ask(i: int) -> None:
        barrier.wait(timeout=10)
        clients[i].post(p.url("/v1/chat/completions"), json=chat_body(f"q {i}", max_tokens=300, **NO_THINK))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for c in clients:
            c.close()
    # The decode log is the evidence that both ran in one batch (a wall-clock bound failed on a loaded machine).
    assert "#running-req: 2" in p.text


def _gen_ids(p, text: str, n: int) -> list[int]:
    r = httpx.post(p.url("/generate"), json={"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0}},
                   timeout=60)
    return r.json()["output_ids"]


def test_spec_on_diverges_at_configured_index(sim):
    fast = {"decode_tps": 1000.0, "prefill_tps": 1e6}
    off = sim(knobs=fast)
    on = sim(DFLASH, knobs={**fast, "divergence": {"contains:DIVERGE-ME": 17}})
    off.wait_ready()
    on.wait_ready()
    a, b = _gen_ids(off, "please DIVERGE-ME now", 60), _gen_ids(on, "please DIVERGE-ME now", 60)
    assert a[:17] == b[:17] and a[17] != b[17]
    assert _gen_ids(off, "a lossless prompt", 60) == _gen_ids(on, "a lossless prompt", 60)


def test_divergence_rate_is_deterministic_per_prompt(sim):
    fast = {"decode_tps": 1000.0, "prefill_tps": 1e6}
    off = sim(knobs=fast)
    on = sim(DFLASH, knobs={**fast, "divergence_rate": 1.0, "divergence_positions": [5, 9]})
    off.wait_ready()
    on.wait_ready()
    a, b = _gen_ids(off, "prompt seven", 30), _gen_ids(on, "prompt seven", 30)
    i = next(k for k in range(30) if a[k] != b[k])
    assert 5 <= i <= 9 and b == _gen_ids(on, "prompt seven", 30)
