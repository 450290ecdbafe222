"""`sparkctl bench --endpoint` against hostile local servers: every behaviour x every endpoint the bench reads.

A real HTTP server on 127.0.0.1 (stdlib, one thread per connection) answers like a small SGLang server except on
one endpoint, where it does one hostile thing: never answers, trickles its answer a byte a second, streams
forever, answers something that is not JSON, sends malformed server-sent events, or announces a 2 GB body. Each
run must end within its bound, exit 4 with a message that names what happened, and leave a card marked failed.
The bounds are made short through the CLI's own flags so the whole table runs in about half a minute.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

# The bench's bounds in these tests (seconds): a trickle of one byte a second never trips READ, so the request
# DEADLINE cuts it; SILENT waits for READ.
READ, DEADLINE = 2.0, 3.0
FLAGS = ["--connect-timeout", "1", "--read-timeout", str(READ), "--idle-timeout", str(READ),
         "--request-deadline", str(DEADLINE), "--run-deadline", "30"]
# Gates that make the bench read every endpoint once: /health, /server_info, /v1/models (server_info names no
# model), the streamed chat (cold, decode), /generate (acceptance on a speculative server), the non-streamed chat
# (TTFT token calibration).
WORKLOAD = ["--gates", "cold,acceptance,ttft", "--runs", "1", "--max-tokens", "8", "--warmup", "0",
            "--ttft-sizes", "64", "--ttft-runs", "1", "--concurrency", "1"]
ENDPOINTS = ["health", "server_info", "models", "chat-stream", "generate", "chat"]


def _chunk(content: str, **extra: Any) -> bytes:
    body = {"id": "c1", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": {"role": None, "content": content, "reasoning_content": None},
                         "finish_reason": None}], **extra}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


NORMAL_INFO = {"version": "0.5.23", "tp_size": 2, "speculative_algorithm": "DFLASH",
               "speculative_num_draft_tokens": 8, "context_length": 4096, "max_total_num_tokens": 65536,
               "max_total_tokens": 131072, "api_key": "server-side-secret", "internal_states": [{}]}


class Hostile(BaseHTTPRequestHandler):
    """A small SGLang server; ``plan`` maps an endpoint to the hostile behaviour it shows there."""

    protocol_version = "HTTP/1.1"
    plan: dict[str, str] = {}
    seen_headers: list[dict[str, str]] = []
    stop = threading.Event()

    def log_message(self, *a: Any) -> None:
        pass

    # -- the endpoint of this request ---------------------------------------------------------------------------
    def _endpoint(self, req: dict[str, Any] | None) -> str:
        path = self.path.split("?")[0]
        if path == "/v1/chat/completions":
            return "chat-stream" if (req or {}).get("stream") else "chat"
        return {"/health": "health", "/server_info": "server_info", "/get_server_info": "server_info",
                "/v1/models": "models", "/generate": "generate"}.get(path, "404")

    def do_GET(self) -> None:
        self._handle(None)

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self._handle(json.loads(self.rfile.read(n) or b"{}"))

    def _handle(self, req: dict[str, Any] | None) -> None:
        self.seen_headers.append({k.lower(): v for k, v in self.headers.items()})
        ep = self._endpoint(req)
        behaviour = self.plan.get(ep)
        if behaviour is None:
            return self._normal(ep, req)
        if behaviour == "textless":
            return self._textless(ep, req)  # type: ignore[attr-defined]
        return getattr(self, f"_{behaviour}")(ep)

    # -- normal answers ------------------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, ctype: str = "application/json", extra: dict[str, str] | None = None
              ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _echo(self) -> str:
        return json.dumps(self.seen_headers[-1])

    def _normal(self, ep: str, req: dict[str, Any] | None) -> None:
        leak = {"X-Leak": "response-header-marker"}
        if ep == "health":
            return self._send(200, b"", "text/plain")
        if ep == "server_info":
            return self._send(200, json.dumps(NORMAL_INFO).encode())
        if ep == "models":
            models = {"object": "list", "data": [{"id": "m", "max_model_len": 4096}]}
            return self._send(200, json.dumps(models).encode())
        if ep == "generate":
            return self._send(200, json.dumps({"text": "x", "meta_info": {"completion_tokens": 8,
                                                                          "spec_verify_ct": 2}}).encode())
        if ep == "chat":
            assert req is not None, ep                  # a POST: its body
            words = len(str(req["messages"][0]["content"]).split())
            body = {"id": "c", "object": "chat.completion", "model": "m",
                    "choices": [{"index": 0, "finish_reason": "length",
                                 "message": {"role": "assistant", "content": self._echo(), "reasoning_content": None}}],
                    "usage": {"prompt_tokens": 10 + words, "completion_tokens": 1, "total_tokens": 11 + words}}
            return self._send(200, json.dumps(body).encode(), extra=leak)
        if ep == "chat-stream":
            assert req is not None, ep
            n = int(req.get("max_tokens") or 8)
            frames = [_chunk("", choices=[{"index": 0, "delta": {"role": "assistant", "content": ""},
                                           "finish_reason": None}])]
            frames += [_chunk(f"t{i} ") for i in range(n)]
            frames.append(b"data: " + json.dumps({"id": "c1", "choices": [], "usage": {
                "prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}}).encode() + b"\n\n")
            frames.append(b"data: [DONE]\n\n")
            return self._send(200, b"".join(frames), "text/event-stream", extra=leak)
        return self._send(404, b'{"detail":"Not Found"}')

    # -- hostile behaviours --------------------------------------------------------------------------------------
    def _silent(self, ep: str) -> None:
        self.stop.wait(60)
        self.close_connection = True

    def _trickle(self, ep: str) -> None:
        body = b'{"version": "0.5.23"}' if ep != "chat-stream" else _chunk("x") * 3
        head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        for b in head + body:                 # from the status line on: the headers are trickled too
            if self.stop.wait(1.0):
                break
            try:
                self.wfile.write(bytes([b]))
                self.wfile.flush()
            except OSError:
                break
        self.close_connection = True

    def _forever(self, ep: str) -> None:
        stream = ep == "chat-stream"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if stream else "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        piece = _chunk("x") if stream else b'{"pad": "' + b"x" * 65536
        try:
            while not self.stop.is_set():
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
                time.sleep(0.002)
        except OSError:
            pass
        self.close_connection = True

    def _keepalive(self, ep: str) -> None:
        """An event stream of SSE comments only, forever: bytes keep coming, no event ever does."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while not self.stop.wait(0.2):
                self.wfile.write(b"d\r\n: keep-alive\n\r\n")
                self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True

    def _wrong_shape(self, ep: str) -> None:
        """JSON, but not shaped as SGLang's API: an array for an object, a string for a list, a number for text."""
        if ep == "chat-stream":
            body, ctype = _chunk("x") + b'data: {"choices": [{"index": 0, "delta": {"content": 42}}]}\n\n', \
                "text/event-stream"
        else:
            body = {"server_info": b"[1, 2, 3]", "models": b'{"data": 5}', "generate": b'{"meta_info": "fast"}',
                    "chat": b'{"choices": "none"}'}[ep]
            ctype = "application/json"
        self._send(200, body, ctype)

    def _non_json(self, ep: str) -> None:
        self._send(200, b"<html><body>502 Bad Gateway (nginx)</body></html>", "text/html")

    def _malformed_sse(self, ep: str) -> None:
        ctype = "text/event-stream" if ep == "chat-stream" else "application/json"
        self._send(200, _chunk("ok") + b'data: {"id": "c1", "choices": [{"delta": {"content": "x"\n\n', ctype)

    def _huge(self, ep: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if ep == "chat-stream" else "application/json")
        self.send_header("Content-Length", str(2 * 1024 ** 3))
        self.end_headers()
        try:
            self.wfile.write(b'{"a": "' + b"x" * 1024)
            self.wfile.flush()
        except OSError:
            pass
        self.stop.wait(60)
        self.close_connection = True


