"""The emulator's vLLM dialect (`python -m sparkctl.sim serve MODEL ...`): vLLM's argv, boot and readiness as
sparkctl's vLLM log follower reads them, the API on rank 0 only, multi-node rendezvous, failures with vLLM's words,
the shutdown. What it answers is compared with the real vLLM 0.32.0 in test_sim_vs_real_vllm.py."""
from __future__ import annotations

import signal
import time

import httpx
import yaml

from sparkctl.enginelog import follower_for
from sparkctl.sglang.bootwatch import BootState, LogFollower
from sparkctl.sglang.logparse import EventKind, LogEvent
from sparkctl.vllm import measures
from sparkctl.vllm.logparse import parse_line
from testrig.simproc import chat_body, sse_events
from testrig.testenv import free_port

R0, R1 = "127.0.0.2", "127.0.0.3"
TINY = ["--max-model-len", "1024", "--kv-cache-memory-bytes", "64M", "--enforce-eager", "--dtype", "bfloat16"]
NGRAM = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}']


def follow(text: str) -> LogFollower:
    f = follower_for("vllm")
    for line in text.split("\n"):
        f.feed(line)
    return f


def events(text: str) -> list[LogEvent]:
    return [ev for ev in (parse_line(line) for line in text.split("\n")) if ev is not None]


def _refused(url: str) -> bool:
    try:
        httpx.get(url, timeout=1)
    except httpx.ConnectError:
        return True
    return False


