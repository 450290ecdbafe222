"""SGLang's HTTP surface on rank 0 (the plumbing and ranks > 0's dummy health server: `sparkctl.sim.httpbase`).

Rank 0 routes: /health /health_generate (503 until ready), /ping, /v1/models, /server_info and
/get_server_info (0.5.3 dialect: only the latter), /model_info (/get_model_info), /flush_cache,
/metrics (only with --enable-metrics), POST /v1/chat/completions and /v1/completions (stream and not),
POST /generate: what SGLang's router calls on a worker, and what clients and eval harnesses call. An unknown
path answers 404, a known path with another method 405 (FastAPI's bodies); the body is read first either way.
``--api-key`` is enforced (``Authorization: Bearer KEY``) on everything except the health probes.
Responses carry ``server: uvicorn`` like the real server; each request is logged as a Uvicorn
access line. Ranks > 0 answer only /ping, /health, /health_generate (200, empty) and 404 elsewhere.
"""
from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
import uuid
from email.utils import formatdate
from http.server import ThreadingHTTPServer

from sparkctl.jsontypes import JSONObject
from sparkctl.sim import decoding as dec
from sparkctl.sim.httpbase import HEALTH as _HEALTH
from sparkctl.sim.httpbase import (
    METHOD_NOT_ALLOWED,
    NOT_FOUND,
    BaseHandler,
    Server,
    _dumps,
    serve_dummy,  # noqa: F401 - engine.py's import
)
from sparkctl.sim.responses import (
    ApiState,
    ChatView,
    completion_body,
    completion_chunk,
    drain,
    generate_out,
    metrics_text,
    server_info,
    usage,
    weight_metadata,
)
from sparkctl.sim.scheduler import Request


def _error(message: str, code: int = 400, typ: str = "BadRequestError") -> bytes:
    return _dumps({"object": "error", "message": message, "type": typ, "param": None, "code": code}).encode()


def _bad_int(body: JSONObject, key: str, where: tuple[str, ...] = ("body",)) -> bytes | None:
    """SGLang's 400 for a field that is not an integer (its pydantic validation, as the real 0.5.23 answers
    `"max_tokens": "many"`: tests/fixtures/real-engine/0.5.23/tp1/chat_bad_type.http), or None when it is fine."""
    value = body.get(key)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return None
    detail = {"type": "int_parsing", "loc": (*where, key), "msg": "Input should be a valid integer, unable to parse "
              "string as an integer", "input": value}
    return _error(f"1 validation error:\n  {detail!r}\n", typ="Bad Request")