@pytest.fixture()
def hostile() -> Iterator[Callable[[dict[str, str]], str]]:
    servers: list[ThreadingHTTPServer] = []
    Hostile.stop = threading.Event()
    Hostile.seen_headers = []

    def start(plan: dict[str, str]) -> str:
        handler = type("H", (Hostile,), {"plan": plan})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield start
    finally:
        Hostile.stop.set()
        for s in servers:
            s.shutdown()
            s.server_close()


# behaviour -> (the message the bench must give (regex), the bound it must end within, s)
BEHAVIOURS: dict[str, tuple[str, float]] = {
    "silent": (rf"sent nothing for {READ:g} s \(read timeout\)", READ),
    "trickle": (rf"no complete answer within the request deadline of {DEADLINE:g} s", DEADLINE),
    # whichever bound comes first on a loaded machine: the event count or body cap, else the request deadline
    "forever": (r"streamed more than \d[\d,]* events|more than the 8,388,608-byte body cap|request deadline of",
                DEADLINE),
    "keepalive": (rf"streamed no data event for {READ:g} s \(idle timeout\)", READ),
    "wrong_shape": (r"not shaped as SGLang's API says|expected a JSON object, got list|not a list|not an object", 1.0),
    "non_json": (r"not JSON|not text/event-stream", 1.0),
    "malformed_sse": (r"malformed server-sent event|not JSON", 1.0),
    "huge": (r"announced a 2,147,483,648-byte (body|stream), over the 8,388,608-byte cap: refused without reading",
             1.0),
}
# /health is read for its status only: a body the bench never reads cannot hurt it.
HARMLESS = {("health", b) for b in ("forever", "non_json", "malformed_sse", "huge", "keepalive", "wrong_shape")}
# SSE keep-alive comments are a behaviour of event streams only.
HARMLESS |= {(ep, "keepalive") for ep in ENDPOINTS if ep != "chat-stream"}
CASES = [(b, ep) for b in BEHAVIOURS for ep in ENDPOINTS if (ep, b) not in HARMLESS]
SLACK_S = 4.0      # bench start-up and teardown on a loaded 2-core machine, on top of the bound


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("behaviour", "endpoint"), CASES, ids=[f"{b}-{e}" for b, e in CASES])
def test_hostile_endpoint_ends_within_its_bound_exit_4(behaviour, endpoint, hostile, cli, state_dir, tmp_path,
                                                      monkeypatch):
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    url = hostile({endpoint: behaviour})
    pattern, bound = BEHAVIOURS[behaviour]
    t0 = time.monotonic()
    code, out, err = cli("bench", "--endpoint", url, *WORKLOAD, *FLAGS, "--out", str(tmp_path))
    elapsed = time.monotonic() - t0
    if os.environ.get("SPARKCTL_SHOW_HOSTILE"):
        print(f"\n=== {behaviour} x {endpoint}: exit {code} in {elapsed:.1f} s\n{err}")
    assert code == 4, err
    assert re.search(pattern, err), err
    assert elapsed < bound + SLACK_S, (elapsed, err)
    assert "Traceback" not in err and "marked failed" in err
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "failed" and re.search(pattern, report["errors"][0])
    card = (tmp_path / "report.md").read_text()
    assert "status **failed**" in card and "**Error**" in card