def test_boot_is_read_by_the_vllm_follower_and_the_api_answers_as_vllm(vllm_sim):
    p = vllm_sim([*TINY, *NGRAM, "--served-model-name", "tiny-qwen2"], knobs={"vllm_stats_interval_s": 0.5})
    assert p.wait_for(r"^sparkctl-sim: ").endswith("NOT vLLM: no GPU, no model weights, generated text.")
    p.wait_vllm_up()
    f = follow(p.text)
    verdict = f.classify(final=False)
    assert verdict.state is BootState.READY
    assert f.capacity == {"max_total_num_tokens": 131072, "context_len": 1024, "max_concurrency": 128.0}
    want = {"tensor_parallel_size": 1, "max_seq_len": 1024, "kv_cache_dtype": "auto", "dtype": "torch.bfloat16",
            "device_config": "cpu", "enable_prefix_caching": True, "speculative_method": "ngram",
            "speculative_model": None, "num_speculative_tokens": 4}
    assert f.engine_config is not None and {k: f.engine_config.get(k) for k in want} == want
    assert f.server_args is not None and f.server_args.get("served_model_name") == ["tiny-qwen2"]
    models = httpx.get(p.url("/v1/models")).json()["data"]
    assert [(m["id"], m["owned_by"], m["max_model_len"]) for m in models] == [("tiny-qwen2", "vllm", 1024)]
    assert httpx.get(p.url("/version")).json() == {"version": "0.32.0", "emulated": True}
    for path in ("/server_info", "/get_server_info", "/generate", "/model_info", "/flush_cache"):
        r = httpx.get(p.url(path))
        assert r.status_code == 404 and r.content == b'{"detail":"Not Found"}', path
    before = measures.counters(httpx.get(p.url("/metrics")).text)
    body = chat_body("Write a python function that sorts a list.", max_tokens=48, ignore_eos=True)
    res = httpx.post(p.url("/v1/chat/completions"), json=body, timeout=30).json()
    assert res["object"] == "chat.completion" and res["id"].startswith("chatcmpl-")
    assert res["usage"]["completion_tokens"] == 48 and res["choices"][0]["finish_reason"] == "length"
    with httpx.stream("POST", p.url("/v1/chat/completions"), timeout=30,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as resp:
        frames = sse_events(resp)
    assert frames[-1] == "[DONE]" and frames[-2]["choices"] == [] and frames[-2]["usage"]["completion_tokens"] == 48
    assert frames[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert frames[-3]["choices"][0]["finish_reason"] == "length"
    d = measures.delta(before, measures.counters(httpx.get(p.url("/metrics")).text))
    acc = measures.acceptance(d)
    assert d["generation_tokens"] == 96 and acc["drafts"] and acc["draft_tokens"] == 4 * acc["drafts"]
    assert 1.0 < acc["mean_acceptance_length"] <= 5.0
    p.wait_for(r"SpecDecoding metrics: Mean acceptance length: ", timeout=5)
    window = measures.log_window(p.lines)
    assert window["spec_lines"] >= 1 and window["stats_lines"] >= 1


def test_an_unknown_flag_fails_as_vllms_parser(vllm_sim):
    p = vllm_sim(["--tp-size", "2"])
    assert p.wait_exit(10) == 2
    assert "vllm serve: error: unrecognized arguments: --tp-size 2" in p.text
    q = vllm_sim(["--speculative-algorithm", "NGRAM"])
    assert q.wait_exit(10) == 2 and "unrecognized arguments: --speculative-algorithm NGRAM" in q.text


def test_health_is_refused_until_the_engine_is_up_then_the_api_key_guards_v1(vllm_sim, tmp_path):
    config = tmp_path / "engine-secrets.yaml"
    config.write_text(yaml.safe_dump({"api-key": "s3cret"}))
    p = vllm_sim([*TINY, "--config", str(config)], knobs={"boot_s": 2.0})
    p.wait_for(r"Starting to load model")
    assert _refused(p.url("/health"))                  # tp1-health-during-boot.txt: connection refused, no 503
    p.wait_vllm_up()
    assert httpx.get(p.url("/health")).status_code == 200 and httpx.get(p.url("/metrics")).status_code == 200
    assert httpx.get(p.url("/v1/models")).status_code == 401
    ok = httpx.get(p.url("/v1/models"), headers={"authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and "s3cret" not in p.text


def test_tp2_rank0_waits_for_the_headless_rank_which_serves_no_http(vllm_sim):
    master = free_port(R0)
    port0, port1 = free_port(R0), free_port(R1)
    common = [*TINY, "--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", R0, "--master-port", str(master)]
    r0 = vllm_sim([*common, "--node-rank", "0"], host=R0, port=port0, knobs={"peer_timeout_s": 2})
    r0.wait_for(r"distributed_init_method=tcp://")
    time.sleep(1.0)                     # boot_s 0.3: alone it would be up by now
    assert "KV cache size" not in r0.text and _refused(r0.url("/health"))
    r1 = vllm_sim([*common, "--node-rank", "1", "--headless"], host=R1, port=port1, knobs={"peer_timeout_s": 2})
    r0.wait_vllm_up()
    r1.wait_for(r"GiB for KV cache on node 0\.")
    w = follow(r1.text)
    assert w.classify(final=False).state is BootState.WORKER_READY
    assert "Launching vLLM (v0.32.0) headless multiproc executor, with head node address " \
           f"{R0}:{master} for torch.distributed process group." in r1.text
    assert "CPU SHM communicator disabled for group tp:0" in r1.text and "TP rank 1, ETP rank 1" in r1.text
    assert "Application startup complete" not in r1.text and _refused(r1.url("/health"))
    config = follow(r0.text).engine_config
    assert config is not None and config["tensor_parallel_size"] == 2
    r1.kill()                           # the peer dies: rank 0's engine fails, its API server finishes
    assert r0.wait_exit(timeout=8) == 1
    f = follow(r0.text)
    assert f.classify().state is BootState.FAILED
    assert any(e.kind is EventKind.NCCL_ERROR and e.fields.get("backend") == "gloo" for e in events(r0.text))


def test_kv_cache_below_max_model_len_fails_with_vllms_words(vllm_sim):
    p = vllm_sim(["--max-model-len", "1024", "--kv-cache-memory-bytes", "256K"])   # 512 tokens
    assert p.wait_exit(10) == 1
    f = follow(p.text)
    assert f.classify().state is BootState.FAILED
    mem = [e for e in events(p.text) if e.kind is EventKind.MEMORY_BUDGET]
    assert mem and mem[0].fields["cause"] == "below_max_model_len" and mem[0].fields["est"] == 512
    q = vllm_sim(["--max-model-len", "1024", "--kv-cache-memory-bytes", "32K"])     # less than one block
    assert q.wait_exit(10) == 1
    assert [e.fields["cause"] for e in events(q.text) if e.kind is EventKind.MEMORY_BUDGET][:1] == \
        ["no_cache_blocks"]


def test_max_model_len_over_the_models_fails_in_the_api_server(vllm_sim):
    p = vllm_sim(["--max-model-len", "4096"], knobs={"model_context_length": 1024})
    assert p.wait_exit(10) == 1
    f = follow(p.text)
    assert f.classify().state is BootState.FAILED
    assert any(e.kind is EventKind.CONFIG_ERROR and "User-specified max_model_len (4096)" in str(e.fields)
               for e in events(p.text))


def test_sigterm_prints_vllms_shutdown_and_exits_0(vllm_sim):
    p = vllm_sim(TINY)
    p.wait_vllm_up()
    p.kill(signal.SIGTERM)
    assert p.wait_exit(10) == 0
    assert "[shutdown] API server: shutdown triggered" in p.text
    assert follow(p.text).classify().state is BootState.STOPPED


def test_prefix_caching_counts_hits_unless_turned_off(vllm_sim):
    prompt = {"prompt": "The spark cluster has two nodes and " * 8, "max_tokens": 4, "temperature": 0}
    for flags, hits in (([], True), (["--no-enable-prefix-caching"], False)):
        p = vllm_sim([*TINY, *flags])
        p.wait_vllm_up()
        for _ in range(2):
            r = httpx.post(p.url("/v1/completions"), json=prompt, timeout=30).json()
            assert r["object"] == "text_completion" and r["usage"]["completion_tokens"] == 4
        c = measures.counters(httpx.get(p.url("/metrics")).text)
        assert (c["prefix_cache_hit_tokens"] > 0) is hits and c["prefix_cache_query_tokens"] > 0
        labels = [ln for ln in httpx.get(p.url("/metrics")).text.split("\n") if ln.startswith("vllm:cache_config")]
        assert f'enable_prefix_caching="{not flags}"' in labels[0]


def test_a_crash_while_serving_is_an_engine_death_and_never_healthy_keeps_the_port_closed(vllm_sim):
    p = vllm_sim(TINY, knobs={"crash_after_ready_s": 0.5})
    p.wait_vllm_up()
    assert p.wait_exit(10) == 1
    f = follow(p.text)
    assert f.classify().state is BootState.FAILED
    assert "EngineCore encountered a fatal error." in p.text and "INFO:     Finished server process" in p.text
    q = vllm_sim(TINY, knobs={"never_healthy": True})
    q.wait_for(r"init engine \(profile, create kv cache, warmup model\) took")
    time.sleep(0.5)
    assert _refused(q.url("/health")) and follow(q.text).classify(final=False).state is BootState.STARTING


def test_a_reserved_master_port_fails_rank0_naming_the_knob(vllm_sim):
    """The vLLM dialect's store honours `reserved_ports` as SGLang's does: torch's DistNetworkError, the knob named."""
    master, port0 = free_port(R0), free_port(R0)
    r0 = vllm_sim([*TINY, "--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", R0, "--master-port",
                   str(master), "--node-rank", "0"], host=R0, port=port0,
                  knobs={"peer_timeout_s": 2, "reserved_ports": [master]})
    assert r0.wait_exit(timeout=10) != 0
    line = r0.wait_for(r"torch\.distributed\.DistNetworkError: ")
    assert "reserved_ports" in line and "api.dist_port of its own" in line
