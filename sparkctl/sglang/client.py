"""SGLangClient: the one HTTP client sparkctl uses for the real engine and for the emulator.

Why its own client: measuring honestly needs details generic OpenAI clients drop. It keeps
``reasoning_content`` beside ``content`` (a harness that keeps only ``content`` sees "" for a
model that spent its budget thinking), stamps every streamed frame with its arrival time
(``time.perf_counter()``), and stops TTFT at the first NON-EMPTY content/reasoning/tool-call
delta, never at the role-only opener frame. It also knows SGLang's endpoint history
(``/server_info`` vs 0.5.3's ``/get_server_info``) and the non-zero node rank's dummy health
server (``/health`` 200 but ``/v1/models`` 404).

Parsing lives in pure functions (``parse_sse_lines``, ``assemble_chat_stream``,
``parse_chat_response``, ``parse_server_info``, ``parse_prometheus``, ``parse_models``,
``detect_role``) so it is tested on captured real responses. The API key is sent as
``Authorization: Bearer`` and never logged, printed or put in an error.
"""
from __future__ import annotations

import enum
import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Generator, Iterable, Iterator, Mapping

import httpx

from sparkctl.errors import NodeError
from sparkctl.sglang.launch import redact

log = logging.getLogger("sparkctl.sglang")

__all__ = [
    "SGLangAPIError", "SGLangClient", "ChatResult", "Usage", "Delta", "SSEFrame", "ServerInfo",
    "PromSample", "NodeRole", "parse_sse_lines", "iter_sse_frames", "assemble_chat_stream",
    "parse_chat_response", "parse_usage", "parse_server_info", "parse_prometheus",
    "parse_prometheus_samples", "parse_models", "detect_role", "accept_length_from_meta",
]

_BODY_TAIL = 800


class SGLangAPIError(NodeError):
    """An SGLang HTTP call failed: names the URL, the status (None = no response) and the body tail."""

    def __init__(self, url: str, status: int | None, body: str = "", *, reason: str | None = None,
                 hint: str | None = None) -> None:
        self.url = url
        self.status = status
        self.body_tail = body[-_BODY_TAIL:] if body else ""
        if status is None:
            msg = f"no response from {url}: {reason or 'connection failed'}"
        else:
            msg = f"HTTP {status} from {url}" + (f": {reason}" if reason else "")
        super().__init__(msg, where=url, hint=hint, evidence=self.body_tail or None)


# --------------------------------------------------------------------------- data

@dataclass
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None     # reasoning + content
    reasoning_tokens: int | None = None      # the reasoning part, when the server reports it
    total_tokens: int | None = None
    cached_tokens: int | None = None


@dataclass
class Delta:
    """One streamed chunk's payload with its arrival time (``time.perf_counter()``)."""

    t: float
    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    role: str | None = None

    @property
    def has_token(self) -> bool:
        return bool(self.content or self.reasoning_content or self.tool_calls)


@dataclass
class ChatResult:
    """A chat completion with both channels and its timings (perf_counter seconds).

    Non-streamed results have ``t_first_token``/``t_last_token`` None: a non-streamed
    latency includes prefill and cannot give a TTFT.
    """

    content: str
    reasoning_content: str
    usage: Usage
    finish_reason: str | None
    t_start: float
    t_end: float
    t_first_token: float | None = None
    t_last_token: float | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    deltas: list[Delta] = field(default_factory=list)
    model: str | None = None
    id: str | None = None
    stream: bool = False
    raw: dict[str, Any] | None = None   # non-streamed body

    @property
    def ttft(self) -> float | None:
        return None if self.t_first_token is None else self.t_first_token - self.t_start

    @property
    def latency(self) -> float:
        return self.t_end - self.t_start

    @property
    def void(self) -> bool:
        """Nothing comparable captured: no content, no reasoning, no tool call."""
        return not (self.content or self.reasoning_content or self.tool_calls)

    def decode_tokens_per_s(self) -> float | None:
        """(N-1)/(t_last - t_first) with N = usage.completion_tokens (never the chunk count)."""
        n = self.usage.completion_tokens
        if n is None or n < 2 or self.t_first_token is None or self.t_last_token is None:
            return None
        span = self.t_last_token - self.t_first_token
        return (n - 1) / span if span > 0 else None


