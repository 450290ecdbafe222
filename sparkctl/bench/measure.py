"""The measurements, one function each, against one arm. Every function returns the card's models
(`sparkctl.state.runs`: `DecodeResult`, `TTFTResult`, `ConcurrencyResult` ...), dumped as ``report.json``.

The measurement rules this code keeps:

* decode tok/s = (N-1)/(t_last - t_first) over the stream, N = ``usage.completion_tokens`` (never the
  chunk count); a run without usage gives no number (and says so);
* the first request is "cold": timed and kept apart, never in a median; then warm-up;
* acceptance from the scheduler's ``Decode batch`` lines printed during active code decode, and per
  request from ``/generate`` ``meta_info`` (completion_tokens / spec_verify_ct), each labelled; on another
  engine (vLLM) from its own counters' deltas around the code runs and its own log lines
  (`sparkctl.engines.card`), read outside every timed request;
* the scheduler's ``gen throughput`` is a gauge: its peak is reported as a gauge only;
* TTFT stops at the first non-empty content OR reasoning delta (the client does this); uncached prompts
  carry unique prefixes; the radix-cached repeat is reported apart, with how it was recognised;
  a size beyond the context window is "unmeasurable at this window" (`sparkctl.bench.ttft`);
* concurrency aggregate = total completion tokens / (last finish - first start), and a silent
  serialisation (max_running_requests 1, #running-req never > 1, no overlap in time) is flagged.
"""
from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Sequence

from sparkctl.bench.logsource import scheduler_summary
from sparkctl.bench.prompts import (
    Prompt,
)
from sparkctl.bench.stats import summarize
from sparkctl.bench.target import Arm
from sparkctl.engines.card import counter_delta, engine_counters, log_window
from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.client import ChatResult, SGLangAPIError, SGLangClient, accept_length_from_meta
from sparkctl.sglang.responses import EndpointBoundError, EndpointProtocolError, evidence_of
from sparkctl.state.runs import (
    ConcurrencyLevel,
    ConcurrencyResult,
    DecodeClass,
    DecodeResult,
    GenerateAcceptance,
    RequestRun,
    Serialization,
)

log = logging.getLogger("sparkctl.bench")

Progress = Callable[[str], None]

__all__ = ["run_record", "first_request", "warm_up", "measure_decode", "acceptance_from_generate",
           "measure_concurrency", "overlap_max", "not_measured"]


def _noop(_: str) -> None:
    pass


def run_record(res: ChatResult, **labels: str | int) -> RequestRun:
    """One streamed request as recorded: tokens, timings, rates (rounded for the record); ``labels`` are the
    ``prompt`` (and ``max_tokens``) of a cold or warm-up request."""
    n = res.usage.completion_tokens
    tps = res.decode_tokens_per_s()
    return RequestRun.model_validate({
        **labels,
        "completion_tokens": n, "prompt_tokens": res.usage.prompt_tokens,
        "reasoning_tokens": res.usage.reasoning_tokens, "cached_tokens": res.usage.cached_tokens,
        "finish_reason": res.finish_reason,
        "ttft_s": None if res.ttft is None else round(res.ttft, 4),
        "latency_s": round(res.latency, 4),
        "decode_s": None if res.t_first_token is None or res.t_last_token is None
        else round(res.t_last_token - res.t_first_token, 4),
        "decode_tok_s": None if tps is None else round(tps, 3),
        "e2e_tok_s": None if not n or res.latency <= 0 else round(n / res.latency, 3),
        "usage_missing": n is None,
    })


def not_measured(recs: list[RequestRun]) -> str:
    """Why no run of a class gave a decode rate, from the runs themselves: the stream's usage missing, too few
    tokens, or every token arriving in one read (no time between the first and the last)."""
    if any(r.usage_missing for r in recs):
        return "no usage.completion_tokens in the stream: not measured"
    if all((r.completion_tokens or 0) < 2 for r in recs):
        return "fewer than 2 tokens generated: not measured (raise --max-tokens)"
    if all(r.decode_s == 0 for r in recs):
        return ("every token arrived in one read (no time between the first and the last token): not measured "
                "(raise --max-tokens so that decoding spans a measurable time)")
    return "no run gave a decode rate: not measured"


