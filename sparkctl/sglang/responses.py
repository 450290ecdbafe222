"""What SGLang's HTTP API answers, as data, and the pure parsers that read it (no I/O).

Why its own parsers: measuring honestly needs details generic OpenAI clients drop. They keep
``reasoning_content`` beside ``content`` (a harness that keeps only ``content`` sees "" for a
model that spent its budget thinking), carry every streamed frame's arrival time, and stop TTFT
at the first NON-EMPTY content/reasoning/tool-call delta, never at the role-only opener frame.

Everything here is tested on captured real responses (``tests/sglang/test_client.py``); the HTTP
client that feeds them is ``sparkctl.sglang.client``. A frame that is not what the protocol says
(data that is not a JSON object) raises ``EndpointProtocolError`` with the frame as evidence.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from sparkctl.errors import NodeError
from sparkctl.jsontypes import JSONMapping, JSONObject
from sparkctl.untrusted import TEXT_LIMIT, excerpt

__all__ = [
    "SGLangAPIError", "EndpointBoundError", "EndpointProtocolError", "ChatResult", "Usage", "Delta", "SSEFrame",
    "parse_sse_lines", "iter_sse_frames", "assemble_chat_stream", "parse_chat_response", "parse_usage",
    "as_json_object", "evidence_of", "int_or_none",
]

_BODY_TAIL = 800


class SGLangAPIError(NodeError):
    """An SGLang HTTP call failed: names the URL, the status (None = no response) and the body tail.

    Everything in it that the endpoint said (the reason, the body, the evidence) is bounded and escaped here, once
    (`untrusted.excerpt`): a 100 kB chunk-size line or header is an excerpt in every output that shows the error."""

    def __init__(self, url: str, status: int | None, body: str = "", *, reason: str | None = None,
                 hint: str | None = None, evidence: str | None = None) -> None:
        self.url = excerpt(url, 300)
        self.status = status
        self.reason = None if reason is None else excerpt(reason)
        self.body_tail = excerpt(body[-_BODY_TAIL:]) if body else ""
        url, reason = self.url, self.reason
        evidence = None if evidence is None else excerpt(evidence, 4 * TEXT_LIMIT, one_line=False)
        if status is None:
            msg = f"no response from {url}: {reason or 'connection failed'}"
        else:
            msg = f"HTTP {status} from {url}" + (f": {reason}" if reason else "")
        super().__init__(msg, where=url, hint=hint, evidence=evidence or self.body_tail or None)


class EndpointBoundError(SGLangAPIError):
    """The endpoint broke one of the client's bounds (a timeout, a deadline, a size or count cap); ``bound`` names
    it (``"read timeout 120 s"``). The exchange was cut there: nothing past the bound was read."""

    def __init__(self, url: str, status: int | None, *, bound: str, reason: str, hint: str | None = None,
                 evidence: str | None = None) -> None:
        self.bound = bound
        super().__init__(url, status, reason=reason, hint=hint, evidence=evidence)
        self.message = self.reason or ""
        self.args = (self.message,)


class EndpointProtocolError(SGLangAPIError):
    """The endpoint answered something that is not SGLang's protocol (a body that is not a JSON object, a
    malformed server-sent event, a compressed body it was asked not to send); ``evidence`` holds what came."""

    def __init__(self, url: str, status: int | None, *, reason: str, evidence: str | None = None,
                 hint: str | None = None) -> None:
        super().__init__(url, status, reason=reason, evidence=evidence,
                         hint=hint or "is this an SGLang (OpenAI-compatible) server? check the URL and its proxy")
        self.message = self.reason or ""
        self.args = (self.message,)


def evidence_of(data: bytes | str, limit: int = 600) -> str:
    """What was received, for an error: decoded with replacement, control characters shown, at most ``limit``
    characters (head and tail, the cut marked with its size)."""
    text = data.decode("utf-8", "replace") if isinstance(data, (bytes, bytearray)) else data
    text = "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)
    if len(text) > limit:
        cut = len(text) - limit
        text = f"{text[: limit * 2 // 3]}\n[... {cut:,} characters cut ...]\n{text[-limit // 3:]}"
    return f"received ({len(data):,} bytes):\n{text}" if data else "received: nothing"


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
    tool_calls: list[JSONObject] = field(default_factory=list)
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
    tool_calls: list[JSONObject] = field(default_factory=list)
    deltas: list[Delta] = field(default_factory=list)
    model: str | None = None
    id: str | None = None
    stream: bool = False
    raw: JSONObject | None = None   # non-streamed body

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

    payload: JSONObject | None
    done: bool = False
    raw: str = ""


# --------------------------------------------------------------------------- pure parsers

_SSE_FIELDS = ("data", "event", "id", "retry")


def iter_sse_frames(timed_lines: Iterable[tuple[float, str]], *, url: str = "") -> Iterator[tuple[float, SSEFrame]]:
    """SSE decoding over ``(arrival_time, line)`` pairs; a frame carries the time its last data line arrived.

    Follows the SSE rules that matter here: ``data:`` lines accumulate, a blank line dispatches,
    comments (``:``) are ignored, ``[DONE]`` ends the stream. Strict where a lenient reader would hide a
    broken server: a line that is no SSE field, or data that is not a JSON object, raises
    ``EndpointProtocolError`` with the line or event as evidence.
    """
    buf: list[str] = []
    t_last = 0.0
    for n, (t, line) in enumerate(timed_lines, 1):
        line = line.rstrip("\r\n")
        if not line:
            if buf:
                yield t_last, _frame("\n".join(buf), url)
                buf = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name not in _SSE_FIELDS:
            raise EndpointProtocolError(url, 200, reason=f"malformed server-sent event: line {n} is no SSE field",
                                        evidence=evidence_of(line))
        if name == "data":
            buf.append(value[1:] if value.startswith(" ") else value)
            t_last = t
    if buf:
        yield t_last, _frame("\n".join(buf), url)


def _frame(data: str, url: str = "") -> SSEFrame:
    if data.strip() == "[DONE]":
        return SSEFrame(None, done=True, raw=data)
    try:
        payload = json.loads(data)
    except ValueError as exc:
        raise EndpointProtocolError(url, 200, reason=f"malformed server-sent event: data is not JSON ({exc})",
                                    evidence=evidence_of(data)) from None
    if not isinstance(payload, dict):
        raise EndpointProtocolError(url, 200, reason="malformed server-sent event: data is not a JSON object",
                                    evidence=evidence_of(data))
    return SSEFrame(payload, raw=data)


def parse_sse_lines(lines: Iterable[str]) -> list[SSEFrame]:
    """Decode SSE text lines (no timing) into frames."""
    return [f for _, f in iter_sse_frames((0.0, line) for line in lines)]


def int_or_none(v: object) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def parse_usage(usage: JSONMapping | None) -> Usage:
    """OpenAI usage; reasoning tokens from ``usage.reasoning_tokens`` or ``completion_tokens_details``."""
    if not usage:
        return Usage()
    details = usage.get("completion_tokens_details") or {}
    cands = [int_or_none(usage.get("reasoning_tokens")), int_or_none(details.get("reasoning_tokens"))]
    known = [c for c in cands if c is not None]
    reasoning = next((c for c in known if c > 0), known[0] if known else None)
    ptd = usage.get("prompt_tokens_details") or {}
    return Usage(prompt_tokens=int_or_none(usage.get("prompt_tokens")),
                 completion_tokens=int_or_none(usage.get("completion_tokens")),
                 reasoning_tokens=reasoning, total_tokens=int_or_none(usage.get("total_tokens")),
                 cached_tokens=int_or_none(ptd.get("cached_tokens")))


def _check_error_payload(payload: JSONMapping, url: str) -> None:
    if not isinstance(payload, Mapping):
        raise EndpointProtocolError(url, 200, reason="a stream frame is not a JSON object")
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
    tool_calls: list[JSONObject] = []
    deltas: list[Delta] = []
    state = _Folded(model=None, rid=None, usage=Usage(), finish_reason=None, t_first=None, t_last=None)
    t_seen = t_start
    for t, fr in frames:
        t_seen = t
        if fr.done:
            break
        p = fr.payload or {}
        _check_error_payload(p, url)
        with _shape_checked(url, fr.raw, "a stream frame"):
            state = _fold_frame(p, t, deltas, content, reasoning, tool_calls, state)
    return ChatResult(content="".join(content), reasoning_content="".join(reasoning), usage=state.usage,
                      finish_reason=state.finish_reason, t_start=t_start,
                      t_end=t_end if t_end is not None else t_seen, t_first_token=state.t_first,
                      t_last_token=state.t_last, tool_calls=tool_calls, deltas=deltas, model=state.model, id=state.rid,
                      stream=True)


@contextlib.contextmanager
def _shape_checked(url: str, raw: str, what: str) -> Iterator[None]:
    """JSON of the wrong shape (a list where an object belongs, a number for a text) is a protocol error."""
    try:
        yield
    except (AttributeError, TypeError, KeyError, IndexError) as exc:
        raise EndpointProtocolError(url, 200, reason=f"{what} is not shaped as SGLang's API says "
                                                     f"({type(exc).__name__}: {exc})",
                                    evidence=evidence_of(raw)) from None


class _Folded(NamedTuple):
    """What a chat stream's frames said so far, besides the text: folded frame by frame."""

    model: str | None
    rid: str | None
    usage: Usage
    finish_reason: str | None
    t_first: float | None
    t_last: float | None