@dataclass(frozen=True)
class SSEFrame:
    """One server-sent event: parsed JSON ``payload`` or ``done`` for ``data: [DONE]``."""

    payload: dict[str, Any] | None
    done: bool = False
    raw: str = ""


@dataclass
class ServerInfo:
    """The fields sparkctl records from ``/server_info`` (or 0.5.3's ``/get_server_info``)."""

    version: str | None
    max_total_num_tokens: int | None
    max_running_requests: int | None
    effective_max_running_requests: int | None
    max_req_input_len: int | None
    tp_size: int | None
    context_length: int | None
    model_path: str | None
    served_model_name: str | None
    speculative_algorithm: str | None
    speculative_num_draft_tokens: int | None
    kv_cache_dtype: str | None
    mem_fraction_static: float | None
    last_gen_throughput: float | None
    avg_spec_accept_length: float | None
    memory_usage: dict[str, Any] | None
    raw: dict[str, Any]


@dataclass(frozen=True)
class PromSample:
    name: str
    labels: dict[str, str]
    value: float


class NodeRole(enum.Enum):
    API = "api"            # rank 0: the real HTTP server (/v1/models answers)
    WORKER = "worker"      # node rank > 0: dummy health server (/health 200, /v1/models 404)
    DOWN = "down"          # nothing listening
    UNKNOWN = "unknown"


# --------------------------------------------------------------------------- pure parsers

def iter_sse_frames(timed_lines: Iterable[tuple[float, str]]) -> Iterator[tuple[float, SSEFrame]]:
    """SSE decoding over ``(arrival_time, line)`` pairs; a frame carries the time its last data line arrived.

    Follows the SSE rules that matter here: ``data:`` lines accumulate, a blank line dispatches,
    comments (``:``) and other fields are ignored, ``[DONE]`` ends the stream.
    """
    buf: list[str] = []
    t_last = 0.0
    for t, line in timed_lines:
        line = line.rstrip("\r\n")
        if not line:
            if buf:
                yield t_last, _frame("\n".join(buf))
                buf = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            buf.append(value[1:] if value.startswith(" ") else value)
            t_last = t
    if buf:
        yield t_last, _frame("\n".join(buf))


def _frame(data: str) -> SSEFrame:
    if data.strip() == "[DONE]":
        return SSEFrame(None, done=True, raw=data)
    return SSEFrame(json.loads(data), raw=data)


def parse_sse_lines(lines: Iterable[str]) -> list[SSEFrame]:
    """Decode SSE text lines (no timing) into frames."""
    return [f for _, f in iter_sse_frames((0.0, line) for line in lines)]


