"""The doctor's known vLLM failures: the same `Signature` shape as SGLang's catalogue (sparkctl/sglang/signatures.py),
matched by sparkctl/sglang/findings.py; `sparkctl.enginelog.ALL_SIGNATURES` is both catalogues, which the doctor
(sparkctl/doctor/collect.py) and `doctor --list` read.

Each pattern is a message vLLM 0.32.0 prints (its source line cited) and each has a real capture under
tests/fixtures/captures/ that tests/vllm/test_vllm_signatures.py feeds it. The fixes name sparkctl's profile keys
and, after them, the vLLM flag or variable they become (issue 34's dialect: ``server.mem_fraction_static`` is
``--gpu-memory-utilization``, ``server.context_length`` is ``--max-model-len``).
"""
from __future__ import annotations

from sparkctl.sglang.signatures import Signature, _sig

__all__ = ["VLLM_CATALOGUE"]

_CPU_KV = ("on the CPU backend give the KV cache an explicit size: VLLM_CPU_KVCACHE_SPACE=<GiB> in the rank's "
           "environment (it overrides --kv-cache-memory-bytes, vllm/platforms/cpu.py:324)")

VLLM_CATALOGUE: tuple[Signature, ...] = (
    _sig("vllm-kv-no-cache-blocks", "vLLM found no memory for a single KV cache block",
         r"No available memory for the cache blocks",
         "the memory vLLM set aside for the KV cache (the memory fraction's share after weights and activations, or "
         "an explicit KV size) is smaller than one block",
         "raise server.mem_fraction_static (vLLM's --gpu-memory-utilization; on CPU the share of RAM it reserves) or "
         "the explicit KV size (--kv-cache-memory-bytes), or lower server.context_length; " + _CPU_KV,
         "vllm 0.32.0 vllm/v1/core/kv_cache_utils.py:1011; captures/vllm-0.32.0-cpu/fail-kv-cache-too-small.log"),
    _sig("vllm-kv-below-max-model-len", "vLLM's KV cache cannot hold one request of the context length",
         r"To serve at least one request with the model's max seq len \(\d+\)",
         "the KV cache has blocks, but fewer tokens than one request of max_model_len needs; vLLM prints the longest "
         "context the memory would allow (\"the estimated maximum model length is N\")",
         "lower server.context_length (vLLM's --max-model-len) to at most the estimated maximum vLLM printed, or "
         "give the KV cache more memory: raise server.mem_fraction_static (--gpu-memory-utilization) or the explicit "
         "KV size (--kv-cache-memory-bytes; VLLM_CPU_KVCACHE_SPACE on CPU)",
         "vllm 0.32.0 vllm/v1/core/kv_cache_utils.py:1031; "
         "captures/vllm-0.32.0-cpu/fail-kv-cache-below-max-model-len.log"),
    _sig("vllm-max-model-len-over-model", "the context length asked is longer than the model allows (vLLM)",
         r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len",
         "--max-model-len is larger than the model's own limit (max_position_embeddings / model_max_length in its "
         "config.json); vLLM refuses the configuration before starting any engine process",
         "lower server.context_length (vLLM's --max-model-len) to the model's limit named in the message; only "
         "set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 if the model really extrapolates (vLLM warns it can give wrong output)",
         "vllm 0.32.0 vllm/config/model.py:2646; captures/vllm-0.32.0-cpu/fail-max-model-len.log"),
    _sig("vllm-cpu-memory-below-utilization", "free RAM at start-up below the share vLLM-CPU was told to reserve",
         r"Available memory on node \d+ \(.*\) on startup is less than desired CPU memory utilization",
         "on the CPU backend, without an explicit KV size, --gpu-memory-utilization (default 0.92) is the share of "
         "the node's RAM vLLM reserves, and less than that was free",
         _CPU_KV + "; or lower server.mem_fraction_static (--gpu-memory-utilization, e.g. 0.5), or free RAM on the "
         "node",
         "vllm 0.32.0 vllm/v1/worker/cpu_worker.py:83; captures/vllm-0.32.0-cpu/fail-defaults-no-kvcache-space.log"),
    _sig("vllm-cpu-kv-allocation-over-available", "vLLM-CPU's KV share is negative or larger than the free RAM",
         r"Available memory on node \d+ \(.*\) on kv cache allocation is less than requested memory for kv",
         "the KV share vLLM-CPU computed (the memory fraction of RAM minus what the worker already uses) is negative "
         "when the fraction does not even cover the worker itself, or larger than the RAM still free",
         _CPU_KV + "; or raise server.mem_fraction_static when the requested figure in the message is negative, "
         "free RAM on the node when it is positive",
         "vllm 0.32.0 vllm/v1/worker/cpu_worker.py:219/:241; "
         "captures/vllm-0.32.0-cpu/fail-gpu-memory-utilization-too-low.log"),
    _sig("vllm-architecture-unsupported", "vLLM has no implementation for a checkpoint's architecture",
         r"Model architectures \[.*\] are not supported for now",
         "the model (or, under a SpeculativeConfig error, the speculative draft model) names an architecture vLLM's "
         "registry does not have: e.g. an SGLang-layout EAGLE head (Qwen2ForCausalLMEagle) has no vLLM counterpart",
         "use a checkpoint vLLM supports (for EAGLE drafters: an EAGLE/EAGLE3 head vLLM registers, e.g. "
         "Eagle3Qwen3ForCausalLM, EagleLlamaForCausalLM), or another speculative method (ngram, mtp, dflash)",
         "vllm 0.32.0 vllm/model_executor/models/registry.py:1206; "
         "captures/vllm-0.32.0-cpu/fail-spec-eagle-qwen2-drafter.log"),
    _sig("vllm-gloo-peer-closed", "a peer rank closed its gloo connection (vLLM on CPU)",
         # vLLM's own process prefix: torch prints the same gloo line under SGLang (a real SGLang boot's peer loss
         # once matched this finding when the pattern was the gloo line alone)
         r"^\((?:Worker|EngineCore)[^)]*\) .*gloo/transport/tcp/pair\.cc:\d+\] Connection closed by peer",
         "another rank of the tensor-parallel group went away (stopped or crashed); vLLM's rank 0 only notices on "
         "the next collective, i.e. the next request, and /health answers 200 until then",
         "read the other ranks' logs for why that rank stopped (`sparkctl doctor` on the deployment reads them all), "
         "then bring the deployment down and up again: a TP group does not survive one rank's loss",
         "captures/vllm-0.32.0-cpu/tp2b-rank0.log (the headless rank 1 was stopped first; README §4)"),
)
