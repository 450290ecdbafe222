"""vLLM's HTTP surface on rank 0 (a ``--headless`` rank serves none), on the emulator's shared plumbing.

Routes, with the captured real answers they copy (tests/fixtures/captures/vllm-0.32.0-cpu/): ``/health`` and
``/ping`` (200, empty: tp1-health.txt, tp1-ping.txt), ``/version`` (tp1-version.txt, plus ``"emulated": true``: the
emulator's marker, as SGLang's ``/server_info`` carries it), ``/load`` (tp1-load.txt), ``/v1/models``
(tp1-v1-models.txt: ``owned_by: "vllm"``, ``max_model_len``, ``permission``), ``/metrics`` (always on: the
``vllm:`` families sparkctl's gates and card read, `metrics_text`), ``POST /v1/chat/completions`` (tp1-chat.txt,
tp1-chat-stream.raw) and ``POST /v1/completions`` (spec-ngram-completion-1.json). Everything else is FastAPI's 404
(no ``/server_info``, ``/generate``, ``/flush_cache``: vLLM 0.32.0 has none; its route table is in tp2-rank0.log).
``--api-key`` guards the ``/v1`` paths only (vLLM's authentication middleware), 401 ``{"error":"Unauthorized"}``.
The port opens only when the engine is up: before, a client gets connection refused (tp1-health-during-boot.txt).

Generation reuses the emulator's scheduler and decoding (`sparkctl.sim.http_api`'s admission and waiting).
"""
from __future__ import annotations

import contextlib
import hashlib
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

from sparkctl.jsontypes import JSONObject
from sparkctl.sim.http_api import _ApiHandler
from sparkctl.sim.httpbase import METHOD_NOT_ALLOWED, NOT_FOUND, Server
from sparkctl.sim.responses import ApiState, ChatView, drain
from sparkctl.sim.scheduler import Request
from sparkctl.sim.vllm_args import BLOCK_SIZE, VllmSettings

# vllm/v1/metrics/loggers.py's TTFT buckets (spec-ngram-metrics.txt); the scheduler's own are SGLang's
VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                     20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ROUTES = (("/health", "GET"), ("/ping", "GET"), ("/ping", "POST"), ("/load", "GET"), ("/version", "GET"),
          ("/metrics", "GET"), ("/v1/models", "GET"), ("/v1/chat/completions", "POST"), ("/v1/completions", "POST"))


class VllmState(ApiState):
    """`ApiState` plus what only vLLM's answers carry."""

    def __init__(self, res, knobs, sched, log, settings: VllmSettings) -> None:
        super().__init__(res, knobs, sched, log)
        self.vllm = settings
        self.started_unix = time.time()
        self.fingerprint = "vllm-" + res.version + "-" + hashlib.sha256(res.model_path.encode()).hexdigest()[:8]
        sched.use_ttft_buckets(VLLM_TTFT_BUCKETS)


def _usage(req: Request, *, details: bool = True) -> JSONObject:
    """vLLM's usage (tp1-chat.txt): no cached or reasoning split unless asked for (--enable-prompt-tokens-details)."""
    out: JSONObject = {"prompt_tokens": len(req.prompt_tokens), "total_tokens": len(req.prompt_tokens) + req.generated,
                       "completion_tokens": req.generated}
    if details:
        out.update({"prompt_tokens_details": None, "completion_tokens_details": None})
    return out


