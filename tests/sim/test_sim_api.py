"""Rank 0 HTTP API: chat (reasoning, stream), /generate, radix cache, auth, info endpoints."""
from __future__ import annotations

import httpx
import pytest

from testrig.simproc import chat_body, sse_events

FAST = {"decode_tps": 400.0, "prefill_tps": 200000.0, "ttft_base_s": 0.005}
REASONING = ["--reasoning-parser", "glm45", "--max-running-requests", "8"]


@pytest.fixture
def server(sim):
    p = sim(REASONING + ["--enable-metrics"], knobs=FAST)
    p.wait_ready()
    return p


def test_chat_non_stream_reasoning_then_content(server):
    r = httpx.post(server.url("/v1/chat/completions"), json=chat_body("Write an essay on honesty", max_tokens=120),
                   timeout=30)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion"
    msg = body["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["reasoning_content"] and msg["content"]
    assert "</think>" not in msg["content"] + msg["reasoning_content"]
    u = body["usage"]
    assert u["completion_tokens"] == 120 and body["choices"][0]["finish_reason"] == "length"
    assert 0 < u["reasoning_tokens"] < 120
    assert u["completion_tokens_details"]["reasoning_tokens"] == u["reasoning_tokens"]
    assert u["prompt_tokens"] > 0 and "cached_tokens" in u["prompt_tokens_details"]


def test_chat_stream_frames(server):
    body = chat_body("Write an essay on honesty", max_tokens=120, stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", server.url("/v1/chat/completions"), json=body, timeout=30) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        frames = sse_events(resp)
    assert frames[-1] == "[DONE]"
    first = frames[0]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": ""} and first["finish_reason"] is None
    deltas = [f["choices"][0]["delta"] for f in frames[1:-3]]
    kinds = ["r" if d.get("reasoning_content") else "c" for d in deltas]
    assert kinds and kinds == sorted(kinds, key=lambda k: k != "r")   # all reasoning, then all content
    assert "r" in kinds and "c" in kinds
    assert frames[-3]["choices"][0]["finish_reason"] == "length"
    usage = frames[-2]["usage"]
    assert frames[-2]["choices"] == [] and usage["completion_tokens"] == 120 and usage["reasoning_tokens"] > 0
    # the stream says exactly what the non-stream answer says (deterministic at temperature 0)
    full = httpx.post(server.url("/v1/chat/completions"), json=chat_body("Write an essay on honesty", max_tokens=120),
                      timeout=30).json()["choices"][0]["message"]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == full["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == full["content"]


def test_thinking_off_and_unseparated_reasoning(server):
    off = httpx.post(server.url("/v1/chat/completions"), timeout=30,
                     json=chat_body("Hello there", max_tokens=30,
                                    chat_template_kwargs={"enable_thinking": False})).json()
    assert off["choices"][0]["message"]["reasoning_content"] is None
    assert off["usage"]["reasoning_tokens"] == 0 and off["usage"]["completion_tokens"] == 30
    raw = httpx.post(server.url("/v1/chat/completions"), timeout=30,
                     json=chat_body("Hello there", max_tokens=200, separate_reasoning=False)).json()
    msg = raw["choices"][0]["message"]
    assert msg["reasoning_content"] is None and "</think>" in msg["content"]


def test_deterministic_output_and_generate_meta(server):
    a = httpx.post(server.url("/generate"), json={"text": "Tell me a story", "sampling_params": {"max_new_tokens": 40,
                   "temperature": 0}}, timeout=30).json()
    b = httpx.post(server.url("/generate"), json={"text": "Tell me a story", "sampling_params": {"max_new_tokens": 40,
                   "temperature": 0}}, timeout=30).json()
    assert a["text"] == b["text"] and a["output_ids"] == b["output_ids"] and len(a["output_ids"]) == 40
    m = b["meta_info"]
    assert m["completion_tokens"] == 40 and m["prompt_tokens"] == 4 and m["finish_reason"]["type"] == "length"
    assert m["cached_tokens"] == 3 and m["e2e_latency"] > 0
    assert "spec_verify_ct" not in m


def test_radix_cache_repeat_and_flush(server):
    prompt = "word " * 300
    one = httpx.post(server.url("/v1/chat/completions"), json=chat_body(prompt, max_tokens=5), timeout=30).json()
    two = httpx.post(server.url("/v1/chat/completions"), json=chat_body(prompt, max_tokens=5), timeout=30).json()
    n = one["usage"]["prompt_tokens"]
    assert one["usage"]["prompt_tokens_details"]["cached_tokens"] < 10
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] == n - 1
    assert f"#cached-token: {n - 1}" in server.text
    assert httpx.post(server.url("/flush_cache")).status_code == 200
    three = httpx.post(server.url("/v1/chat/completions"), json=chat_body(prompt, max_tokens=5), timeout=30).json()
    assert three["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_info_endpoints(server):
    models = httpx.get(server.url("/v1/models")).json()
    d = models["data"][0]
    assert models["object"] == "list" and d["id"] == d["root"] and d["max_model_len"] == 65536
    info = httpx.get(server.url("/server_info")).json()
    for key in ("speculative_algorithm", "speculative_num_draft_tokens", "speculative_draft_model_path", "tp_size",
                "kv_cache_dtype", "mem_fraction_static", "max_total_num_tokens", "max_running_requests",
                "max_req_input_len", "version", "launch_command"):
        assert key in info, key
    assert info["emulated"] is True and info["version"] == "0.5.23" and info["max_running_requests"] == 8
    st = info["internal_states"][0]
    assert st["effective_max_running_requests_per_dp"] == 8 and "memory_usage" in st
    assert "avg_spec_accept_length" not in st
    assert "--reasoning-parser glm45" in info["launch_command"]
    assert httpx.get(server.url("/get_server_info")).json()["version"] == "0.5.23"
    assert httpx.get(server.url("/model_info")).json()["model_path"] == d["root"]
    metrics = httpx.get(server.url("/metrics")).text
    for name in ("sglang:gen_throughput", "sglang:num_running_reqs", "sglang:max_total_num_tokens",
                 "sglang:time_to_first_token_seconds_bucket"):
        assert name in metrics
    assert httpx.get(server.url("/nope")).status_code == 404


def test_context_overflow_is_400(server):
    r = httpx.post(server.url("/v1/chat/completions"), json=chat_body("hi", max_tokens=70000), timeout=10)
    assert r.status_code == 400 and "maximum context length of 65536 tokens" in r.json()["message"]


def test_metrics_absent_without_flag(sim):
    p = sim(knobs=FAST)
    p.wait_ready()
    assert httpx.get(p.url("/metrics")).status_code == 404


def test_api_key_enforced(sim):
    p = sim(["--api-key", "sekret"], knobs=FAST)
    p.wait_ready()
    assert httpx.get(p.url("/v1/models")).status_code == 401
    assert httpx.get(p.url("/v1/models"), headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(p.url("/v1/models"), headers={"Authorization": "Bearer sekret"}).status_code == 200
    assert httpx.get(p.url("/health")).status_code == 200
    r = httpx.post(p.url("/generate"), json={"text": "x"})
    assert r.status_code == 401
    assert '"GET /v1/models HTTP/1.1" 401 Unauthorized' in p.text


def test_old_dialect_0_5_3(sim):
    from sparkctl.sglang.dialect import available_versions
    if available_versions() and "0.5.3.post3" not in available_versions():
        pytest.skip("no 0.5.3.post3 flag schema installed yet")
    p = sim(["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/eagle",
             "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4", "--decode-log-interval", "5"],
            knobs=FAST, env={"SPARKCTL_SIM_SGLANG_VERSION": "0.5.3.post3"})
    p.wait_ready()
    assert httpx.get(p.url("/server_info")).status_code == 404
    info = httpx.get(p.url("/get_server_info")).json()
    assert info["version"] == "0.5.3.post3" and "launch_command" not in info
    httpx.post(p.url("/generate"), json={"text": "Write an essay", "sampling_params": {"max_new_tokens": 200}},
               timeout=30)
    line = p.wait_for(r"Decode batch\. #running-req: 1, #token: ")
    assert line.endswith("#queue-req: 0, ") and "TP0] Decode batch." in line
    alen, rate = map(float, __import__("re").search(r"accept len: ([\d.]+), accept rate: ([\d.]+)", line).groups())
    assert abs(rate - alen / 4) < 0.011                   # old formula: includes the bonus token
    assert "TP0] Prefill batch. #new-seq: 1" in p.text
