"""sparkctl.sglang.client: parsers on captured real responses, then end-to-end against a
loopback stdlib HTTP server (127.0.0.1, port 0) that replays captured bodies and SSE frames."""
from __future__ import annotations

import ast
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sparkctl.errors import NodeError
from sparkctl.sglang.client import (
    NodeRole,
    SGLangAPIError,
    SGLangClient,
    accept_length_from_meta,
    assemble_chat_stream,
    detect_role,
    parse_models,
    parse_prometheus,
    parse_server_info,
    parse_sse_lines,
    parse_usage,
)
from sparkctl.sglang.responses import SSEFrame
from testrig.captures import capture_lines, capture_text

SSE = "sglang-api/sse-chat-stream-reasoning-content-gpt-oss.txt"
INFO_053 = "sglang-api/get_server_info-0.5.3.post3.txt"
INFO_DEV = "sglang-api/server_info-dev-2026-04.txt"
CURL = "sglang-api/two-node-rank0-vs-rank1-http-curl.txt"
RANK0_LOG = "sglang/multinode-rank0-startup-spans-across-nodes-ok.txt"
API_KEY = "sk-test-0123456789"


# ----------------------------------------------------------------------------- SSE capture

def _payload(frame: SSEFrame) -> dict[str, Any]:
    """The JSON of a data frame (the capture has no [DONE] frame)."""
    assert frame.payload is not None, frame.raw
    return frame.payload


def test_parse_sse_capture_reasoning_frames() -> None:
    frames = parse_sse_lines(capture_lines(SSE, drop_cuts=True))
    assert len(frames) == 8 and not any(f.done for f in frames)
    deltas = [_payload(f)["choices"][0]["delta"] for f in frames]
    assert all(d["content"] is None and d["role"] is None for d in deltas)
    by_id: dict[str, str] = {}
    for f in frames:
        p = _payload(f)
        by_id[p["id"]] = by_id.get(p["id"], "") + p["choices"][0]["delta"]["reasoning_content"]
    assert by_id == {"e125c70e9a05467db6db4859d3578d1e": " answer: 4", "fea45bfa7bbd4209b1e71bdcdcc6c667": "2=4."}


def test_assemble_capture_stream_keeps_reasoning_and_times_first_reasoning_delta() -> None:
    frames = [f for f in parse_sse_lines(capture_lines(SSE, drop_cuts=True)) if _payload(f)["model"] == "gpt-oss"]
    timed = [(10.0 + i, f) for i, f in enumerate(frames)]
    r = assemble_chat_stream(timed, t_start=9.5)
    assert r.reasoning_content == " answer: 4" and r.content == ""
    assert not r.void
    assert r.t_first_token == 10.0 and r.t_last_token == 13.0 and r.ttft == 0.5
    assert r.model == "gpt-oss" and r.finish_reason is None
    assert r.usage.completion_tokens is None   # the capture has no usage frame: unknown, not zero


def test_parse_usage_reasoning_locations() -> None:
    # field names per SGLang 0.5.23 protocol.UsageInfo / CompletionTokensDetails
    assert parse_usage({"prompt_tokens": 5, "completion_tokens": 9, "reasoning_tokens": 4}).reasoning_tokens == 4
    u = parse_usage({"prompt_tokens": 5, "completion_tokens": 9, "reasoning_tokens": 0,
                     "completion_tokens_details": {"reasoning_tokens": 7}})
    assert (u.prompt_tokens, u.completion_tokens, u.reasoning_tokens) == (5, 9, 7)
    assert parse_usage(None).completion_tokens is None


# ----------------------------------------------------------------------------- server info captures