class _GcPaused:
    """Python's cyclic garbage collector off while any timed request streams (as ``timeit`` does).

    A full collection of the controller's heap took 58-105 ms on a loaded 2-core machine (measured with
    ``gc.callbacks`` during the bench tests); landing inside a stream, it moved that stream's first-token
    timestamp and read as TTFT. Reference-counted: concurrent requests (threads) share one pause, and the
    collector comes back, with one collection, when the last of them ends.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._was_enabled = False

    def __enter__(self) -> None:
        with self._lock:
            if self._active == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._active += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0 and self._was_enabled:
                gc.enable()
                gc.collect(0)      # the young objects the streams left, before another timed window opens


_GC_PAUSED = _GcPaused()


def _stream(arm: Arm, prompt_messages: list[JSONObject], max_tokens: int,
            client: SGLangClient | None = None) -> ChatResult:
    with _GC_PAUSED:
        return (client or arm.client).chat(prompt_messages, max_tokens=max_tokens, temperature=0, stream=True,
                                           model=arm.model)


def first_request(arm: Arm, prompt: Prompt, max_tokens: int) -> RequestRun:
    """The bench's first request on this arm, streamed and timed; excluded from every median.

    It is the cold request only when nothing ran since boot; a deployment's warm-up at boot already
    paid the cold cost, and its record keeps that number (``warmup_at_boot``).
    """
    res = _stream(arm, prompt.messages(), max_tokens)
    return run_record(res, prompt=prompt.id, max_tokens=max_tokens)


def warm_up(arm: Arm, prompt: Prompt, n: int, max_tokens: int) -> list[RequestRun]:
    return [run_record(_stream(arm, prompt.messages(), max_tokens), prompt=prompt.id) for _ in range(n)]


def measure_decode(arm: Arm, prompts: dict[str, Prompt], *, runs: int, max_tokens: int,
                   progress: Progress = _noop) -> DecodeResult:
    """Per class: n streamed runs at temperature 0; median (min-max) of decode tok/s; the scheduler log
    window of each class (acceptance ranges, gauge peak)."""
    out = DecodeResult(max_tokens=max_tokens, runs=runs, temperature=0, stream=True,
                       formula="(completion_tokens - 1) / (t_last_token - t_first_token)", classes={})
    for cls, prompt in prompts.items():
        mark = arm.log.mark() if arm.log else None
        before = None if arm.sglang else engine_counters(arm.engine, arm.client)
        recs = []
        for i in range(runs):
            rec = run_record(_stream(arm, prompt.messages(), max_tokens))
            recs.append(rec)
            progress(f"decode {cls} run {i + 1}/{runs}: {rec.decode_tok_s} tok/s "
                     f"({rec.completion_tokens} tokens)")
        s = summarize([r.decode_tok_s for r in recs])
        e2e = summarize([r.e2e_tok_s for r in recs])
        entry = DecodeClass(prompt=prompt.id, title=prompt.title, runs=recs, decode_tok_s=s.as_dict() if s else None,
                            note=None if s else not_measured(recs), e2e_tok_s=e2e.as_dict() if e2e else None)
        if not arm.sglang:
            found = counter_delta(before, engine_counters(arm.engine, arm.client))
            if found is not None:
                entry.engine_counters = found
            if arm.log is not None and mark is not None:
                entry.engine_log = log_window(arm.engine, arm.log.since(mark))
        elif arm.log is not None and mark is not None:
            entry.scheduler_log = scheduler_summary(arm.log.since(mark))
        out.classes[cls] = entry
    return out


# HTTP statuses that say a route is absent (not that a request was refused): an optional endpoint degrades on them.
NO_ROUTE_STATUSES = (404, 405, 501)


def acceptance_from_generate(arm: Arm, prompt: Prompt, *, runs: int, max_tokens: int) -> GenerateAcceptance:
    """Per-request accept length from native ``/generate`` (completion_tokens / spec_verify_ct).

    ``/generate`` takes raw text (no chat template), so the prompt is the same words but not the same
    tokens as the chat runs: said in the record.
    """
    vals: list[float | None] = []
    metas: list[JSONObject] = []
    err: str | None = None
    for _ in range(runs):
        try:
            body = arm.client.generate(prompt.text, {"temperature": 0, "max_new_tokens": max_tokens})
            meta = body.get("meta_info") or {}
            if not isinstance(meta, dict):
                raise EndpointProtocolError(arm.client.base_url + "/generate", 200, reason=f"meta_info is a "
                                            f"{type(meta).__name__}, not an object", evidence=evidence_of(repr(meta)))
        except SGLangAPIError as exc:
            if isinstance(exc, (EndpointBoundError, EndpointProtocolError)) and arm.guard is not None:
                arm.guard.trip(exc)             # a broken endpoint, not a refused request: the run stops
            if not vals and exc.status in NO_ROUTE_STATUSES:
                # an optional endpoint that is not there (an OpenAI-only gateway in front of SGLang): degrade
                return GenerateAcceptance(
                    source="/generate meta_info", prompt=prompt.id, status="unavailable", per_request=[],
                    accept_len=None, meta=[], error=None,
                    note=f"unavailable: {exc.message} (this endpoint has no SGLang native /generate, as behind an "
                         f"OpenAI-only gateway); acceptance then comes from the scheduler log (--log FILE) or the "
                         f"engine's metrics")
            err = exc.message
            break
        metas.append({k: meta.get(k) for k in ("completion_tokens", "spec_verify_ct", "spec_accept_length")
                      if k in meta})
        vals.append(accept_length_from_meta(meta))
    s = summarize(vals)
    return GenerateAcceptance(source="/generate meta_info (completion_tokens / spec_verify_ct), raw text prompt",
                              prompt=prompt.id, per_request=[None if v is None else round(v, 3) for v in vals],
                              accept_len=s.as_dict() if s else None, meta=metas, error=err,
                              note=None if s else ("request failed" if err else "no spec_verify_ct in meta_info"))


# --------------------------------------------------------------------------- concurrency

def overlap_max(intervals: Sequence[tuple[float, float]]) -> int:
    """Largest number of [start, end] intervals open at one instant."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def _concurrent(arm: Arm, prompt: Prompt, c: int, max_tokens: int) -> list[ChatResult | Exception]:
    results: list[ChatResult | Exception] = [RuntimeError("not run")] * c
    barrier = threading.Barrier(c)

    def worker(i: int) -> None:
        client = arm.new_client()
        try:
            barrier.wait(timeout=30)
            results[i] = _stream(arm, prompt.messages(), max_tokens, client=client)
        except Exception as exc:  # noqa: BLE001 - recorded per request
            results[i] = exc
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def measure_concurrency(arm: Arm, prompt: Prompt, levels: Sequence[int], *, max_tokens: int,
                        progress: Progress = _noop) -> ConcurrencyResult:
    """c identical requests started together per level; aggregate tok/s and a serialisation check."""
    cap, cap_src = arm.max_running_requests
    out = ConcurrencyResult(prompt=prompt.id, max_tokens=max_tokens, max_running_requests=cap,
                            max_running_requests_source=cap_src, cap_reason=arm.concurrency_cap(),
                            formula="total completion tokens / (last finish - first start)", levels=[])
    observer = arm.level_observer
    for c in levels:
        mark = arm.log.mark() if arm.log else None
        token = observer.before(c) if observer is not None else None
        res = _concurrent(arm, prompt, c, max_tokens)
        ok = [r for r in res if isinstance(r, ChatResult)]
        errors = [f"{type(r).__name__}: {getattr(r, 'message', r)}" for r in res if not isinstance(r, ChatResult)]
        entry = ConcurrencyLevel(concurrency=c, requests=[run_record(r) for r in ok], errors=errors or None)
        if ok:
            t0, t1 = min(r.t_start for r in ok), max(r.t_end for r in ok)
            tokens = sum(r.usage.completion_tokens or 0 for r in ok)
            entry.total_completion_tokens = tokens
            entry.wall_s = round(t1 - t0, 4)
            entry.aggregate_tok_s = round(tokens / (t1 - t0), 3) if t1 > t0 else None
            spans = [(r.t_first_token, r.t_last_token) for r in ok if r.t_first_token and r.t_last_token]
            entry.max_streams_decoding_at_once = overlap_max(spans) if spans else None
        if arm.sglang and arm.log is not None and mark is not None:
            sch = scheduler_summary(arm.log.since(mark))
            entry.log_max_running_req = sch["decode"]["max_running_req"]
            entry.log_decode_batches = sch["decode"]["batches"]
        if c > 1:
            entry.serialization = _serialization(entry, cap, cap_src, out.cap_reason)
        if observer is not None and token is not None:
            observer.after(c, entry, token)
        out.levels.append(entry)
        progress(f"concurrency c{c}: {entry.aggregate_tok_s} tok/s aggregate")
    base = next((lv.aggregate_tok_s for lv in out.levels if lv.concurrency == 1), None)
    for lv in out.levels:
        a = lv.aggregate_tok_s
        lv.vs_c1 = round(a / base, 3) if a and base else None
    return out


def _serialization(entry: ConcurrencyLevel, cap: int | None, cap_src: str,
                   cap_reason: JSONObject | None = None) -> Serialization:
    evidence = []
    if cap == 1:
        evidence.append(f"max_running_requests resolved to 1 ({cap_src})")
    if entry.log_decode_batches and entry.log_max_running_req is not None and entry.log_max_running_req <= 1:
        evidence.append(f"#running-req never above 1 in {entry.log_decode_batches} decode-batch log lines "
                        "during the run")
    if entry.max_streams_decoding_at_once == 1:
        evidence.append("the token streams never overlapped in time")
    serialized = bool(evidence)
    checked = ["resolved max_running_requests" if cap is not None else None,
               "scheduler log" if entry.log_decode_batches else None, "stream timing"]
    out = Serialization(serialized=serialized, evidence=evidence, checked=[c for c in checked if c])
    if serialized:
        out.reason = cap_reason["reason"] if cap_reason else None
        out.reason_source = cap_reason["source"] if cap_reason else None
        out.fix = cap_reason["fix"] if cap_reason else None
    return out