def _fold_frame(p: JSONMapping, t: float, deltas: list[Delta], content: list[str], reasoning: list[str],
                tool_calls: list[JSONObject], state: _Folded) -> _Folded:
    model, rid, usage, finish_reason, t_first, t_last = state
    model = p.get("model", model)
    rid = p.get("id", rid)
    if p.get("usage"):
        usage = parse_usage(p["usage"])
    for ch in p.get("choices") or []:
        if ch.get("index", 0) != 0:
            continue
        d = ch.get("delta") or {}
        delta = Delta(t=t, content=d.get("content") or "", reasoning_content=_reasoning(d),
                      tool_calls=list(d.get("tool_calls") or []), role=d.get("role"))
        if not isinstance(delta.content, str) or not isinstance(delta.reasoning_content, str):
            raise TypeError("delta content and reasoning_content must be text")
        deltas.append(delta)
        content.append(delta.content)
        reasoning.append(delta.reasoning_content)
        tool_calls.extend(delta.tool_calls)
        if delta.has_token:
            t_first = t if t_first is None else t_first
            t_last = t
        if ch.get("finish_reason"):
            finish_reason = ch["finish_reason"]
    return _Folded(model, rid, usage, finish_reason, t_first, t_last)


def _reasoning(message: JSONMapping) -> str:
    """A message's or delta's reasoning text: SGLang's ``reasoning_content``, vLLM's ``reasoning`` (0.32.0 names it
    so: tests/fixtures/captures/vllm-0.32.0-cpu/tp1-chat.txt); "" when neither is set."""
    value = message.get("reasoning_content") or message.get("reasoning") or ""
    if not isinstance(value, str):
        raise TypeError("reasoning_content / reasoning must be text")
    return value