def _int_or_none(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def parse_usage(usage: Mapping[str, Any] | None) -> Usage:
    """OpenAI usage; reasoning tokens from ``usage.reasoning_tokens`` or ``completion_tokens_details``."""
    if not usage:
        return Usage()
    details = usage.get("completion_tokens_details") or {}
    cands = [_int_or_none(usage.get("reasoning_tokens")), _int_or_none(details.get("reasoning_tokens"))]
    known = [c for c in cands if c is not None]
    reasoning = next((c for c in known if c > 0), known[0] if known else None)
    ptd = usage.get("prompt_tokens_details") or {}
    return Usage(prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
                 completion_tokens=_int_or_none(usage.get("completion_tokens")),
                 reasoning_tokens=reasoning, total_tokens=_int_or_none(usage.get("total_tokens")),
                 cached_tokens=_int_or_none(ptd.get("cached_tokens")))


def _check_error_payload(payload: Mapping[str, Any], url: str) -> None:
    if "error" in payload and not payload.get("choices"):
        err = payload["error"]
        msg = err.get("message") if isinstance(err, dict) else str(err)
        code = err.get("code") if isinstance(err, dict) else None
        raise SGLangAPIError(url, code if isinstance(code, int) else None, json.dumps(payload),
                             reason=f"error in stream: {msg}")


def assemble_chat_stream(frames: Iterable[tuple[float, SSEFrame]], t_start: float,
                         t_end: float | None = None, *, url: str = "") -> ChatResult:
    """Fold timed chat-completion chunks into a ChatResult (choice 0).

    TTFT clock: first delta with non-empty content, reasoning_content or tool_calls; the
    role-only opener and empty deltas never count. Usage comes from the usage frame
    (``stream_options.include_usage``).
    """
    content: list[str] = []
    reasoning: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    deltas: list[Delta] = []
    usage = Usage()
    finish_reason = model = rid = None
    t_first = t_last = None
    t_seen = t_start
    for t, fr in frames:
        t_seen = t
        if fr.done:
            break
        p = fr.payload or {}
        _check_error_payload(p, url)
        model = p.get("model", model)
        rid = p.get("id", rid)
        if p.get("usage"):
            usage = parse_usage(p["usage"])
        for ch in p.get("choices") or []:
            if ch.get("index", 0) != 0:
                continue
            d = ch.get("delta") or {}
            delta = Delta(t=t, content=d.get("content") or "", reasoning_content=d.get("reasoning_content") or "",
                          tool_calls=list(d.get("tool_calls") or []), role=d.get("role"))
            deltas.append(delta)
            content.append(delta.content)
            reasoning.append(delta.reasoning_content)
            tool_calls.extend(delta.tool_calls)
            if delta.has_token:
                t_first = t if t_first is None else t_first
                t_last = t
            if ch.get("finish_reason"):
                finish_reason = ch["finish_reason"]
    return ChatResult(content="".join(content), reasoning_content="".join(reasoning), usage=usage,
                      finish_reason=finish_reason, t_start=t_start, t_end=t_end if t_end is not None else t_seen,
                      t_first_token=t_first, t_last_token=t_last, tool_calls=tool_calls, deltas=deltas,
                      model=model, id=rid, stream=True)


def parse_chat_response(body: Mapping[str, Any], t_start: float, t_end: float) -> ChatResult:
    """A non-streamed ``/v1/chat/completions`` body -> ChatResult (reasoning kept, None -> "")."""
    choice = (body.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    return ChatResult(content=msg.get("content") or "", reasoning_content=msg.get("reasoning_content") or "",
                      usage=parse_usage(body.get("usage")), finish_reason=choice.get("finish_reason"),
                      t_start=t_start, t_end=t_end, tool_calls=list(msg.get("tool_calls") or []),
                      model=body.get("model"), id=body.get("id"), stream=False, raw=dict(body))


def _as_json(body: str | bytes | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(body, Mapping):
        return dict(body)
    d = json.loads(body)
    if not isinstance(d, dict):
        raise ValueError(f"expected a JSON object, got {type(d).__name__}")
    return d


def parse_server_info(body: str | bytes | Mapping[str, Any]) -> ServerInfo:
    """Pick the recorded fields out of a server-info body; tolerant of extra and missing keys.

    ``internal_states[0]`` (per DP rank) holds the live values: effective max running
    requests, last gen throughput, memory usage and, with speculation, avg accept length.
    """
    d = _as_json(body)
    states = d.get("internal_states") or [{}]
    st = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}

    def pick(key: str) -> Any:
        return d.get(key, st.get(key))

    def num(v: Any) -> float | None:
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    return ServerInfo(
        version=pick("version"), max_total_num_tokens=_int_or_none(pick("max_total_num_tokens")),
        max_running_requests=_int_or_none(pick("max_running_requests")),
        effective_max_running_requests=_int_or_none(st.get("effective_max_running_requests_per_dp")),
        max_req_input_len=_int_or_none(pick("max_req_input_len")), tp_size=_int_or_none(pick("tp_size")),
        context_length=_int_or_none(pick("context_length")), model_path=pick("model_path"),
        served_model_name=pick("served_model_name"), speculative_algorithm=pick("speculative_algorithm"),
        speculative_num_draft_tokens=_int_or_none(pick("speculative_num_draft_tokens")),
        kv_cache_dtype=pick("kv_cache_dtype"), mem_fraction_static=num(pick("mem_fraction_static")),
        last_gen_throughput=num(st.get("last_gen_throughput")),
        avg_spec_accept_length=num(st.get("avg_spec_accept_length", d.get("avg_spec_accept_length"))),
        memory_usage=st.get("memory_usage"), raw=d)


_PROM_LINE_RE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\d+)?\s*$")
_PROM_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prometheus_samples(text: str) -> list[PromSample]:
    """Prometheus text exposition -> samples (comments skipped, NaN/Inf kept as floats)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _PROM_LINE_RE.match(line)
        if not m:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        labels = dict(_PROM_LABEL_RE.findall(m.group("labels") or ""))
        out.append(PromSample(m.group("name"), labels, value))
    return out


def parse_prometheus(text: str, prefix: str = "sglang:") -> dict[str, float]:
    """``/metrics`` -> {name: value} for names starting with ``prefix``.

    Histogram ``_bucket`` rows are dropped (``_sum``/``_count`` kept). With several label sets
    for one name (several TP/DP ranks, models) the first sample wins; use
    ``parse_prometheus_samples`` when the labels matter.
    """
    out: dict[str, float] = {}
    for s in parse_prometheus_samples(text):
        if s.name.startswith(prefix) and not s.name.endswith("_bucket"):
            out.setdefault(s.name, s.value)
    return out


def parse_models(body: str | bytes | Mapping[str, Any]) -> list[dict[str, Any]]:
    """``/v1/models`` body -> its ``data`` list (``id`` = served model name, ``max_model_len``...)."""
    d = _as_json(body)
    return [m for m in d.get("data") or [] if isinstance(m, dict)]


def detect_role(models_status: int | None, health_status: int | None) -> NodeRole:
    """Which SGLang HTTP server answers on a port, from two status codes (None = no connection).

    Rank 0 serves the OpenAI API (``/v1/models`` 200, or 401 behind ``--api-key``); a non-zero
    node rank serves only the dummy health server, whose ``/health`` is always 200 and which
    has no ``/v1/models`` (404). Never trust a worker's ``/health`` as readiness.
    """
    if models_status in (200, 401, 403):
        return NodeRole.API
    if models_status == 404 and health_status == 200:
        return NodeRole.WORKER
    if models_status is None and health_status is None:
        return NodeRole.DOWN
    return NodeRole.UNKNOWN


def accept_length_from_meta(meta_info: Mapping[str, Any]) -> float | None:
    """Per-request accept length = completion_tokens / spec_verify_ct (None without speculation)."""
    ct, n = meta_info.get("spec_verify_ct"), meta_info.get("completion_tokens")
    if isinstance(ct, list):      # batched form
        ct = sum(x for x in ct if isinstance(x, (int, float)))
    if not isinstance(ct, (int, float)) or not ct or not isinstance(n, (int, float)):
        return None
    return n / ct


# --------------------------------------------------------------------------- client

class SGLangClient:
    """Sync httpx client for one SGLang rank (or the emulator) at ``base_url``."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float | httpx.Timeout = 30.0, *,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport)

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

    def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        url = self._url(path)
        log.debug("%s %s", method, url)
        try:
            return self._http.request(method, path, **kw)
        except httpx.TimeoutException as e:
            raise SGLangAPIError(url, None, reason=f"timed out ({type(e).__name__})",
                                 hint="the server may still be loading; check its log") from None
        except httpx.HTTPError as e:
            raise SGLangAPIError(url, None, reason=self._redact(f"{type(e).__name__}: {e}"),
                                 hint="is the server running and reachable on this address?") from None

    def _error(self, r: httpx.Response, path: str) -> SGLangAPIError:
        hint = "check --api-key" if r.status_code in (401, 403) else None
        return SGLangAPIError(self._url(path), r.status_code, self._redact(r.text), hint=hint)

    def _json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        r = self._send(method, path, **kw)
        if r.status_code != 200:
            raise self._error(r, path)
        return self._decode(r, path)

    def _decode(self, r: httpx.Response, path: str) -> dict[str, Any]:
        try:
            return _as_json(r.content)
        except ValueError:
            raise SGLangAPIError(self._url(path), r.status_code, self._redact(r.text),
                                 reason="response is not a JSON object") from None

    def _get_with_fallback(self, primary: str, legacy: str) -> dict[str, Any]:
        r = self._send("GET", primary)
        if r.status_code == 404:
            log.debug("%s not found, trying %s", primary, legacy)
            return self._json("GET", legacy)
        if r.status_code != 200:
            raise self._error(r, primary)
        return self._decode(r, primary)

    # endpoints -------------------------------------------------------------
    def health(self) -> int:
        """``GET /health`` status code (200 ready, 503 starting). Raises only when nothing answers."""
        return self._send("GET", "/health").status_code

    def models(self) -> list[dict[str, Any]]:
        return parse_models(self._json("GET", "/v1/models"))

    def server_info(self) -> dict[str, Any]:
        """Raw server-info JSON: ``/server_info``, falling back to ``/get_server_info`` (0.5.3) on 404."""
        return self._get_with_fallback("/server_info", "/get_server_info")

    def flush_cache(self) -> str:
        """``POST /flush_cache`` (radix cache); returns the server's message. 400 = requests in flight."""
        r = self._send("POST", "/flush_cache")
        if r.status_code != 200:
            raise self._error(r, "/flush_cache")
        return r.text

    def generate(self, text: str, sampling_params: Mapping[str, Any] | None = None, *,
                 extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Native ``POST /generate``; ``meta_info`` has completion_tokens, spec_verify_ct (see
        ``accept_length_from_meta``), e2e_latency..."""
        body: dict[str, Any] = {"text": text, "sampling_params": dict(sampling_params or {})}
        body.update(extra or {})
        return self._json("POST", "/generate", json=body)

    # chat ------------------------------------------------------------------
    @staticmethod
    def _chat_body(messages: list[dict[str, Any]], max_tokens: int, temperature: float, stream: bool,
                   model: str | None, extra: Mapping[str, Any] | None) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "temperature": temperature,
                                "stream": stream}
        if model is not None:
            body["model"] = model
        if stream:
            body["stream_options"] = {"include_usage": True}
        body.update(extra or {})
        return body

    def stream_chat(self, messages: list[dict[str, Any]], *, max_tokens: int, temperature: float = 0,
                    model: str | None = None, extra: Mapping[str, Any] | None = None
                    ) -> Generator[tuple[float, SSEFrame], None, None]:
        """Stream ``/v1/chat/completions``; yields ``(perf_counter arrival, frame)`` as frames arrive."""
        path = "/v1/chat/completions"
        body = self._chat_body(messages, max_tokens, temperature, True, model, extra)
        try:
            with self._http.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    r.read()
                    raise self._error(r, path)
                timed = ((time.perf_counter(), line) for line in r.iter_lines())
                yield from iter_sse_frames(timed)
        except httpx.HTTPError as e:
            raise SGLangAPIError(self._url(path), None, reason=self._redact(f"{type(e).__name__}: {e}")) from None

    def chat(self, messages: list[dict[str, Any]], *, max_tokens: int, temperature: float = 0,
             stream: bool = False, model: str | None = None, extra: Mapping[str, Any] | None = None) -> ChatResult:
        """One chat completion; ``extra`` merges into the request (``chat_template_kwargs``,
        ``separate_reasoning``, ``logprobs``...). Streaming adds per-delta arrival times and TTFT."""
        path = "/v1/chat/completions"
        t_start = time.perf_counter()
        if stream:
            frames = self.stream_chat(messages, max_tokens=max_tokens, temperature=temperature, model=model,
                                      extra=extra)
            try:
                result = assemble_chat_stream(frames, t_start, url=self._url(path))
            finally:
                frames.close()  # stop at [DONE]: release the connection now, not at GC
            result.t_end = time.perf_counter()
            return result
        body = self._json("POST", path, json=self._chat_body(messages, max_tokens, temperature, False, model, extra))
        return parse_chat_response(body, t_start, time.perf_counter())
