"""The emulator as a router worker: the endpoints SGLang's router calls, /v1/completions, and one HTTP/1.1
keep-alive connection that stays usable after every error status (the body of a refused request is read)."""
from __future__ import annotations

import re

import httpx
import pytest

from testrig.simproc import sse_events

FAST = {"decode_tps": 2000.0, "prefill_tps": 200000.0, "ttft_base_s": 0.002}
KEY = "sk-test-worker"


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    from testrig.simproc import MODEL, SimProc
    from testrig.testenv import free_port
    port = free_port()
    env = {"SPARKCTL_SIM_BOOT_S": "0.3", **{f"SPARKCTL_SIM_{k.upper()}": str(v) for k, v in FAST.items()}}
    p = SimProc(["--model-path", MODEL, "--host", "127.0.0.1", "--port", str(port), "--api-key", KEY,
                 "--enable-metrics"], env, "127.0.0.1", port)
    try:
        p.wait_ready()
        yield p
    finally:
        p.close()


def _client_ports(proc, since: int) -> set[str]:
    """The client ports of the access lines the emulator logged after line ``since``."""
    return {m.group(1) for line in proc.lines[since:] if (m := re.search(r"127\.0\.0\.1:(\d+) - \"", line))}


def _one_connection() -> httpx.Client:
    return httpx.Client(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1), timeout=20,
                        headers={"authorization": f"Bearer {KEY}"})


# Each refused request carries a body the server must read before answering: (method, path, kwargs, status).
REFUSED = [
    ("POST", "/no/such/path", {"json": {"text": "x" * 3000}}, 404),
    ("POST", "/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "hi"}]},
                                      "headers": {"authorization": "Bearer wrong"}}, 401),
    ("DELETE", "/v1/models", {"content": b"junk body"}, 405),
    ("PUT", "/v1/completions", {"content": b'{"prompt": "p"}'}, 405),
    ("POST", "/generate", {"content": b"not json at all"}, 400),
    ("POST", "/no/such/path", {"content": iter([b"chunked ", b"body ", b"parts"])}, 404),   # transfer-encoding: chunked
    ("PATCH", "/get_model_info", {"json": {"a": 1}}, 405),
]


@pytest.mark.parametrize("method,path,kw,status", REFUSED, ids=[f"{m} {p} {s}" for m, p, kw, s in REFUSED])
def test_connection_usable_after_refusal(worker, method, path, kw, status):
    since = len(worker.lines)
    with _one_connection() as c:
        assert c.get(worker.url("/v1/models")).status_code == 200
        kw = dict(kw)
        headers = {**c.headers, **kw.pop("headers", {})}
        assert c.request(method, worker.url(path), headers=headers, **kw).status_code == status
        after = c.post(worker.url("/generate"), json={"text": "Hello", "sampling_params": {"max_new_tokens": 4}})
        assert after.status_code == 200 and after.json()["meta_info"]["completion_tokens"] == 4
    # this test's /generate (the emulator's own start-up request logged one before `since`; the lines are read by
    # a thread, so that old line once matched before this test's were read and no port was found)
    worker.wait_for(r'"POST /generate HTTP/1.1" 200', timeout=5, since=since)
    ports = _client_ports(worker, since)
    assert len(ports) == 1, ports                    # all three requests on the one connection


def test_router_worker_endpoints(worker):
    """What sglang-router 0.3.2 asks a worker for when it is added, health-checks it and serves /v1/models."""
    with _one_connection() as c:
        assert c.get(worker.url("/health")).status_code == 200
        info = c.get(worker.url("/get_server_info")).json()
        assert info["tp_size"] == 1 and info["dp_size"] == 1 and "max_total_num_tokens" in info
        assert c.get(worker.url("/server_info")).json()["model_path"] == info["model_path"]
        mi = c.get(worker.url("/get_model_info")).json()
        assert mi["model_path"] == info["model_path"] and mi["is_generation"] is True
        models = c.get(worker.url("/v1/models")).json()
        assert models["data"][0]["id"] == info["served_model_name"]


def test_completions_non_stream(worker):
    with _one_connection() as c:
        r = c.post(worker.url("/v1/completions"), json={"model": "x", "prompt": "Once upon a time", "max_tokens": 12,
                                                       "temperature": 0})
        default = c.post(worker.url("/v1/completions"), json={"prompt": ["Once upon a time"]})
        bad = c.post(worker.url("/v1/completions"), json={"prompt": 7})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    choice = body["choices"][0]
    assert choice["text"] and choice["finish_reason"] == "length" and choice["index"] == 0
    assert body["usage"]["completion_tokens"] == 12 and body["usage"]["prompt_tokens"] > 0
    assert default.json()["usage"]["completion_tokens"] == 16           # max_tokens defaults to 16
    assert bad.status_code == 400 and "prompt" in bad.json()["message"]


def test_completions_stream_matches_non_stream(worker):
    req = {"prompt": "The rain in Spain", "max_tokens": 20, "temperature": 0}
    with _one_connection() as c:
        full = c.post(worker.url("/v1/completions"), json=req).json()["choices"][0]["text"]
        with c.stream("POST", worker.url("/v1/completions"),
                      json={**req, "stream": True, "stream_options": {"include_usage": True}}) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            frames = sse_events(resp)
        assert c.get(worker.url("/health")).status_code == 200          # the connection outlives the stream
    assert frames[-1] == "[DONE]" and frames[-2]["usage"]["completion_tokens"] == 20
    assert frames[-3]["choices"][0]["finish_reason"] == "length"
    assert all(f["object"] == "text_completion" for f in frames[:-1])
    assert "".join(f["choices"][0]["text"] for f in frames[:-3]) == full