def parse_chat_response(body: JSONMapping, t_start: float, t_end: float, *, url: str = "") -> ChatResult:
    """A non-streamed ``/v1/chat/completions`` body -> ChatResult (reasoning kept, None -> "")."""
    with _shape_checked(url, json.dumps(body, default=str)[:2000], "the chat completion"):
        choice = (body.get("choices") or [{}])[0]
        msg = choice.get("message") or {}
        res = ChatResult(content=msg.get("content") or "", reasoning_content=_reasoning(msg),
                         usage=parse_usage(body.get("usage")), finish_reason=choice.get("finish_reason"),
                         t_start=t_start, t_end=t_end, tool_calls=list(msg.get("tool_calls") or []),
                         model=body.get("model"), id=body.get("id"), stream=False, raw=dict(body))
        if not isinstance(res.content, str) or not isinstance(res.reasoning_content, str):
            raise TypeError("content and reasoning_content must be text")
    return res


def as_json_object(body: str | bytes | JSONMapping, url: str = "", status: int | None = 200) -> JSONObject:
    """A body that must be one JSON object, else ``EndpointProtocolError`` with what came as evidence."""
    if isinstance(body, Mapping):
        return dict(body)
    try:
        d = json.loads(body)
    except ValueError as exc:
        raise EndpointProtocolError(url, status, reason=f"the answer is not JSON ({exc})",
                                    evidence=evidence_of(body)) from None
    if not isinstance(d, dict):
        raise EndpointProtocolError(url, status, reason=f"expected a JSON object, got {type(d).__name__}",
                                    evidence=evidence_of(body))
    return d


