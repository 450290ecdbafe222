"""SGLangClient: the one HTTP client sparkctl uses for the real engine and for the emulator, bounded for a peer
it cannot trust.

It stamps every streamed frame with its arrival time (``time.perf_counter()``) and leaves the reading of the
answers to pure parsers (``sparkctl.sglang.responses``: SSE and chat; ``sparkctl.sglang.serverinfo``: server
info, models, metrics, role). It knows SGLang's endpoint history (``/server_info`` vs 0.5.3's
``/get_server_info``) and the non-zero node rank's dummy health server (``/health`` 200 but ``/v1/models`` 404).

Every exchange is bounded (``sparkctl.sglang.bounds.Limits``): connect, read and idle timeouts, a deadline per
request (and per run, through a shared ``RunGuard``) enforced inside every socket read, a cap on a body (an
announced Content-Length above it is refused unread) and on a server-sent event's size and count. Nothing is
read into memory without a bound: bodies and streams are read with httpx's streaming, never ``.content``. A
broken bound raises ``EndpointBoundError``; an answer that is not SGLang's protocol (not JSON, malformed SSE, a
compressed body it was asked not to send) ``EndpointProtocolError``; both are ``SGLangAPIError``s with the
evidence (what was received, truncated). The API key is sent as ``Authorization: Bearer`` only by a client that
was given one, and is never logged, printed or put in an error (it is scrubbed from every error's text, also
when a server echoes it back).

The names of the parser modules stay importable from here (``from sparkctl.sglang.client import ChatResult``).
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Generator, Iterator

import httpx

from sparkctl.jsontypes import JSONMapping, JSONObject
from sparkctl.redaction import redact
from sparkctl.sglang.bounds import DeadlineTransport, Limits, RunGuard
from sparkctl.sglang.responses import (
    ChatResult,
    Delta,
    EndpointBoundError,
    EndpointProtocolError,
    SGLangAPIError,
    SSEFrame,
    Usage,
    as_json_object,
    assemble_chat_stream,
    evidence_of,
    iter_sse_frames,
    parse_chat_response,
    parse_sse_lines,
    parse_usage,
)
from sparkctl.sglang.serverinfo import (
    NodeRole,
    PromSample,
    ServerInfo,
    accept_length_from_meta,
    detect_role,
    parse_models,
    parse_prometheus,
    parse_prometheus_samples,
    parse_server_info,
)

log = logging.getLogger("sparkctl.sglang")

__all__ = [
    "SGLangAPIError", "EndpointBoundError", "EndpointProtocolError", "SGLangClient", "Limits", "RunGuard",
    "ChatResult", "Usage", "Delta", "SSEFrame", "ServerInfo", "PromSample", "NodeRole", "parse_sse_lines",
    "iter_sse_frames", "assemble_chat_stream", "parse_chat_response", "parse_usage", "parse_server_info",
    "parse_prometheus", "parse_prometheus_samples", "parse_models", "detect_role", "accept_length_from_meta",
]

_ERROR_BODY_BYTES = 64 * 1024     # an error answer is read this far, for its tail


def _raw_chunks(r: httpx.Response) -> Iterator[bytes]:
    """The body's bytes as they arrive (no decoding); a response built in memory (httpx.MockTransport in tests)
    was read at construction and gives its content."""
    try:
        yield from r.iter_raw()
    except httpx.StreamConsumed:
        yield r.content


class SGLangClient:
    """Sync httpx client for one SGLang rank (or the emulator) at ``base_url``; one request at a time (a
    concurrent request needs its own client, as the bench's concurrency workers make).

    ``limits`` bound every exchange (``timeout``, the older argument, is the read timeout when ``limits`` is not
    given); ``guard`` shares a run's deadline and stop signal between clients.
    """

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float | httpx.Timeout | Limits = 30.0, *,
                 transport: httpx.BaseTransport | None = None, limits: Limits | None = None,
                 guard: RunGuard | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self.limits = limits or Limits.from_timeout(timeout)
        self.guard = guard
        lim = self.limits
        self._clock = None
        if transport is None:
            dt = DeadlineTransport(guard)
            self._clock, transport = dt.clock, dt
        headers = {"Accept-Encoding": "identity"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.Client(base_url=self.base_url, headers=headers, transport=transport, trust_env=False,
                                  timeout=httpx.Timeout(connect=lim.connect_s, read=lim.read_s, write=lim.read_s,
                                                        pool=lim.connect_s))

    def __repr__(self) -> str:
        return f"SGLangClient({self.base_url!r}, api_key={'***' if self._api_key else None})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SGLangClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # plumbing --------------------------------------------------------------
    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def _redact(self, text: str) -> str:
        return redact(text, {self._api_key}) if self._api_key else text

    def _scrub(self, exc: SGLangAPIError) -> SGLangAPIError:
        """The error with the API key removed from every text it carries (a server may echo it back). A broken
        bound or protocol also stops the run this client belongs to: that endpoint is not trusted any more."""
        if isinstance(exc, (EndpointBoundError, EndpointProtocolError)) and self.guard is not None:
            self.guard.trip(exc)
        if self._api_key:
            exc.message = self._redact(exc.message)
            exc.args = (exc.message,)
            exc.body_tail = self._redact(exc.body_tail)
            exc.evidence = self._redact(exc.evidence) if exc.evidence else exc.evidence
        return exc

    def _check_going(self, url: str, deadline: float, received: bytes | bytearray = b"") -> None:
        """Before a request and between received chunks: the run not stopped, no deadline passed."""
        g = self.guard
        if g is not None and g.error is not None:
            raise g.error
        now = time.monotonic()
        if g is not None and g.deadline is not None and now >= g.deadline:
            raise EndpointBoundError(url, None, bound=f"run deadline {g.run_s:g} s",
                                     reason=f"the run's deadline of {g.run_s:g} s passed",
                                     evidence=evidence_of(bytes(received[:4096])) if received else None)
        if now >= deadline:
            raise EndpointBoundError(url, None, bound=f"request deadline {self.limits.request_s:g} s",
                                     reason=f"no complete answer within the request deadline of "
                                            f"{self.limits.request_s:g} s",
                                     evidence=evidence_of(bytes(received[:4096])) if received else None)

    @contextlib.contextmanager
    def _exchange(self, method: str, path: str,
                  json: JSONMapping | None = None) -> Iterator[tuple[httpx.Response, float]]:
        """One bounded request: the response (headers read, body not) and its deadline (monotonic)."""
        url = self._url(path)
        deadline = time.monotonic() + self.limits.request_s
        log.debug("%s %s", method, url)
        if self._clock is not None:
            self._clock.request_deadline = deadline
        try:
            self._check_going(url, deadline)
            with self._http.stream(method, path, json=json) as r:
                enc = r.headers.get("content-encoding", "identity").strip().lower()
                if enc not in ("", "identity"):
                    raise EndpointProtocolError(url, r.status_code, reason=f"sent a body with Content-Encoding "
                                                f"{enc!r} though asked for identity (a compressed body cannot be "
                                                f"bounded before it is expanded)")
                yield r, deadline
        except SGLangAPIError as exc:
            raise self._scrub(exc) from None
        except httpx.TimeoutException as exc:
            try:
                self._check_going(url, deadline)      # the run stopped or a deadline passed: say that
            except SGLangAPIError as bound:
                raise self._scrub(bound) from None
            what = "connect" if isinstance(exc, httpx.ConnectTimeout) else "read"
            secs = self.limits.connect_s if what == "connect" else self.limits.read_s
            raise self._scrub(EndpointBoundError(
                url, None, bound=f"{what} timeout {secs:g} s",
                reason=(f"could not connect within {secs:g} s" if what == "connect" else
                        f"sent nothing for {secs:g} s (read timeout)"),
                hint="the server may still be loading, or hangs; check its log")) from None
        except httpx.HTTPError as exc:
            raise SGLangAPIError(url, None, reason=self._redact(f"{type(exc).__name__}: {exc}"),
                                 hint="is the server running and reachable on this address?") from None
        finally:
            if self._clock is not None:
                self._clock.request_deadline = None

    def _read_body(self, r: httpx.Response, url: str, deadline: float, cap: int | None = None) -> bytes:
        """The whole body, never more than ``cap`` bytes (Limits.max_body_bytes): an announced Content-Length
        over it is refused before a byte of the body is read."""
        cap = cap or self.limits.max_body_bytes
        announced = r.headers.get("content-length")
        if announced is not None:
            try:
                n = int(announced)
            except ValueError:
                raise EndpointProtocolError(url, r.status_code,
                                            reason=f"Content-Length is not a number: {announced[:40]!r}") from None
            if n > cap:
                raise EndpointBoundError(url, r.status_code, bound=f"body cap {cap:,} bytes",
                                         reason=f"announced a {n:,}-byte body, over the {cap:,}-byte cap: refused "
                                                f"without reading it")
        buf = bytearray()
        for chunk in _raw_chunks(r):
            buf += chunk
            if len(buf) > cap:
                raise EndpointBoundError(url, r.status_code, bound=f"body cap {cap:,} bytes",
                                         reason=f"sent more than the {cap:,}-byte body cap",
                                         evidence=evidence_of(bytes(buf[:4096])))
            self._check_going(url, deadline, buf)
        return bytes(buf)

    def _error(self, r: httpx.Response, path: str, deadline: float) -> SGLangAPIError:
        url = self._url(path)
        try:
            body = self._read_body(r, url, deadline, cap=_ERROR_BODY_BYTES).decode("utf-8", "replace")
        except EndpointBoundError as exc:
            body = f"(body not read: {exc.reason})"
        hint = "check the API key (--api-key-env NAME for --endpoint)" if r.status_code in (401, 403) else None
        return SGLangAPIError(url, r.status_code, self._redact(body), hint=hint)

    def _json(self, method: str, path: str, json: JSONMapping | None = None) -> JSONObject:
        with self._exchange(method, path, json=json) as (r, deadline):
            if r.status_code != 200:
                raise self._error(r, path, deadline)
            return as_json_object(self._read_body(r, self._url(path), deadline), self._url(path), r.status_code)

    def _lines(self, r: httpx.Response, url: str, deadline: float, max_events: int
               ) -> Iterator[tuple[float, str]]:
        """``(arrival perf_counter, line)`` of an event stream, bounded: line/event size, event count, idle."""
        lim = self.limits
        buf = bytearray()
        events = event_bytes = 0
        last_data = time.monotonic()
        head = bytearray()
        for chunk in _raw_chunks(r):
            now = time.perf_counter()
            if len(head) < 4096:
                head += chunk[: 4096 - len(head)]
            buf += chunk
            while (i := buf.find(b"\n")) >= 0:
                line = buf[:i].decode("utf-8", "replace")
                del buf[: i + 1]
                if line.startswith("data"):
                    events += 1
                    event_bytes += len(line)
                    last_data = time.monotonic()
                elif not line.strip("\r"):
                    event_bytes = 0
                if event_bytes > lim.max_event_bytes:
                    raise EndpointBoundError(url, 200, bound=f"event cap {lim.max_event_bytes:,} bytes",
                                             reason=f"sent a server-sent event over {lim.max_event_bytes:,} bytes",
                                             evidence=evidence_of(line[:2000]))
                if events > max_events:
                    raise EndpointBoundError(url, 200, bound=f"event count cap {max_events:,}",
                                             reason=f"streamed more than {max_events:,} events for this request "
                                                    f"({lim.events_per_token} per requested token + "
                                                    f"{lim.events_extra})", evidence=evidence_of(bytes(head)))
                yield now, line
            if len(buf) > lim.max_event_bytes:
                raise EndpointBoundError(url, 200, bound=f"event cap {lim.max_event_bytes:,} bytes",
                                         reason=f"sent a line over {lim.max_event_bytes:,} bytes with no end",
                                         evidence=evidence_of(bytes(buf[:2000])))
            if time.monotonic() - last_data > lim.idle_s:
                raise EndpointBoundError(url, 200, bound=f"idle timeout {lim.idle_s:g} s",
                                         reason=f"streamed no data event for {lim.idle_s:g} s (idle timeout)",
                                         evidence=evidence_of(bytes(head)))
            self._check_going(url, deadline, head)
        if buf:
            yield time.perf_counter(), buf.decode("utf-8", "replace")

    def _get_with_fallback(self, primary: str, legacy: str) -> JSONObject:
        with self._exchange("GET", primary) as (r, deadline):
            if r.status_code not in (200, 404):
                raise self._error(r, primary, deadline)
            if r.status_code == 200:
                return as_json_object(self._read_body(r, self._url(primary), deadline), self._url(primary))
        log.debug("%s not found, trying %s", primary, legacy)
        return self._json("GET", legacy)

    # endpoints -------------------------------------------------------------
    def health(self) -> int:
        """``GET /health`` status code (200 ready, 503 starting); its body is never read. Raises only when
        nothing answers in time."""
        with self._exchange("GET", "/health") as (r, _):
            return r.status_code

    def models(self) -> list[JSONObject]:
        try:
            return parse_models(self._json("GET", "/v1/models"), url=self._url("/v1/models"))
        except SGLangAPIError as exc:
            raise self._scrub(exc) from None

    def server_info(self) -> JSONObject:
        """Raw server-info JSON: ``/server_info``, falling back to ``/get_server_info`` (0.5.3) on 404."""
        return self._get_with_fallback("/server_info", "/get_server_info")

    def text(self, path: str, *, max_bytes: int | None = None) -> str:
        """``GET path`` as text (Prometheus ``/metrics``), under the client's bounds; ``max_bytes`` caps the body
        (default ``Limits.max_body_bytes``); a status other than 200 is an SGLangAPIError."""
        with self._exchange("GET", path) as (r, deadline):
            if r.status_code != 200:
                raise self._error(r, path, deadline)
            return self._read_body(r, self._url(path), deadline, cap=max_bytes).decode("utf-8", "replace")

    def flush_cache(self) -> str:
        """``POST /flush_cache`` (radix cache); returns the server's message. 400 = requests in flight."""
        with self._exchange("POST", "/flush_cache") as (r, deadline):
            if r.status_code != 200:
                raise self._error(r, "/flush_cache", deadline)
            return self._read_body(r, self._url("/flush_cache"), deadline).decode("utf-8", "replace")

    def generate(self, text: str, sampling_params: JSONMapping | None = None, *,
                 extra: JSONMapping | None = None) -> JSONObject:
        """Native ``POST /generate``; ``meta_info`` has completion_tokens, spec_verify_ct (see
        ``accept_length_from_meta``), e2e_latency..."""
        body: JSONObject = {"text": text, "sampling_params": dict(sampling_params or {})}
        body.update(extra or {})
        return self._json("POST", "/generate", json=body)

    # chat ------------------------------------------------------------------
    @staticmethod
    def _chat_body(messages: list[JSONObject], max_tokens: int, temperature: float, stream: bool,
                   model: str | None, extra: JSONMapping | None) -> JSONObject:
        body: JSONObject = {"messages": messages, "max_tokens": max_tokens, "temperature": temperature,
                                "stream": stream}
        if model is not None:
            body["model"] = model
        if stream:
            body["stream_options"] = {"include_usage": True}
        body.update(extra or {})
        return body

    def stream_chat(self, messages: list[JSONObject], *, max_tokens: int, temperature: float = 0,
                    model: str | None = None, extra: JSONMapping | None = None
                    ) -> Generator[tuple[float, SSEFrame], None, None]:
        """Stream ``/v1/chat/completions``; yields ``(perf_counter arrival, frame)`` as frames arrive."""
        path = "/v1/chat/completions"
        url = self._url(path)
        body = self._chat_body(messages, max_tokens, temperature, True, model, extra)
        with self._exchange("POST", path, json=body) as (r, deadline):
            if r.status_code != 200:
                raise self._error(r, path, deadline)
            ctype = r.headers.get("content-type", "")
            if not ctype.lower().startswith("text/event-stream"):
                sample = self._read_body(r, url, deadline, cap=4096) if ctype else b""
                raise EndpointProtocolError(url, 200, reason=f"answered a stream request with Content-Type "
                                            f"{ctype or 'none'!r}, not text/event-stream",
                                            evidence=self._redact(evidence_of(sample)))
            announced = r.headers.get("content-length", "")
            if announced.isdigit() and int(announced) > self.limits.max_body_bytes:
                raise EndpointBoundError(url, 200, bound=f"body cap {self.limits.max_body_bytes:,} bytes",
                                         reason=f"announced a {int(announced):,}-byte stream, over the "
                                                f"{self.limits.max_body_bytes:,}-byte cap: refused without reading it")
            max_events = self.limits.max_events(max_tokens)
            yield from iter_sse_frames(self._lines(r, url, deadline, max_events), url=url)

    def chat(self, messages: list[JSONObject], *, max_tokens: int, temperature: float = 0,
             stream: bool = False, model: str | None = None, extra: JSONMapping | None = None) -> ChatResult:
        """One chat completion; ``extra`` merges into the request (``chat_template_kwargs``,
        ``separate_reasoning``, ``logprobs``...). Streaming adds per-delta arrival times and TTFT."""
        path = "/v1/chat/completions"
        t_start = time.perf_counter()
        if stream:
            frames = self.stream_chat(messages, max_tokens=max_tokens, temperature=temperature, model=model,
                                      extra=extra)
            try:
                result = assemble_chat_stream(frames, t_start, url=self._url(path))
            except SGLangAPIError as exc:
                raise self._scrub(exc) from None
            finally:
                frames.close()  # stop at [DONE]: release the connection now, not at GC
            result.t_end = time.perf_counter()
            return result
        body = self._json("POST", path, json=self._chat_body(messages, max_tokens, temperature, False, model, extra))
        try:
            return parse_chat_response(body, t_start, time.perf_counter(), url=self._url(path))
        except SGLangAPIError as exc:
            raise self._scrub(exc) from None
