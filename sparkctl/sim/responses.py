"""What the emulator's HTTP API answers, built from a request's state: the chat view (reasoning vs content
pieces), usage, /generate's body, /server_info and the Prometheus /metrics text, from the `ApiState` the
handlers share. Pure builders; the server and its routes are `sparkctl.sim.http_api`.
"""
from __future__ import annotations

import queue
import threading
import time

from sparkctl.jsontypes import JSONObject
from sparkctl.sim import decoding as dec
from sparkctl.sim.scheduler import TTFT_BUCKETS, Request, Scheduler


class ApiState:
    """What the handlers read: resolved args, knobs, scheduler, readiness."""

    def __init__(self, res, knobs, sched: Scheduler, log) -> None:
        self.res, self.knobs, self.sched, self.log = res, knobs, sched, log
        self.ready = threading.Event()
        self.started = time.time()
        self.memory_usage = {"weight": 0.0, "kvcache": 0.0, "token_capacity": res.max_total_num_tokens, "graph": 0.0}


class ChatView:
    """Splits a request's tokens into the reasoning part and the content part, as text pieces."""

    def __init__(self, req: Request, separate: bool) -> None:
        self.req, self.separate = req, separate
        self.plan = req.plan

    def _visible(self, i: int) -> bool:
        return not (self.separate and self.plan.is_reasoning(i) and self.plan.token(i) == dec.THINK_CLOSE)

    def _prev(self, i: int) -> str | None:
        """Previous visible token of the same part, None if i starts its part."""
        j = i - 1
        while j >= 0:
            same_part = (not self.separate) or (self.plan.is_reasoning(j) == self.plan.is_reasoning(i))
            if not same_part:
                return None
            if self._visible(j):
                return self.plan.token(j)
            j -= 1
        return None

    def pieces(self, start: int, end: int) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        for i in range(start, end):
            if not self._visible(i):
                continue
            piece = dec.join_piece(self._prev(i), self.plan.token(i))
            (reasoning if self.separate and self.plan.is_reasoning(i) else content).append(piece)
        return "".join(reasoning), "".join(content)

    def reasoning_text(self) -> str:
        return self.pieces(0, self.req.generated)[0]

    def content_text(self) -> str:
        return self.pieces(0, self.req.generated)[1]


def drain(out: queue.Queue, item: tuple[int, int] | None) -> tuple[tuple[int, int] | None, bool]:
    """Merge ``item`` with every token range already queued behind it: one frame for all of them.

    SGLang's detokenizer also sends whatever accumulated since its last send; here it keeps a CPU-starved
    emulator from falling further behind its schedule by writing one frame per token. Returns the merged
    range (None if there was none) and whether the end-of-request marker was reached."""
    start: int | None = None
    end = 0
    if item is not None:
        start, end = item
    while item is not None:
        try:
            item = out.get_nowait()
        except queue.Empty:
            return ((start, end) if start is not None else None), False
        if item is not None:
            start = item[0] if start is None else start
            end = item[1]
    return ((start, end) if start is not None else None), True


def usage(req: Request) -> JSONObject:
    reasoning = min(req.generated, req.plan.reasoning_len)
    usage: JSONObject = {"prompt_tokens": len(req.prompt_tokens),
                             "total_tokens": len(req.prompt_tokens) + req.generated,
                             "completion_tokens": req.generated,
                             "prompt_tokens_details": {"cached_tokens": req.cached_tokens},
                             "reasoning_tokens": reasoning}
    if reasoning:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return usage


def completion_body(head: JSONObject, req: Request, text: str) -> JSONObject:
    """/v1/completions' answer (SGLang's CompletionResponse): ``head`` holds id, created and model."""
    return {**head, "object": "text_completion",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": req.finish_reason,
                         "matched_stop": None}],
            "usage": usage(req), "metadata": weight_metadata(req)}


def weight_metadata(req: Request) -> JSONObject:
    """``metadata`` of an OpenAI answer as 0.5.23 gives it (weight_versions: which weights made which tokens)."""
    return {"weight_version": "default", "weight_versions": [{"version": "default", "start": 0, "end": req.generated}]}


def completion_chunk(head: JSONObject, text: str, finish: str | None) -> JSONObject:
    """One SSE frame of a streamed /v1/completions answer (CompletionStreamResponse)."""
    return {**head, "object": "text_completion",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "matched_stop": None}],
            "usage": None}