@pytest.mark.parametrize("endpoint", ["chat-stream", "server_info"])
def test_evidence_shows_what_was_received_truncated(endpoint, hostile, cli, state_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    url = hostile({endpoint: "non_json" if endpoint == "server_info" else "malformed_sse"})
    code, _, err = cli("bench", "--endpoint", url, *WORKLOAD, *FLAGS, "--out", str(tmp_path))
    assert code == 4 and "evidence:" in err and "received (" in err
    assert ("502 Bad Gateway" in err) if endpoint == "server_info" else ('"content": "x"' in err)


# --------------------------------------------------------------------------- the API key's routing

KEY = "sk-hostile-test-7f3a9c2e41"


def _run_echo(cli, hostile, tmp_path: Path, *extra: str) -> tuple[int, str, list[dict[str, str]], str]:
    a, b = hostile({}), hostile({})      # two well-behaved servers whose chat content echoes the request headers
    code, out, err = cli("bench", "--endpoint", a, "--compare-endpoint", b, "--gates", "g6", "--g6-max-tokens", "4",
                         *FLAGS, "--out", str(tmp_path), *extra)
    files = (tmp_path / "report.json").read_text() + (tmp_path / "report.md").read_text()
    return code, err, list(Hostile.seen_headers), files


def test_no_key_to_an_endpoint_unless_named(hostile, cli, state_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    monkeypatch.setenv("SPARKCTL_API_KEY", KEY)        # set, but not named: never sent
    code, err, seen, files = _run_echo(cli, hostile, tmp_path)
    assert code == 0, err
    assert seen and not any("authorization" in h for h in seen)
    assert KEY not in files and "response-header-marker" not in files and "x-leak" not in files.lower()


def test_named_key_sent_and_never_in_the_card(hostile, cli, state_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    monkeypatch.setenv("BENCH_TEST_KEY", KEY)
    code, err, seen, files = _run_echo(cli, hostile, tmp_path, "--api-key-env", "BENCH_TEST_KEY")
    assert code == 0, err
    assert seen and all(h.get("authorization") == f"Bearer {KEY}" for h in seen)
    report = json.loads((tmp_path / "report.json").read_text())
    echoed = report["g6"]["prompts"][0]["on_output"]["content"]
    assert "authorization" in echoed and "***" in echoed           # the echo came back, the key masked
    assert KEY not in files and "response-header-marker" not in files and KEY not in err


@pytest.mark.parametrize(("args", "message"), [
    (["--endpoint", "http://127.0.0.1:9", "--api-key-env", "NO_SUCH_VAR_FOR_BENCH"],
     "NO_SUCH_VAR_FOR_BENCH is not set"),
    (["--api-key-env", "BENCH_TEST_KEY"], "neither is given"),
    (["--endpoint", "http://127.0.0.1:9", "--read-timeout", "nan"], "--read-timeout"),
    (["--endpoint", "http://127.0.0.1:9", "--run-deadline", "-5"], "--run-deadline"),
    (["--endpoint", "http://127.0.0.1:9", "--request-deadline", "0"], "--request-deadline"),
])
def test_key_and_bound_flags_refused_with_exit_2(args, message, cli, state_dir, monkeypatch):
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    monkeypatch.delenv("NO_SUCH_VAR_FOR_BENCH", raising=False)
    monkeypatch.setenv("BENCH_TEST_KEY", KEY)
    code, _, err = cli("bench", *args)
    assert code == 2 and message in err, err


def test_run_deadline_stops_a_run_whose_requests_are_each_within_bounds(hostile, cli, state_dir, tmp_path,
                                                                        monkeypatch):
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    url = hostile({"chat-stream": "keepalive"})      # bytes every 0.2 s: no read or idle timeout below 10 s
    t0 = time.monotonic()
    code, _, err = cli("bench", "--endpoint", url, *WORKLOAD, "--read-timeout", "10", "--idle-timeout", "10",
                       "--request-deadline", "10", "--run-deadline", "2", "--out", str(tmp_path))
    assert code == 4 and "the run's deadline of 2 s passed" in err and "--run-deadline" in err, err
    assert time.monotonic() - t0 < 2 + SLACK_S
    assert json.loads((tmp_path / "report.json").read_text())["status"] == "failed"


def _not_found(self: Hostile, ep: str) -> None:
    self._send(404, b'{"detail":"Not Found"}')


Hostile._not_found = _not_found  # type: ignore[attr-defined]


def test_an_openai_only_gateway_gives_the_card_with_acceptance_unavailable(hostile, cli, state_dir, tmp_path,
                                                                          monkeypatch):
    """An OpenAI-compatible gateway in front of SGLang has no native /generate (404): the card is still made, its
    acceptance measurement marked unavailable with the reason, the other measurements as usual."""
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    url = hostile({"generate": "not_found"})
    code, out, err = cli("bench", "--endpoint", url, *WORKLOAD, *FLAGS, "--out", str(tmp_path / "card"), "--json")
    assert code == 0, err[-3000:]
    card = json.loads((tmp_path / "card" / "report.json").read_text())
    assert card["status"] == "successful", card["status"]
    results = card["arms"][0]["results"]
    gen = results["acceptance"]["generate"]
    assert gen["status"] == "unavailable" and gen["error"] is None and "HTTP 404" in gen["note"], gen
    assert "no SGLang native /generate" in gen["note"], gen
    assert results["ttft"]["sizes"][0]["status"] == "measured" and not results["cold"].get("error"), results
    md = (tmp_path / "card" / "report.md").read_text()
    assert "unavailable: HTTP 404" in md, md


# --------------------------------------------------------------------------- a TTFT answer that shows no text

class _Textless:
    """Which streamed TTFT requests (those whose prompt is a filler passage) answer with tokens but no text, in the
    order they arrive: vLLM sends no chunk for tokens it holds back until they decode to text, and the tiny seeded
    model's greedy answer can repeat a lone byte token (the CI failure that found this)."""

    pattern: list[bool] = []
    lock = threading.Lock()
    seen = 0


def _textless(self: Hostile, ep: str, req: dict[str, Any] | None) -> None:
    assert req is not None and ep == "chat-stream", ep
    if "Reference " not in str(req["messages"][0]["content"]):
        return self._normal(ep, req)
    with _Textless.lock:
        i, _Textless.seen = _Textless.seen, _Textless.seen + 1
    if not (i < len(_Textless.pattern) and _Textless.pattern[i]):
        return self._normal(ep, req)
    n = int(req.get("max_tokens") or 8)
    frames = [_chunk("", choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]),
              b"data: " + json.dumps({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                                      }).encode() + b"\n\n",
              b"data: " + json.dumps({"id": "c1", "choices": [], "usage": {
                  "prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}}).encode() + b"\n\n",
              b"data: [DONE]\n\n"]
    self._send(200, b"".join(frames), "text/event-stream")


Hostile._textless = _textless  # type: ignore[attr-defined]

# the streamed TTFT requests in order (three runs, each run's redraws right after the batch, then the three cached
# repeats): which show no text -> each run's redraws, and which runs keep no TTFT
T, F = True, False
TEXTLESS = {
    "none": ([], [0, 0, 0], [F, F, F]),
    "first-run-once": ([T], [1, 0, 0], [F, F, F]),
    "two-runs": ([F, T, T, T, F], [0, 2, 1], [F, F, F]),      # run 1 twice, then run 2 once
    "run-exhausts-its-redraws": ([T, F, F, T, T], [2, 0, 0], [T, F, F]),
    "every-answer": ([T] * 9, [2, 2, 2], [T, T, T]),
}


@pytest.mark.parametrize("case", TEXTLESS)
def test_a_ttft_answer_without_text_is_redrawn_and_said(case, hostile, cli, state_dir, tmp_path, monkeypatch):
    """A TTFT run is timed to the first text its stream shows; an answer that shows none within max_tokens is drawn
    again with a new filler of the same size (at most TTFT_REDRAWS times), each redraw counted on the card, and a run
    still without text keeps no TTFT rather than a time from another clock."""
    from sparkctl.bench.ttft import TTFT_REDRAWS
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    pattern, redraws, none = TEXTLESS[case]
    _Textless.pattern, _Textless.seen = pattern, 0
    url = hostile({"chat-stream": "textless"})
    code, out, err = cli("bench", "--endpoint", url, "--gates", "ttft", "--warmup", "0", "--ttft-sizes", "64",
                         "--ttft-runs", "3", *FLAGS, "--out", str(tmp_path / "card"), "--json")
    assert code == 0, err[-3000:]
    card = json.loads((tmp_path / "card" / "report.json").read_text())
    size = card["arms"][0]["results"]["ttft"]["sizes"][0]
    assert TTFT_REDRAWS == 2 and size["status"] == "measured", size
    assert size["redraws"] == redraws, size
    assert [r["ttft_s"] is None for r in size["runs"]] == none, size["runs"]
    assert len(size["fit"]) == 3 and all(r["completion_tokens"] == 8 for r in size["runs"]), size
    # the fillers the runs kept are the ones the card fitted: each redraw has a prefix of its own
    if any(redraws):
        k = sum(redraws)
        assert f"runs redrawn with a new filler ({k} redraw{'' if k == 1 else 's'})" in (size["note"] or ""), size
        assert (f"{sum(none)} still without text" in size["note"]) == any(none), size["note"]
        assert "redrawn with a new filler" in (tmp_path / "card" / "report.md").read_text()
    else:
        assert "redrawn" not in (size["note"] or ""), size
    assert (size["ttft_s"] is None) == all(none), size
    # three runs, their redraws, then the cached repeat's three requests: nothing else was streamed with a filler
    assert _Textless.seen == 3 + sum(redraws) + 3, (_Textless.seen, case)