def test_parse_get_server_info_053() -> None:
    info = parse_server_info(capture_text(INFO_053))
    assert info.version == "0.5.3.post3"
    assert (info.max_total_num_tokens, info.max_running_requests, info.max_req_input_len) == (20480, 128, 20474)
    assert info.tp_size == 1 and info.speculative_algorithm is None and info.mem_fraction_static == 0.841
    assert info.last_gen_throughput == 658.2529744141941
    assert info.memory_usage == {"weight": 1.06, "kvcache": 0.23, "token_capacity": 20480, "graph": 1.77}
    assert info.effective_max_running_requests is None and info.avg_spec_accept_length is None
    assert info.raw["status"] == "ready"          # keys the parser does not pick are kept in raw
    assert info.served_model_name == "qwen/qwen2.5-0.5b-instruct"


def test_parse_server_info_dev() -> None:
    info = parse_server_info(capture_text(INFO_DEV))
    assert info.version == "0.0.0.dev1+g5dd2c243e"
    assert info.effective_max_running_requests == 128
    assert info.last_gen_throughput == 138.88680171390206
    assert info.memory_usage == {"weight": 0.98, "kvcache": 0.23, "token_capacity": 20480, "graph": 0}
    assert info.avg_spec_accept_length is None   # no speculative decoding in that run
    assert info.max_total_num_tokens == 20480


# ----------------------------------------------------------------------------- curl transcript

def _curl_exchanges(lines: list[str]) -> list[tuple[str, int | None, str]]:
    """(url, status or None when refused, body) per ``curl -v`` in the transcript."""
    out: list[tuple[str, int | None, str]] = []
    cur: dict[str, Any] | None = None
    for line in lines:
        m = re.search(r"\$ curl -v (\S+)$", line)
        if m:
            if cur:
                out.append((cur["url"], cur["status"], cur["body"]))
            body_before = line[: m.start()]
            if out and body_before.startswith("{"):
                url, status, _ = out[-1]
                out[-1] = (url, status, body_before[: body_before.rindex("}") + 1])
            cur = {"url": m.group(1), "status": None, "body": ""}
            continue
        if cur is None:
            continue
        if m := re.match(r"< HTTP/1\.1 (\d{3})", line):
            cur["status"] = int(m.group(1))
    if cur:
        out.append((cur["url"], cur["status"], cur["body"]))
    return out


def test_curl_transcript_role_detection_and_models_body() -> None:
    ex = _curl_exchanges(capture_lines(CURL))
    status = {url: st for url, st, _ in ex}
    assert status["http://10.99.91.39:30000/v1/models"] == 200
    assert status["http://10.99.91.41:30000/v1/models"] == 404
    assert status["http://10.99.91.41:30000/health"] == 200
    assert status["http://10.99.91.33:30000/health"] is None           # connection refused
    assert detect_role(status["http://10.99.91.39:30000/v1/models"],
                       status["http://10.99.91.39:30000/health"]) is NodeRole.API
    assert detect_role(status["http://10.99.91.41:30000/v1/models"],
                       status["http://10.99.91.41:30000/health"]) is NodeRole.WORKER
    assert detect_role(None, status["http://10.99.91.33:30000/health"]) is NodeRole.DOWN
    body = next(b for url, _, b in ex if url == "http://10.99.91.39:30000/v1/models")
    models = parse_models(body)
    assert [m["id"] for m in models] == ["/app/models/Deepseek-R1/"]
    assert models[0]["max_model_len"] == 163840 and models[0]["owned_by"] == "sglang"


def test_accept_length_from_meta() -> None:
    # real /generate meta_info printed by the PD warm-up in the rank-0 log (no speculation)
    meta = _captured_generate_response()["meta_info"]
    assert meta["completion_tokens"] == 8
    assert accept_length_from_meta(meta) is None
    assert accept_length_from_meta({**meta, "spec_verify_ct": 2}) == 4.0


def _captured_generate_response() -> dict[str, Any]:
    line = next(ln for ln in capture_lines(RANK0_LOG) if "warmup with status 200, resp: " in ln)
    return ast.literal_eval(line.split("resp: ", 1)[1])[0]


# ----------------------------------------------------------------------------- metrics

