"""The performance model (sparkctl/sim/perf.py): how the tuned flags move capacity, acceptance and step cost.

Pure checks of the equations' shape (monotonic where physics says so, diminishing returns, thresholds), then
the emulator itself: the capacity it resolves and prints, the OOM it dies of, the accept lengths it produces
(deterministic: per-prompt seeded draws) and a planted optimum over draft tokens found where the model says.
"""
from __future__ import annotations

import re
from typing import TypedDict

import httpx
import pytest

from sparkctl.sim import perf
from sparkctl.sim.config import Knobs

DFLASH = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/models/drafter"]
CODE_PROMPT = "Implement a threaded queue in python"


# ----------------------------------------------------------------------------------------------- pure

def test_capacity_grows_with_mem_fraction_and_is_anchored_at_the_reference():
    k = Knobs()
    fractions = [0.80, 0.83, 0.85, 0.88, 0.90, 0.92]
    pools = [perf.kv_pool_tokens(k, f) for f in fractions]
    assert pools == sorted(pools) and len(set(pools)) == len(pools)
    assert perf.kv_pool_tokens(k, k.kv_ref_mem_fraction) == k.kv_capacity_tokens == perf.kv_pool_tokens(k, None)
    # 0.01 of the static fraction = gpu_mem_gb * 1e7 bytes of 98,304-byte cells
    step = perf.kv_pool_tokens(k, 0.89) - perf.kv_pool_tokens(k, 0.88)
    assert abs(step - k.gpu_mem_gb * 1e7 / k.kv_bytes_per_token) <= 1
    assert perf.kv_pool_tokens(k, 0.88, "fp8_e4m3") == 2 * k.kv_capacity_tokens
    assert perf.kv_pool_tokens(k, 0.10) == 0                      # the weights do not fit


def test_boot_oom_only_above_the_threshold():
    k = Knobs(oom_mem_fraction=0.9)
    assert not perf.boot_oom(k, None) and not perf.boot_oom(k, 0.9) and perf.boot_oom(k, 0.9001)


def test_mamba_ratio_trades_kv_tokens_for_state_slots():
    k = Knobs(mamba_slots=1)
    ratios = [1.0, 2.0, 4.0, 6.0]
    kv = [perf.kv_pool_tokens(k, 0.88, mamba_ratio=r) for r in ratios]
    slots = [perf.mamba_cache_slots(k, r) for r in ratios]
    assert kv == sorted(kv, reverse=True) and slots == sorted(slots)
    assert (kv[1], slots[1]) == (k.kv_capacity_tokens, 1) and slots[2:] == [2, 3]


@pytest.mark.parametrize("mean", [1.5, 3.3, 4.6, 7.0])
def test_accept_length_rises_with_draft_tokens_with_diminishing_returns(mean):
    alpha = perf.fit_alpha(mean, 8)
    assert abs(perf.expected_accept_len(alpha, 8) - mean) < 1e-6
    lens = [perf.expected_accept_len(alpha, d) for d in range(1, 21)]
    gains = [b - a for a, b in zip(lens, lens[1:])]
    assert lens[0] == 1.0 and all(g > 0 for g in gains)
    assert all(b <= a + 1e-12 for a, b in zip(gains, gains[1:]))          # each draft token adds less
    assert all(length <= d for d, length in enumerate(lens, 1)) and lens[-1] < 1 / (1 - alpha)


def test_verify_cost_rises_with_draft_tokens_and_never_undercuts_a_decode_step():
    k = Knobs(verify_cost=1.25, verify_cost_per_token=0.03)
    costs = [perf.verify_cost(k, d) for d in range(1, 17)]
    assert costs == sorted(costs) and min(costs) >= 1.0 and perf.verify_cost(k, 8) == 1.25


def test_concurrency_is_capped_by_max_running_requests_and_saturated_by_verify():
    k = Knobs(decode_tps=100, batch_no_slowdown=8, verify_cost=2.0, verify_cost_per_token=0.0)
    off = [perf.predict(k, speculative=False, streams=c).aggregate_tok_s for c in (1, 2, 4, 8, 16)]
    # memory- then compute-bound
    assert off[:4] == pytest.approx([100, 200, 400, 800]) and off[4] == pytest.approx(800)
    assert perf.predict(k, speculative=False, streams=4, max_running_requests=1).aggregate_tok_s == pytest.approx(100)
    # 8 draft tokens fill the forward pass at one stream (the seed: c2 aggregate 30.2 vs single 29.4)
    on1 = perf.predict(k, speculative=True, draft=8, streams=1).aggregate_tok_s
    on2 = perf.predict(k, speculative=True, draft=8, streams=2).aggregate_tok_s
    assert on2 == pytest.approx(on1)
    on2_small = perf.predict(k, speculative=True, draft=4, streams=2)
    assert on2_small.aggregate_tok_s == pytest.approx(2 * on2_small.per_stream_tok_s)


