"""The doctor's vLLM catalogue (sparkctl/vllm/signatures.py), each signature on the line vLLM printed in a capture
under tests/fixtures/captures/vllm-0.32.0-cpu/; clean vLLM boots match nothing, and the SGLang captures match no vLLM
signature (the doctor's findings on SGLang logs are what they were)."""
from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.enginelog import ALL_SIGNATURES
from sparkctl.sglang.findings import LogText, match_sources
from sparkctl.sglang.signatures import CATALOGUE
from sparkctl.vllm.signatures import VLLM_CATALOGUE
from testrig.captures import capture_names, capture_text

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "vllm-0.32.0-cpu"

# signature -> (capture, a fragment locating the line vLLM printed there)
CAPTURED = {
    "vllm-kv-no-cache-blocks": ("fail-kv-cache-too-small.log",
                                "ValueError: No available memory for the cache blocks."),
    "vllm-kv-below-max-model-len": ("fail-kv-cache-below-max-model-len.log",
                                    "ValueError: To serve at least one request with the model's max seq len (1024)"),
    "vllm-max-model-len-over-model": ("fail-max-model-len.log",
                                      "Value error, User-specified max_model_len (4096) is greater than the derived"),
    "vllm-cpu-memory-below-utilization": ("fail-defaults-no-kvcache-space.log",
                                          "on startup is less than desired CPU memory utilization (0.92, 21.7 GiB)"),
    "vllm-cpu-kv-allocation-over-available": ("fail-gpu-memory-utilization-too-low.log",
                                              "on kv cache allocation is less than requested memory for kv "
                                              "(-0.38/0.24 GiB)"),
    "vllm-architecture-unsupported": ("fail-spec-eagle-qwen2-drafter.log",
                                      "Model architectures ['Qwen2ForCausalLMEagle'] are not supported for now."),
    "vllm-gloo-peer-closed": ("tp2b-rank0.log", "gloo/transport/tcp/pair.cc:553] Connection closed by peer"),
}

# each failure capture: exactly its own causes, in the order first printed
EXPECTED = {
    "fail-kv-cache-too-small.log": ["vllm-kv-no-cache-blocks"],
    "fail-kv-cache-below-max-model-len.log": ["vllm-kv-below-max-model-len"],
    "fail-max-model-len.log": ["vllm-max-model-len-over-model"],
    "fail-defaults-no-kvcache-space.log": ["vllm-cpu-memory-below-utilization"],
    "fail-gpu-memory-utilization-too-low.log": ["vllm-cpu-kv-allocation-over-available"],
    "fail-spec-eagle-qwen2-drafter.log": ["vllm-architecture-unsupported"],
    "tp2b-rank0.log": ["vllm-gloo-peer-closed"],
}
CLEAN = ["tp1-boot.log", "tp1-boot-2-health-probe.log", "tp1-sigterm-shutdown.log", "tp2-rank0.log",
         "tp2-rank0-sigterm-shutdown.log", "tp2-rank1.log", "tp2b-rank1.log", "spec-ngram-boot.log",
         "spec-dflash-boot.log", "bench-serve-tp1.log", "bench-serve-tp1-c8.log", "bench-serve-tp1-c8-512.log"]


def vmatch(log: str, name: str):
    """What the doctor finds in `log` (it reads both engines' catalogues: sparkctl/doctor/collect.py)."""
    return match_sources([LogText(name, log)], ALL_SIGNATURES)


def text(name: str) -> str:
    return (CAPTURES / name).read_text(encoding="utf-8")


def test_vllm_catalogue_ids_are_unique_tested_and_sourced():
    ids = [s.id for s in ALL_SIGNATURES]
    assert len(ids) == len(set(ids))
    assert {s.id for s in VLLM_CATALOGUE} == set(CAPTURED)
    assert ALL_SIGNATURES == CATALOGUE + VLLM_CATALOGUE
    for sig in VLLM_CATALOGUE:
        assert sig.cause and sig.fix and sig.source and sig.id.startswith("vllm-"), sig.id
        assert "captures/vllm-0.32.0-cpu/" in sig.source


@pytest.mark.parametrize("sid", sorted(CAPTURED))
def test_vllm_signature_on_its_capture(sid):
    name, fragment = CAPTURED[sid]
    printed = [ln for ln in text(name).split("\n") if fragment in ln]
    assert printed, f"{fragment!r} is not in {name}"
    found = {f.signature: f for f in vmatch(text(name), name)}
    assert sid in found
    assert any(fragment in e.text for e in found[sid].evidence)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_vllm_failure_capture_names_its_own_cause_and_nothing_else(name):
    assert [f.signature for f in vmatch(text(name), name)] == EXPECTED[name]


def test_vllm_hints_say_what_to_change():
    by = {s.id: s for s in VLLM_CATALOGUE}
    assert "VLLM_CPU_KVCACHE_SPACE" in by["vllm-cpu-memory-below-utilization"].fix
    assert "server.mem_fraction_static" in by["vllm-kv-no-cache-blocks"].fix
    assert "server.context_length" in by["vllm-kv-below-max-model-len"].fix
    assert "server.context_length" in by["vllm-max-model-len-over-model"].fix


@pytest.mark.parametrize("name", CLEAN)
def test_vllm_clean_logs_match_nothing(name):
    # a clean boot, its requested shutdown (with the EngineDeadError traceback) and the bench client: no finding
    assert vmatch(text(name), name) == []


def test_sglang_captures_match_no_vllm_signature():
    names = capture_names("sglang")
    assert len(names) >= 10
    for rel in names:
        got = [f.signature for f in vmatch(capture_text(rel), rel)]
        assert not [s for s in got if s.startswith("vllm-") and s != "vllm-free-memory-below-utilization"], rel


def test_sglangs_gloo_peer_loss_is_not_named_a_vllm_failure():
    """Real SGLang 0.5.23 on this machine's CPU printed this line (a TP=2 boot whose peer went away, in the suite's
    real-engine tier, 2026-12-06): torch's gloo line is the same under both engines, and the vLLM finding once named
    it. The finding is vLLM's only under vLLM's own process prefix, and a failed SGLang boot is matched against
    SGLang's catalogue alone (enginelog.SIGNATURES_OF)."""
    from sparkctl.enginelog import SIGNATURES_OF

    sglang_line = ("[2026-12-06 21:56:26 TP0] Error ignored in is_in_the_same_node: [/__w/pytorch/pytorch/third_party/"
                   "gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:59616. This is "
                   "typically caused by a remote worker crashing. Check the logs of the remote worker before "
                   "reporting")
    vllm_ids = {s.id for s in VLLM_CATALOGUE}
    found = match_sources([LogText("rank 0", sglang_line)], ALL_SIGNATURES)
    assert not [f for f in found if f.signature in vllm_ids], found
    assert not vllm_ids & {s.id for s in SIGNATURES_OF["sglang"]}
    vllm_log = (CAPTURES / "tp2b-rank0.log").read_text(errors="replace")
    assert "vllm-gloo-peer-closed" in {f.signature for f in match_sources([LogText("rank 0", vllm_log)],
                                                                          SIGNATURES_OF["vllm"])}