class _ApiHandler(BaseHandler):
    state: ApiState

    # ---- plumbing ---------------------------------------------------------------------------
    def _access(self) -> None:
        host, port = self.client_address[:2]
        self.state.log.access(f"{host}:{port}", self.command, self.path, getattr(self, "_status", 200))

    def _body(self) -> JSONObject | None:
        raw = self._read_body()
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    # the dialect's own header of a streamed answer, between content-type and transfer-encoding (SGLang's)
    STREAM_HEADERS: tuple[tuple[str, str], ...] = (("cache-control", "no-cache"),)

    def _open(self, path: str) -> bool:
        """A path served without the API key (SGLang: its health routes)."""
        return path in _HEALTH

    def _authorized(self, path: str) -> bool:
        key = self.state.res.api_key
        if not key or self._open(path):
            return True
        if self.headers.get("authorization", "") == f"Bearer {key}":
            return True
        self._json(401, {"error": "Unauthorized"})
        return False

    def _start_stream(self) -> None:
        self.send_response_only(200)
        self.send_header("date", formatdate(usegmt=True))
        self.send_header("server", "uvicorn")
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        for name, value in self.STREAM_HEADERS:
            self.send_header(name, value)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self._status = 200
        self._access()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _sse(self, obj: object) -> None:
        payload = obj if isinstance(obj, str) else _dumps(obj)
        self._chunk(f"data: {payload}\n\n".encode())

    # ---- routing ----------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        # The request's clock starts when its headers have been read, like SGLang's tokenizer manager
        # stamping created_time: tokenizing a long prompt here is part of TTFT, not added on top of it.
        self._arrived = time.monotonic()
        self._route("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._arrived = time.monotonic()
        self._route("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._route("DELETE")

    def do_PATCH(self) -> None:  # noqa: N802
        self._route("PATCH")

    def _route(self, method: str) -> None:
        self._read_body()
        path = self.path.split("?", 1)[0]
        st = self.state
        if not self._authorized(path):
            return
        if path in ("/health", "/health_generate"):
            ok = st.ready.is_set() and not st.knobs.never_healthy
            self._send(200 if ok else 503)
            self._access()
            return
        if path == "/ping":
            self._send(200)
            self._access()
            return
        routes = {
            ("GET", "/v1/models"): self._models,
            ("GET", "/model_info"): self._model_info,
            ("GET", "/get_model_info"): self._model_info,
            ("GET", "/get_server_info"): self._server_info,
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/generate"): self._generate,
            ("PUT", "/generate"): self._generate,
        }
        if not st.res.old_dialect:
            routes[("GET", "/server_info")] = self._server_info
        for m in ("GET", "POST"):
            routes[(m, "/flush_cache")] = self._flush
        if st.res.enable_metrics:
            routes[("GET", "/metrics")] = self._metrics
        handler = routes.get((method, path))
        if handler is None:
            if any(p == path for _, p in routes):           # FastAPI: a route's path with another method
                self._send(405, METHOD_NOT_ALLOWED)
            else:
                self._send(404, NOT_FOUND)
            self._access()
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            handler()

    # ---- simple endpoints -----------------------------------------------------------------------
    def _models(self) -> None:
        r = self.state.res
        self._json(200, {"object": "list", "data": [{
            "id": r.served_model_name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
            "root": r.model_path, "parent": None, "max_model_len": r.context_len}]})

    def _model_info(self) -> None:
        r = self.state.res
        self._json(200, {"model_path": r.model_path, "tokenizer_path": r.args.get("tokenizer_path"),
                         "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                         "served_model_name": r.served_model_name, "reasoning_parser": r.reasoning_parser,
                         "tool_call_parser": r.args.get("tool_call_parser"), "has_image_understanding": False,
                         "has_audio_understanding": False, "model_type": None, "architectures": None,
                         "emulated": True})

    def _server_info(self) -> None:
        if self.path.startswith("/get_server_info") and not self.state.res.old_dialect:
            self.state.log.main("Endpoint '/get_server_info' is deprecated and will be removed in a future "
                                "version. Please use '/server_info' instead.")
        self._json(200, server_info(self.state))

    def _flush(self) -> None:
        if self.state.sched.flush_cache():
            self._send(200, b"Cache flushed.\nPlease check backend logs for more details. (When there are running "
                            b"or waiting requests, the operation will not be performed.)\n",
                       "text/plain; charset=utf-8")
        else:
            self._send(400, b"Cache not flushed. Please check backend logs for more details. (When there are "
                            b"running or waiting requests, the operation will not be performed.)\n",
                       "text/plain; charset=utf-8")
        self._access()

    def _metrics(self) -> None:
        self._send(200, metrics_text(self.state).encode(), "text/plain; version=0.0.4; charset=utf-8")
        self._access()

    # ---- generation -----------------------------------------------------------------------------
    def _admit(self, text: str, prompt_tokens: list[str], max_new: int | None, temperature: float | None,
               thinking: bool, ignore_eos: bool = False) -> Request | None:
        st = self.state
        ctx = st.res.context_len
        n = len(prompt_tokens)
        if n >= ctx:
            self._json(400, _error(f"The input ({n} tokens) is longer than the model's context length "
                                   f"({ctx} tokens)."))
            return None
        if max_new is not None and n + max_new > ctx:
            self._json(400, _error(
                f"Requested token count exceeds the model's maximum context length of {ctx} tokens. You requested "
                f"a total of {n + max_new} tokens: {n} tokens from the input messages and {max_new} tokens for the "
                f"completion. Please reduce the number of tokens in the input messages or the completion to fit "
                f"within the limit."))
            return None
        plan = dec.make_plan(text, thinking=thinking, knobs=st.knobs, spec_on=st.res.speculative,
                             temperature=temperature or 0.0)
        req = Request(prompt_tokens=prompt_tokens, plan=plan,
                      max_new_tokens=max_new if max_new is not None else max(1, ctx - n),
                      created=getattr(self, "_arrived", None) or time.monotonic(), ignore_eos=ignore_eos)
        st.sched.submit(req)
        return req

    def _json(self, status: int, obj: object) -> None:
        body = obj if isinstance(obj, bytes) else _dumps(obj).encode()
        self._send(status, body)
        self._access()

    def _chat_request(self) -> tuple[JSONObject, Request] | None:
        """/v1/chat/completions' body and its admitted request (the chat template applied, thinking as
        ``chat_template_kwargs`` asks); None when a refusal was answered. Both dialects' route (vLLM's too)."""
        body = self._body()
        if body is None or not isinstance(body.get("messages"), list):
            self._json(400, _error("Invalid request: 'messages' is required"))
            return None
        bad = _bad_int(body, "max_tokens") or _bad_int(body, "max_completion_tokens")
        if bad is not None:
            self._json(400, bad)
            return None
        text = dec.chat_prompt_text(body["messages"])
        ctk = body.get("chat_template_kwargs") or {}
        thinking = ctk.get("enable_thinking", ctk.get("thinking", True)) is not False
        max_new = body.get("max_completion_tokens") or body.get("max_tokens")
        req = self._admit(text, dec.tokenize(text), int(max_new) if max_new is not None else None,
                          body.get("temperature"), thinking, ignore_eos=body.get("ignore_eos") is True)
        return None if req is None else (body, req)

    def _chat(self) -> None:
        st = self.state
        admitted = self._chat_request()
        if admitted is None:
            return
        body, req = admitted
        separate = bool(st.res.reasoning_parser) and body.get("separate_reasoning", True) is not False
        cid = uuid.uuid4().hex
        created = int(time.time())
        model = st.res.served_model_name
        view = ChatView(req, separate)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._chat_stream(req, view, cid, created, model, include_usage)
            return
        if not self._wait(req):
            return
        msg: JSONObject = {"role": "assistant", "content": view.content_text(),
                               "reasoning_content": view.reasoning_text() or None}
        self._json(200, {"id": cid, "object": "chat.completion", "created": created, "model": model,
                         "choices": [{"index": 0, "message": msg, "logprobs": None,
                                      "finish_reason": req.finish_reason, "matched_stop": None}],
                         "usage": usage(req), "metadata": weight_metadata(req)})

    def _wait(self, req: Request) -> bool:
        while True:
            try:
                item = req.out.get(timeout=1.0)
            except queue.Empty:
                if self.state.sched._stop.is_set():
                    return False
                continue
            if item is None:
                return True

    def _ranges(self, req: Request):
        """Yield each (start, end) token range of ``req`` as it is produced (merged with what queued behind it);
        return when it finished, or when the engine stops (then ``req.finished`` stays unset)."""
        while True:
            try:
                item = req.out.get(timeout=1.0)
            except queue.Empty:
                if self.state.sched._stop.is_set():
                    return
                continue
            item, finished = drain(req.out, item)
            if item is not None:
                yield item
            if finished:
                self._stream_done = True
                return

    def _completion_request(self) -> tuple[JSONObject, Request] | None:
        """OpenAI /v1/completions' body and its admitted request, a plain continuation of ``prompt`` (no chat
        template, no reasoning part); None when a refusal was answered. Both dialects' route (vLLM's too)."""
        body = self._body()
        prompt = body.get("prompt") if body is not None else None
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if body is None or not isinstance(prompt, str):
            self._json(400, _error("Invalid request: 'prompt' must be a string (or a list of one string)"))
            return None
        bad = _bad_int(body, "max_tokens")
        if bad is not None:
            self._json(400, bad)
            return None
        max_new = body.get("max_tokens", 16)          # OpenAI's, SGLang's and vLLM's CompletionRequest default
        req = self._admit(prompt, dec.tokenize(prompt), int(max_new) if max_new is not None else None,
                          body.get("temperature"), thinking=False, ignore_eos=body.get("ignore_eos") is True)
        return None if req is None else (body, req)

    def _completions(self) -> None:
        """OpenAI /v1/completions: a plain continuation of ``prompt`` (no chat template, no reasoning part)."""
        st = self.state
        admitted = self._completion_request()
        if admitted is None:
            return
        body, req = admitted
        view = ChatView(req, separate=False)
        head = {"id": uuid.uuid4().hex, "created": int(time.time()), "model": st.res.served_model_name}
        if not body.get("stream"):
            if self._wait(req):
                self._json(200, completion_body(head, req, view.content_text()))
            return
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        try:
            self._start_stream()
            self._stream_done = False
            for start, end in self._ranges(req):
                self._sse(completion_chunk(head, view.pieces(start, end)[1], None))
            if not self._stream_done:
                return
            self._sse(completion_chunk(head, "", req.finish_reason))
            if include_usage:
                self._sse({**head, "object": "text_completion", "choices": [], "usage": usage(req)})
            self._sse("[DONE]")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError, OSError):
            st.sched.abort(req)
            self.close_connection = True

    def _chat_stream(self, req: Request, view: ChatView, cid: str, created: int, model: str,
                     include_usage: bool) -> None:
        def frame(delta: JSONObject, finish: str | None = None) -> JSONObject:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                                 "matched_stop": None}], "usage": None}
        try:
            self._start_stream()
            self._sse(frame({"role": "assistant", "content": ""}))
            self._stream_done = False
            for start, end in self._ranges(req):
                reasoning, content = view.pieces(start, end)
                if reasoning:
                    self._sse(frame({"role": None, "content": None, "reasoning_content": reasoning,
                                     "tool_calls": None}))
                if content:
                    self._sse(frame({"role": None, "content": content, "reasoning_content": None,
                                     "tool_calls": None}))
            if not self._stream_done:
                return
            self._sse(frame({"role": None, "content": None, "reasoning_content": None, "tool_calls": None},
                            req.finish_reason))
            if include_usage:
                self._sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                           "choices": [], "usage": usage(req)})
            self._sse("[DONE]")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.state.sched.abort(req)
            self.close_connection = True

    def _generate(self) -> None:
        st = self.state
        body = self._body()
        if body is None or not isinstance(body.get("text"), str):
            self._json(400, _error("Either text or input_ids should be provided."))
            return
        sp = body.get("sampling_params") or {}
        bad = _bad_int(sp, "max_new_tokens", ("body", "sampling_params")) if isinstance(sp, dict) else None
        if bad is not None or not isinstance(sp, dict):
            self._json(400, bad or _error("sampling_params must be an object", typ="Bad Request"))
            return
        text = body["text"]
        max_new = int(sp.get("max_new_tokens", 128))
        req = self._admit(text, dec.tokenize(text), max_new, sp.get("temperature"), thinking=False,
                          ignore_eos=sp.get("ignore_eos") is True)
        if req is None:
            return
        t0 = req.created                      # e2e_latency from the request's arrival, as SGLang reports it
        if body.get("stream"):
            try:
                self._start_stream()
                self._stream_done = False
                for _ in self._ranges(req):
                    self._sse(generate_out(req, t0, done=False))
                if not self._stream_done:
                    return
                self._sse(generate_out(req, t0, done=True))
                self._sse("[DONE]")
                self._chunk(b"")
            except (BrokenPipeError, ConnectionResetError, OSError):
                st.sched.abort(req)
                self.close_connection = True
            return
        if self._wait(req):
            self._json(200, generate_out(req, t0, done=True))


def serve_api(host: str, port: int, state: ApiState) -> ThreadingHTTPServer:
    handler = type("ApiHandler", (_ApiHandler,), {"state": state})
    srv = Server((host, port), handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True, name="sim-http").start()
    return srv