def test_parse_prometheus_from_prometheus_client_output() -> None:
    from testrig.testenv import need_module
    pc = need_module("prometheus_client", "the test extra (prometheus_client) is not installed")
    reg = pc.CollectorRegistry()
    g = pc.Gauge("sglang:gen_throughput", "gen", ["model_name"], registry=reg)
    g.labels(model_name="m").set(27.63)
    a = pc.Gauge("sglang:spec_accept_length", "acc", ["model_name"], registry=reg)
    a.labels(model_name="m").set(4.61)
    h = pc.Histogram("sglang:time_to_first_token_seconds", "ttft", ["model_name"], registry=reg)
    h.labels(model_name="m").observe(2.3)
    pc.Counter("other_total", "x", registry=reg).inc()
    m = parse_prometheus(pc.generate_latest(reg).decode())
    assert m["sglang:gen_throughput"] == 27.63 and m["sglang:spec_accept_length"] == 4.61
    assert m["sglang:time_to_first_token_seconds_sum"] == 2.3
    assert m["sglang:time_to_first_token_seconds_count"] == 1.0
    assert not any(k.endswith("_bucket") for k in m) and "other_total" not in m


def test_prometheus_label_values_are_unescaped_and_a_bad_line_is_skipped() -> None:
    """The exposition format escapes `"`, `\\` and newlines in label values; the hand-written parser kept `\\"`
    as written. A line that is not exposition text (untrusted input) costs only itself."""
    from sparkctl.sglang.serverinfo import parse_prometheus_samples
    text = ('# TYPE sglang:num_running_reqs gauge\n'
            'sglang:num_running_reqs{model_name="a \\"quoted\\" \\\\ name\\nx"} 3\n'
            'this is { not exposition\n'
            'sglang:gen_throughput{model_name="m"} NaN 1700000000\n')
    samples = parse_prometheus_samples(text)
    assert [s.name for s in samples] == ["sglang:num_running_reqs", "sglang:gen_throughput"]
    assert samples[0].labels == {"model_name": 'a "quoted" \\ name\nx'} and samples[0].value == 3.0
    assert samples[1].value != samples[1].value          # NaN kept as a float
    assert parse_prometheus(text)["sglang:num_running_reqs"] == 3.0


# ----------------------------------------------------------------------------- loopback server

def _frame(base: dict[str, Any], delta: dict[str, Any], finish: str | None = None) -> bytes:
    d = json.loads(json.dumps(base))
    d["choices"][0]["delta"] = delta
    d["choices"][0]["finish_reason"] = finish
    return b"data: " + json.dumps(d).encode() + b"\n\n"


def _stream_script() -> list[tuple[float, bytes]]:
    """(delay before, bytes) for one streamed chat. The 4 reasoning frames are the captured
    ones, byte for byte. The capture lacks the role opener, content, finish and usage frames
    and [DONE]: those are built from the captured frame's own JSON (same id/model/keys) with
    the delta shapes sglang.md documents (role-only opener first, usage frame with choices=[])."""
    raw = [ln for ln in capture_lines(SSE) if ln.startswith("data: ") and '"model":"gpt-oss"' in ln]
    base = json.loads(raw[0][len("data: "):])
    usage = dict(base, choices=[], usage={"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18,
                                          "reasoning_tokens": 4})
    script = [(0.0, _frame(base, {"role": "assistant", "content": "", "reasoning_content": None,
                                  "tool_calls": None}))]
    script += [(0.30 if i == 0 else 0.02, line.encode() + b"\n\n") for i, line in enumerate(raw)]
    script += [(0.02, _frame(base, {"role": None, "content": "4", "reasoning_content": None, "tool_calls": None})),
               (0.02, _frame(base, {"role": None, "content": ".", "reasoning_content": None, "tool_calls": None})),
               (0.02, _frame(base, {"role": None, "content": None, "reasoning_content": None, "tool_calls": None},
                             finish="stop")),
               (0.0, b"data: " + json.dumps(usage).encode() + b"\n\n"),
               (0.0, b"data: [DONE]\n\n")]
    return script