def generate_out(req: Request, t0: float, done: bool) -> JSONObject:
    toks = req.plan.tokens(0, req.generated)
    finish = None
    if done and req.finish_reason == "length":
        finish = {"type": "length", "length": req.generated}
    elif done:
        finish = {"type": "stop", "matched": 151336}
    meta: JSONObject = {"id": req.rid, "finish_reason": finish, "prompt_tokens": len(req.prompt_tokens),
                            "weight_version": "default", "num_retractions": 0,   # 0.5.23's name
                            "completion_tokens": req.generated, "cached_tokens": req.cached_tokens,
                            "e2e_latency": round(time.monotonic() - t0, 6)}
    if req.accept is not None:
        meta["spec_verify_ct"] = req.verify_ct
        meta["spec_accept_length"] = (req.generated / req.verify_ct) if req.verify_ct else 0.0
    return {"text": dec.render(toks), "output_ids": [dec.token_id(t) for t in toks], "meta_info": meta}


def server_info(st: ApiState) -> JSONObject:
    r, s = st.res, st.sched
    info: JSONObject = dict(r.args)
    if not r.old_dialect:
        info["launch_command"] = " ".join(r.argv)
    info.update({"status": "ready" if st.ready.is_set() else "starting", "max_total_num_tokens": r.max_total_num_tokens,
                 "max_req_input_len": r.max_req_input_len})
    state = dict(r.args)
    state.update({"last_gen_throughput": s.last_gen_throughput, "memory_usage": dict(st.memory_usage),
                  "effective_max_running_requests_per_dp": r.max_running_requests})
    if r.speculative and s.avg_accept_len is not None:
        state["avg_spec_accept_length"] = s.avg_accept_len
    info["internal_states"] = [state]
    info["version"] = r.version
    info["emulated"] = True
    return info


def metrics_text(st: ApiState) -> str:
    r, s = st.res, st.sched
    lab = f'model_name="{r.served_model_name}",engine_type="unified",tp_rank="0",pp_rank="0"'
    out: list[str] = []

    def gauge(name: str, help_: str, value: float, kind: str = "gauge") -> None:
        out.extend([f"# HELP sglang:{name} {help_}", f"# TYPE sglang:{name} {kind}", f"sglang:{name}{{{lab}}} {value}"])

    with s._cv:
        running, queued = len(s.running), len(s.waiting)
    gauge("num_running_reqs", "The number of running requests.", float(running))
    gauge("num_queue_reqs", "The number of requests in the waiting queue.", float(queued))
    gauge("gen_throughput", "The generation throughput (token/s).", float(s.last_gen_throughput))
    gauge("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", float(r.max_total_num_tokens))
    gauge("token_usage", "The token usage.", round(s.tokens_in_use() / max(1, r.max_total_num_tokens), 4))
    if r.speculative:
        gauge("spec_accept_length", "The average acceptance length of speculative decoding.",
              float(s.last_accept_len or 0.0))
        gauge("spec_accept_rate", "The average acceptance rate of speculative decoding.",
              float(s.last_accept_rate or 0.0))
    gauge("prompt_tokens_total", "Number of prefill tokens processed.", float(s.prompt_tokens_total), "counter")
    gauge("generation_tokens_total", "Number of generation tokens processed.", float(s.generation_tokens_total),
          "counter")
    gauge("num_requests_total", "Number of requests processed.", float(s.requests_total), "counter")
    out.append("# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.")
    out.append("# TYPE sglang:time_to_first_token_seconds histogram")
    acc = 0
    for b, n in zip(TTFT_BUCKETS, s.ttft_hist):
        acc += n
        out.append(f'sglang:time_to_first_token_seconds_bucket{{{lab},le="{b}"}} {float(acc)}')
    out.append(f'sglang:time_to_first_token_seconds_bucket{{{lab},le="+Inf"}} {float(s.ttft_count)}')
    out.append(f"sglang:time_to_first_token_seconds_sum{{{lab}}} {s.ttft_sum}")
    out.append(f"sglang:time_to_first_token_seconds_count{{{lab}}} {float(s.ttft_count)}")
    return "\n".join(out) + "\n"