# A planted optimum: per-token verify cost 0.25 decode steps around 1.5 at D=8, batch_no_slowdown 8.
class _Timing(TypedDict):
    """The timing knobs (sparkctl.sim.config.Knobs) a test plants."""

    decode_tps: float
    verify_cost: float
    verify_cost_per_token: float
    accept_len_code: float
    ttft_base_s: float
    prefill_tps: float


PLANTED: _Timing = {"decode_tps": 300, "verify_cost": 1.5, "verify_cost_per_token": 0.25, "accept_len_code": 4.6,
           "ttft_base_s": 0.001, "prefill_tps": 1e6}
CANDIDATES = (4, 6, 8)


def test_planted_optimum_is_interior_and_clear():
    k = Knobs(**PLANTED)
    rates = {d: perf.predict(k, speculative=True, draft=d).per_stream_tok_s for d in CANDIDATES}
    best = max(rates, key=lambda d: rates[d])
    assert best == 6
    assert all(rates[best] > 1.2 * r for d, r in rates.items() if d != best), rates


# -------------------------------------------------------------------------------------------- emulator

def _capacity(text: str) -> tuple[int, int]:
    m = re.search(r"max_total_num_tokens=(\d+), .*max_running_requests=(\d+),", text)
    assert m, text[-2000:]
    return int(m.group(1)), int(m.group(2))


def test_emulator_resolves_capacity_from_mem_fraction(sim):
    k = Knobs()
    procs = {f: sim(["--mem-fraction-static", str(f), "--max-total-tokens", "131072"]) for f in (0.85, 0.90)}
    for f, p in procs.items():
        p.wait_ready()
        assert _capacity(p.text)[0] == perf.kv_pool_tokens(k, f)
        info = httpx.get(p.url("/server_info")).json()
        assert info["max_total_num_tokens"] == perf.kv_pool_tokens(k, f) and info["mem_fraction_static"] == f


def test_emulator_mamba_ratio_raises_the_running_cap(sim):
    p = sim(["--mamba-full-memory-ratio", "4", "--max-running-requests", "8"], knobs={"mamba_slots": 1})
    p.wait_ready()
    total, mrr = _capacity(p.text)
    assert mrr == 2 and total == perf.kv_pool_tokens(Knobs(), None, mamba_ratio=4.0)
    assert "Mamba Cache is allocated. max_mamba_cache_size: 6," in p.text


def test_emulator_oom_above_threshold_is_a_fatal_boot_that_sparkctl_classifies(sim):
    from sparkctl.sglang.bootwatch import LogFollower
    from sparkctl.sglang.logparse import EventKind
    p = sim(["--mem-fraction-static", "0.95"], knobs={"oom_mem_fraction": 0.92})
    assert p.wait_exit(15) == 1
    assert "Rank 0 scheduler died during initialization (exit code: -9)" in p.text
    assert "fired up" not in p.text and "max_total_num_tokens=" not in p.text
    follower = LogFollower()
    follower.feed_text(p.text)
    verdict = follower.classify()
    assert verdict.kind == EventKind.OOM, verdict


def test_emulator_accept_length_follows_draft_tokens(sim):
    """completion_tokens / spec_verify_ct per request: deterministic draws, so no timing in the check."""
    procs = {d: sim(DFLASH + ["--speculative-num-draft-tokens", str(d)], knobs={"decode_tps": 3000})
             for d in (2, 4, 8, 16)}
    measured = {}
    for d, p in procs.items():
        p.wait_ready()
        m = httpx.post(p.url("/generate"), json={"text": CODE_PROMPT, "sampling_params": {"max_new_tokens": 1500}},
                       timeout=60).json()["meta_info"]
        measured[d] = m["completion_tokens"] / m["spec_verify_ct"]
    alpha = perf.class_alpha(Knobs(), code=True)
    for d, got in measured.items():
        assert got <= d and abs(got - perf.expected_accept_len(alpha, d)) < 0.25 * d ** 0.5, measured
    assert [measured[d] for d in (2, 4, 8, 16)] == sorted(measured.values()), measured


def test_emulator_decodes_fastest_at_the_planted_optimum(sim):
    """The engine's own e2e_latency (its deadline clock catches up after a stall) over a 600-token decode."""
    procs = {d: sim(DFLASH + ["--speculative-num-draft-tokens", str(d)], knobs=PLANTED) for d in CANDIDATES}
    rates = {}
    for d, p in procs.items():
        p.wait_ready()
        got = []
        for _ in range(3):
            m = httpx.post(p.url("/generate"), json={"text": CODE_PROMPT, "sampling_params": {"max_new_tokens": 600}},
                           timeout=60).json()["meta_info"]
            got.append(m["completion_tokens"] / m["e2e_latency"])
        rates[d] = sorted(got)[1]
    print("measured tok/s by draft tokens:", rates)
    assert max(rates, key=lambda d: rates[d]) == 6, rates