class _Replay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    seen: list[tuple[str, str, dict[str, Any] | None]] = []

    def log_message(self, *a: Any) -> None:   # keep pytest output clean
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {API_KEY}":
            return True
        self._send(401, b'{"error": "Unauthorized"}')
        return False

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path, None))
        if self.path == "/health":
            return self._send(200, b"", "text/plain")
        if not self._authorized():
            return None
        if self.path == "/v1/models":
            body = next(b for u, _, b in _curl_exchanges(capture_lines(CURL))
                        if u == "http://10.99.91.39:30000/v1/models")
            return self._send(200, body.encode())
        if self.path == "/get_server_info":     # 0.5.3 has only the legacy route
            return self._send(200, capture_text(INFO_053).strip().encode())
        return self._send(404, b'{"detail":"Not Found"}')

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        req = json.loads(self.rfile.read(n) or b"{}")
        self.seen.append(("POST", self.path, req))
        if not self._authorized():
            return None
        if self.path == "/generate":
            if req.get("text") == "bad":
                return self._send(400, b'{"object":"error","message":"sampling_params invalid","code":400}')
            return self._send(200, json.dumps(_captured_generate_response()).encode())
        if self.path == "/v1/chat/completions" and req.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for delay, chunk in _stream_script():
                time.sleep(delay)
                self.wfile.write(chunk)
                self.wfile.flush()
            return None
        if self.path == "/v1/chat/completions":
            # schema per sglang.md "Reasoning output": message = {role, content, reasoning_content, tool_calls}
            body = {"id": "x", "object": "chat.completion", "model": "gpt-oss",
                    "choices": [{"index": 0, "finish_reason": "length",
                                 "message": {"role": "assistant", "content": None,
                                             "reasoning_content": " answer: 4", "tool_calls": None}}],
                    "usage": {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16,
                              "reasoning_tokens": 0, "completion_tokens_details": {"reasoning_tokens": 4}}}
            return self._send(200, json.dumps(body).encode())
        return self._send(404, b'{"detail":"Not Found"}')


def _last_body() -> dict[str, Any]:
    """The JSON body of the last request the replay server saw (a POST)."""
    body = _Replay.seen[-1][2]
    assert body is not None, _Replay.seen[-1]
    return body


@pytest.fixture()
def server() -> Iterator[str]:
    _Replay.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Replay)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.timeout(20)
def test_stream_chat_ttft_stops_at_first_reasoning_delta(server: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with SGLangClient(server, api_key=API_KEY, timeout=10) as c:
        r = c.chat([{"role": "user", "content": "2+2?"}], max_tokens=32, stream=True)
    req = _last_body()
    assert req["stream"] is True and req["stream_options"] == {"include_usage": True}
    assert req["temperature"] == 0 and req["max_tokens"] == 32 and "model" not in req
    opener = r.deltas[0]
    assert opener.role == "assistant" and not opener.has_token
    first_reasoning = r.deltas[1]
    assert first_reasoning.reasoning_content == " answer"
    assert r.t_first_token == first_reasoning.t
    assert r.t_first_token - opener.t >= 0.25       # the 0.30 s gap after the role frame is in TTFT
    assert r.ttft is not None and r.ttft >= 0.29
    assert r.reasoning_content == " answer: 4" and r.content == "4."
    assert r.finish_reason == "stop"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.reasoning_tokens) == (12, 6, 4)
    assert r.t_last_token is not None
    assert r.t_start < r.t_first_token <= r.t_last_token <= r.t_end
    assert r.t_last_token == r.deltas[-2].t          # the "." content delta; finish frame carries no token
    assert r.decode_tokens_per_s() == pytest.approx(5 / (r.t_last_token - r.t_first_token))
    assert all(a.t <= b.t for a, b in zip(r.deltas, r.deltas[1:]))
    assert API_KEY not in caplog.text


