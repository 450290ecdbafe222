"""The emulator's performance model: how the tuned launch flags move capacity, acceptance and step cost.

Pure functions of the knobs and the resolved flags (no clock, no I/O), so the scheduler, the boot
sequence and the tests all use the same equations. The equations and why they are plausible are in
``sparkctl/sim/README.md`` ("Performance model"). In short, with D = draft tokens per verify step,
f = --mem-fraction-static, r = --mamba-full-memory-ratio, B = running requests:

* capacity   tokens(f, r) = (kv_capacity_tokens + (f - kv_ref_mem_fraction) * gpu_mem_gb * 1e9 / cell)
                            * (1 + mamba_ref_ratio) / (1 + r)            (cell = KV bytes per token)
  and the boot dies (host OOM-killer) when f > oom_mem_fraction.
* acceptance E[L](D) = (1 - a^D) / (1 - a): each draft is accepted with probability a until the first
  rejection (plus the bonus token); a is fitted so that E[L](accept_ref_draft_tokens) = accept_len_<class>.
* verify     c(D) = max(1, verify_cost + verify_cost_per_token * (D - accept_ref_draft_tokens)) decode steps.
* batch      step(B) = c(D) / decode_tps * max(1, B * T / batch_no_slowdown), T = D with speculation, else 1.
* so one stream decodes at decode_tps * E[L](D) / c(D); B streams at B times that / max(1, B*T/N).
"""
from __future__ import annotations

from dataclasses import dataclass

MAMBA_STATE_SLOTS_PER_REQUEST = 3     # SGLang 0.5.23 MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO


def kv_cell_bytes(knobs, kv_dtype: str) -> float:
    """K+V bytes per token per rank: fp8 dtypes halve the bf16 cell."""
    return knobs.kv_bytes_per_token / (2 if str(kv_dtype).startswith("fp8") else 1)


def kv_pool_tokens(knobs, mem_fraction: float | None, kv_dtype: str = "auto",
                   mamba_ratio: float | None = None) -> int:
    """Tokens the KV pool holds for a static fraction ``mem_fraction`` (None: the reference fraction).

    The static pool is f * gpu_mem_gb; what is left after the weights goes to the KV cache, so one
    hundredth of f more is gpu_mem_gb * 1e7 bytes more of cells. Anchored at kv_capacity_tokens for
    kv_ref_mem_fraction (the seed resolved 64,832 at 0.88). For a hybrid model with an explicit
    mamba ratio r, the pool is shared full:mamba = 1:r, so the full-attention share is scaled by
    (1 + r_ref) / (1 + r). Never negative (0 = the weights do not fit).
    """
    tokens = float(knobs.kv_capacity_tokens)
    if mem_fraction is not None:
        tokens += (float(mem_fraction) - knobs.kv_ref_mem_fraction) * knobs.gpu_mem_gb * 1e9 \
            / kv_cell_bytes(knobs, "auto")
    if kv_dtype and str(kv_dtype).startswith("fp8"):
        tokens *= 2            # the same bytes hold twice the fp8 cells
    if mamba_ratio is not None:
        tokens *= (1.0 + knobs.mamba_ref_ratio) / (1.0 + float(mamba_ratio))
    return max(0, int(tokens))


def mamba_cache_slots(knobs, mamba_ratio: float | None) -> int:
    """Requests the mamba state cache holds without --max-mamba-cache-size: mamba_slots at the reference
    ratio, proportional to the ratio (the mamba share of the pool grows with r)."""
    if mamba_ratio is None:
        return int(knobs.mamba_slots)
    return max(0, int(knobs.mamba_slots * float(mamba_ratio) / knobs.mamba_ref_ratio + 1e-9))


def boot_oom(knobs, mem_fraction: float | None) -> bool:
    """True when the static pool leaves the host too little unified memory: the OOM-killer fires at boot."""
    return mem_fraction is not None and float(mem_fraction) > knobs.oom_mem_fraction


def expected_accept_len(alpha: float, draft: int) -> float:
    """E[L] for D draft tokens when each is accepted with probability alpha until the first rejection."""
    draft = max(1, int(draft))
    if alpha >= 1.0:
        return float(draft)
    return (1.0 - alpha ** draft) / (1.0 - alpha)


def fit_alpha(mean_at_ref: float, ref_draft: int) -> float:
    """The per-draft acceptance probability that gives ``mean_at_ref`` at ``ref_draft`` draft tokens."""
    ref_draft = max(1, int(ref_draft))
    target = min(max(1.0, float(mean_at_ref)), float(ref_draft))
    if ref_draft == 1 or target <= 1.0:
        return 0.0
    if target >= ref_draft:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):       # E[L] is increasing in alpha
        mid = (lo + hi) / 2
        if expected_accept_len(mid, ref_draft) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def class_alpha(knobs, code: bool) -> float:
    mean = knobs.accept_len_code if code else knobs.accept_len_prose
    return fit_alpha(mean, knobs.accept_ref_draft_tokens)


def verify_cost(knobs, draft: int) -> float:
    """A verify step of D tokens, in plain decode steps: one weight read (>= 1) plus per-token work."""
    return max(1.0, knobs.verify_cost + knobs.verify_cost_per_token * (int(draft) - knobs.accept_ref_draft_tokens))


def step_seconds(knobs, *, speculative: bool, draft: int, running: int) -> float:
    """One decode (or verify) step for ``running`` requests: flat until the step holds batch_no_slowdown
    tokens (memory-bound: the weight read dominates), then proportional to its tokens (compute-bound)."""
    per_req = max(1, int(draft)) if speculative else 1
    base = (verify_cost(knobs, draft) if speculative else 1.0) / max(1e-9, knobs.decode_tps)
    return base * max(1.0, running * per_req / max(1, knobs.batch_no_slowdown))


@dataclass(frozen=True)
class Prediction:
    """What the model says a configuration decodes at (steady state, no prefill)."""
    accept_len: float
    step_s: float
    per_stream_tok_s: float
    aggregate_tok_s: float


def predict(knobs, *, speculative: bool, draft: int = 1, code: bool = True, streams: int = 1,
            max_running_requests: int | None = None) -> Prediction:
    """Decode rate for ``streams`` concurrent identical requests (capped by max_running_requests)."""
    running = max(1, min(streams, max_running_requests or streams))
    alen = expected_accept_len(class_alpha(knobs, code), draft) if speculative else 1.0
    step = step_seconds(knobs, speculative=speculative, draft=draft, running=running)
    per = alen / step
    return Prediction(accept_len=alen, step_s=step, per_stream_tok_s=per, aggregate_tok_s=per * running)