class _VllmHandler(_ApiHandler):
    state: VllmState

    def _send(self, status: int, body: bytes = b"", ctype: str | None = "application/json",
              headers: dict[str, str] | None = None) -> None:
        super()._send(status, body, ctype, {**(headers or {}), "vary": "Origin"})    # every captured answer has it

    # tp1-chat-stream-headers.txt: date, server, content-type, vary, transfer-encoding (no cache-control)
    STREAM_HEADERS = (("vary", "Origin"),)

    def _open(self, path: str) -> bool:
        """vLLM's API key guards only the /v1 routes (its middleware)."""
        return not path.startswith("/v1")

    def _route(self, method: str) -> None:
        self._read_body()
        path = self.path.split("?", 1)[0]
        if not self._authorized(path):
            return
        handlers = {("/health", "GET"): lambda: self._send(200), ("/ping", "GET"): lambda: self._send(200),
                    ("/ping", "POST"): lambda: self._send(200), ("/load", "GET"): self._load,
                    ("/version", "GET"): self._version, ("/metrics", "GET"): self._metrics,
                    ("/v1/models", "GET"): self._models, ("/v1/chat/completions", "POST"): self._chat,
                    ("/v1/completions", "POST"): self._completions}
        handler = handlers.get((path, method))
        if handler is None:
            known = any(p == path for p, _ in handlers)
            self._send(405 if known else 404, METHOD_NOT_ALLOWED if known else NOT_FOUND)
            self._access()
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            handler()
            if path in ("/health", "/ping"):
                self._access()

    # ---- simple endpoints ---------------------------------------------------------------------
    def _load(self) -> None:
        with self.state.sched._cv:
            load = len(self.state.sched.running) + len(self.state.sched.waiting)
        self._json(200, {"server_load": load})

    def _version(self) -> None:
        self._json(200, {"version": self.state.res.version, "emulated": True})

    def _models(self) -> None:
        r = self.state.res
        created = int(time.time())
        self._json(200, {"object": "list", "data": [{
            "id": r.served_model_name, "object": "model", "created": created, "owned_by": "vllm",
            "root": r.model_path, "parent": None, "max_model_len": r.context_len,
            "permission": [{"id": f"modelperm-{uuid.uuid4().hex[:16]}", "object": "model_permission",
                            "created": created, "allow_create_engine": False, "allow_sampling": True,
                            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                            "allow_fine_tuning": False, "organization": "*", "group": None,
                            "is_blocking": False}]}]})

    def _metrics(self) -> None:
        self._send(200, metrics_text(self.state).encode(), "text/plain; version=1.0.0; charset=utf-8")
        self._access()

    # ---- generation -----------------------------------------------------------------------------
    def _vllm_ranges(self, req: Request) -> Iterator[tuple[int, int, bool]]:
        """Each (start, end, last) token range of `req` as it comes out; `last` is the range that ends it (vLLM puts
        the finish reason on the frame of the last tokens, tp1-chat-stream.raw). Returns early if the engine
        stops (then ``_stream_done`` stays False)."""
        while True:
            try:
                item = req.out.get(timeout=1.0)
            except queue.Empty:
                if self.state.sched._stop.is_set():
                    return
                continue
            rng, finished = drain(req.out, item)
            if rng is not None and not finished and rng[1] >= req.limit:
                finished = req.out.get() is None      # the end marker follows the last range at once
            if rng is not None:
                yield rng[0], rng[1], finished
            if finished:
                self._stream_done = True
                if rng is None:
                    yield req.generated, req.generated, True
                return

    def _chat(self) -> None:
        st = self.state
        admitted = self._chat_request()
        if admitted is None:
            return
        body, req = admitted
        separate = bool(st.res.reasoning_parser)      # vLLM has no per-request separate_reasoning
        head: JSONObject = {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion",
                            "created": int(time.time()), "model": st.res.served_model_name}
        view = ChatView(req, separate)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._chat_stream_vllm(req, view, {**head, "object": "chat.completion.chunk"}, include_usage)
            return
        if not self._wait(req):
            return
        msg: JSONObject = {"role": "assistant", "content": view.content_text(), "refusal": None,
                           "annotations": None, "audio": None, "function_call": None,
                           "reasoning": view.reasoning_text() or None}
        self._json(200, {**head, "choices": [{"index": 0, "message": msg, "logprobs": None,
                                              "finish_reason": req.finish_reason, "stop_reason": None,
                                              "token_ids": None, "routed_experts": None}],
                         "service_tier": None, "system_fingerprint": st.fingerprint, "usage": _usage(req),
                         "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None,
                         "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None})

    def _chat_stream_vllm(self, req: Request, view: ChatView, head: JSONObject, include_usage: bool) -> None:
        st = self.state
        try:
            self._start_stream()
            self._sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}],
                       "prompt_token_ids": None, "prompt_text": None})
            self._stream_done = False
            for start, end, last in self._vllm_ranges(req):
                reasoning, content = view.pieces(start, end)
                if reasoning:
                    self._sse({**head, "choices": [{"index": 0, "delta": {"reasoning": reasoning}, "logprobs": None,
                                                    "finish_reason": None, "token_ids": None}]})
                if content or last or not reasoning:
                    choice: JSONObject = {"index": 0, "delta": {"content": content}, "logprobs": None,
                                          "finish_reason": req.finish_reason if last else None, "token_ids": None}
                    if last:
                        choice = {**choice, "stop_reason": None, "token_ids": None}
                    self._sse({**head, "choices": [choice]})
            if not self._stream_done:
                return
            if include_usage:
                self._sse({**head, "choices": [], "usage": _usage(req, details=False),
                           "system_fingerprint": st.fingerprint})
            self._sse("[DONE]")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError, OSError):
            st.sched.abort(req)
            self.close_connection = True

    def _completions(self) -> None:
        st = self.state
        admitted = self._completion_request()
        if admitted is None:
            return
        body, req = admitted
        view = ChatView(req, separate=False)
        head: JSONObject = {"id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion",
                            "created": int(time.time()), "model": st.res.served_model_name}

        def choice(text: str, finish: str | None) -> JSONObject:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                    "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None}
        if not body.get("stream"):
            if self._wait(req):
                self._json(200, {**head, "choices": [choice(view.content_text(), req.finish_reason)],
                                 "service_tier": None, "system_fingerprint": st.fingerprint, "usage": _usage(req),
                                 "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None})
            return
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        try:
            self._start_stream()
            self._stream_done = False
            for start, end, last in self._vllm_ranges(req):
                self._sse({**head, "choices": [choice(view.pieces(start, end)[1],
                                                      req.finish_reason if last else None)]})
            if not self._stream_done:
                return
            if include_usage:
                self._sse({**head, "choices": [], "usage": _usage(req, details=False)})
            self._sse("[DONE]")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError, OSError):
            st.sched.abort(req)
            self.close_connection = True


def _labels(st: VllmState) -> str:
    return f'engine="0",model_name="{st.res.served_model_name}"'


def _cache_config_labels(st: VllmState) -> str:
    """``vllm:cache_config_info``'s labels, in the order and with the names of tp2-metrics.txt."""
    r, v = st.res, st.vllm
    tokens = r.max_total_num_tokens
    mem = v.kv_cache_bytes if v.kv_cache_bytes is not None else tokens * st.knobs.kv_bytes_per_token
    labels = {
        "_block_size_resolved": "True", "block_size": str(BLOCK_SIZE), "cache_dtype": v.kv_cache_dtype,
        "cache_hit_alignment_tokens": "None", "effective_attention_block_size": str(BLOCK_SIZE),
        "enable_mamba_shared_prefix_checkpoint": "False", "enable_prefix_caching": str(v.prefix_caching),
        "engine": "0", "gpu_memory_utilization": str(v.gpu_memory_utilization), "hash_block_size": "None",
        "is_attention_free": "False", "kv_cache_dtype_skip_layers": "[]", "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(round(tokens / max(1, r.context_len), 2)),
        "kv_cache_memory_bytes": str(mem if v.kv_cache_bytes is not None else "None"),
        "kv_cache_size_tokens": str(tokens), "kv_offloading_backend": "native", "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False", "mamba_block_size": "None", "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none", "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": "float32",
        "num_cpu_blocks": "None", "num_gpu_blocks": str(tokens // BLOCK_SIZE), "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0", "prefix_caching_hash_algo": "sha256", "prefix_match_unit": "None",
        "replayssm_buffer_len": "16", "skip_page_size_padded": "None", "sliding_window": "None",
        "swa_bounded_replay": "True", "use_kda_recoverssm": "False", "use_replayssm": "False",
        "user_specified_block_size": "False"}
    return ",".join(f'{k}="{val}"' for k, val in labels.items())


def metrics_text(st: VllmState) -> str:
    """The ``vllm:`` families sparkctl reads (HELP/TYPE text and labels from spec-ngram-metrics.txt; counters with
    their ``_created`` sample); the spec-decode family only with ``--speculative-config``, as vLLM."""
    s, r = st.sched, st.res
    lab = _labels(st)
    created = st.started_unix
    out: list[str] = []

    def family(name: str, help_: str, kind: str, samples: list[tuple[str, float]]) -> None:
        out.extend([f"# HELP vllm:{name} {help_}", f"# TYPE vllm:{name} {kind}"])
        for extra, value in samples:
            out.append(f"vllm:{name}{{{lab}{extra}}} {float(value)}")

    def counter(name: str, help_: str, samples: list[tuple[str, float]]) -> None:
        family(f"{name}_total", help_, "counter", samples)
        out.extend([f"# HELP vllm:{name}_created {help_}", f"# TYPE vllm:{name}_created gauge"])
        out.extend(f"vllm:{name}_created{{{lab}{extra}}} {created}" for extra, _ in samples)

    if r.speculative:
        drafts, k = s.total_verify, r.num_draft_tokens - 1
        counter("spec_decode_num_drafts", "Number of spec decoding drafts.", [("", drafts)])
        counter("spec_decode_num_draft_tokens", "Number of draft tokens.", [("", drafts * k)])
        counter("spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                [("", s.total_accept - s.total_verify)])
        counter("spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                [(f',position="{i}"', n) for i, n in enumerate(s.accepted_per_pos)])
    with s._cv:
        running, waiting = len(s.running), len(s.waiting)
    family("num_requests_running", "Number of requests in model execution batches.", "gauge", [("", running)])
    family("num_requests_waiting", "Number of requests waiting to be processed.", "gauge", [("", waiting)])
    family("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "gauge",
           [("", round(s.tokens_in_use() / max(1, r.max_total_num_tokens), 6))])
    counter("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
            [("", s.prompt_tokens_total)])
    counter("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
            [("", s.cached_tokens_total)])
    counter("prompt_tokens", "Number of prefill tokens processed.", [("", s.prompt_tokens_total)])
    counter("generation_tokens", "Number of generation tokens processed.", [("", s.generation_tokens_total)])
    counter("request_success", "Count of successfully processed requests.",
            [(f',finished_reason="{why}"', s.finished_by_reason.get(why, 0))
             for why in ("stop", "length", "abort", "error", "repetition")])
    out.extend(["# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
                "# TYPE vllm:time_to_first_token_seconds histogram"])
    acc = 0
    for b, n in zip((*VLLM_TTFT_BUCKETS, "+Inf"), s.ttft_hist):
        acc += n
        out.append(f'vllm:time_to_first_token_seconds_bucket{{{lab},le="{b}"}} {float(acc)}')
    out.append(f"vllm:time_to_first_token_seconds_count{{{lab}}} {float(acc)}")
    out.append(f"vllm:time_to_first_token_seconds_sum{{{lab}}} {s.ttft_sum}")
    out.extend(["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                "# TYPE vllm:cache_config_info gauge", f"vllm:cache_config_info{{{_cache_config_labels(st)}}} 1.0"])
    return "\n".join(out) + "\n"


def serve_vllm_api(host: str, port: int, state: VllmState) -> ThreadingHTTPServer:
    handler = type("VllmApiHandler", (_VllmHandler,), {"state": state})
    srv = Server((host, port), handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True,
                     name="sim-vllm-http").start()
    return srv


__all__ = ["ROUTES", "VllmState", "metrics_text", "serve_vllm_api"]