def test_non_stream_chat_keeps_reasoning(server: str) -> None:
    with SGLangClient(server, api_key=API_KEY) as c:
        r = c.chat([{"role": "user", "content": "2+2?"}], max_tokens=4,
                   extra={"chat_template_kwargs": {"enable_thinking": True}})
    assert _last_body()["chat_template_kwargs"] == {"enable_thinking": True}
    assert r.content == "" and r.reasoning_content == " answer: 4" and not r.void
    assert r.usage.reasoning_tokens == 4 and r.t_first_token is None and r.finish_reason == "length"


def test_endpoints_models_server_info_fallback_generate(server: str) -> None:
    with SGLangClient(server, api_key=API_KEY) as c:
        assert c.health() == 200
        assert c.models()[0]["id"] == "/app/models/Deepseek-R1/"
        info = c.server_info()
        assert info["version"] == "0.5.3.post3"
        assert [p for m, p, _ in _Replay.seen if p.endswith("server_info")] == ["/server_info", "/get_server_info"]
        assert parse_server_info(info).max_total_num_tokens == 20480
        out = c.generate("hello", {"max_new_tokens": 8, "temperature": 0})
        assert _Replay.seen[-1][2] == {"text": "hello", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        assert out["meta_info"]["completion_tokens"] == 8 and out["text"] == "# 2023年10月"


def test_api_error_names_url_status_and_body_without_key(server: str) -> None:
    with SGLangClient(server, api_key=API_KEY) as c, pytest.raises(SGLangAPIError) as ei:
        c.generate("bad", {})
    e = ei.value
    assert isinstance(e, NodeError)
    assert e.status == 400 and e.url == f"{server}/generate"
    assert "sampling_params invalid" in e.body_tail and "sampling_params invalid" in str(e)
    assert f"HTTP 400 from {server}/generate" in str(e)
    assert API_KEY not in str(e) and API_KEY not in repr(SGLangClient(server, api_key=API_KEY))


def test_wrong_key_is_401_with_hint(server: str) -> None:
    with SGLangClient(server, api_key="nope") as c, pytest.raises(SGLangAPIError) as ei:
        c.models()
    assert ei.value.status == 401 and ei.value.hint and "api-key" in ei.value.hint


def test_unreachable_server() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with SGLangClient(f"http://127.0.0.1:{port}", timeout=2) as c:
        with pytest.raises(SGLangAPIError) as ei:
            c.health()
        assert ei.value.status is None and f"127.0.0.1:{port}" in str(ei.value)


# ----------------------------------------------------------------------------- protocol errors carry evidence

def test_malformed_sse_raises_protocol_error_with_the_event() -> None:
    from sparkctl.sglang.client import EndpointProtocolError

    lines = capture_lines(SSE, drop_cuts=True)[:2] + ['data: {"id": "x", "choices": [', ""]
    with pytest.raises(EndpointProtocolError) as ei:
        parse_sse_lines(lines)
    assert ei.value.evidence is not None
    assert "data is not JSON" in ei.value.message and '{"id": "x", "choices": [' in ei.value.evidence
    with pytest.raises(EndpointProtocolError) as ei:
        parse_sse_lines(["<html>", ""])
    assert ei.value.evidence is not None
    assert "line 1 is no SSE field" in ei.value.message and "<html>" in ei.value.evidence


def test_evidence_is_truncated_head_and_tail() -> None:
    from sparkctl.sglang.responses import evidence_of

    ev = evidence_of(b"A" * 5000 + b"\x00\x01" + b"Z" * 5000)
    assert ev.startswith("received (10,002 bytes):") and "characters cut" in ev and len(ev) < 800
    assert ev.rstrip().endswith("Z") and "AAAA" in ev and evidence_of(b"") == "received: nothing"


def test_key_echoed_in_an_error_body_is_scrubbed() -> None:
    import httpx

    def echo(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text=f"bad request, headers: {dict(request.headers)}")

    with SGLangClient("http://fake", api_key=API_KEY, transport=httpx.MockTransport(echo)) as c, \
            pytest.raises(SGLangAPIError) as ei:
        c.generate("x")
    assert ei.value.status == 500 and "authorization" in ei.value.render()
    assert API_KEY not in ei.value.render() and API_KEY not in ei.value.body_tail
