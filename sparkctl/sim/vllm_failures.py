"""The text of vLLM 0.32.0's failures the emulator models, copied from real captures
(tests/fixtures/captures/vllm-0.32.0-cpu/): each function writes what the real engine prints, in its order, minus
the Python source lines of its tracebacks.
"""
from __future__ import annotations

from sparkctl.sim.vllm_logfmt import VllmLog

_DOCS = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."


def max_model_len_too_long(log: VllmLog, requested: int, derived: int) -> None:
    """fail-max-model-len.log: pydantic refuses ModelConfig in the API server, before any engine process."""
    log.raw("Traceback (most recent call last):")
    log.raw("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig")
    log.raw(f"  Value error, User-specified max_model_len ({requested}) is greater than the derived max_model_len "
            f"(max_position_embeddings={float(derived)} or model_max_length=None in model's config.json). To allow "
            f"overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN "
            f"must be used with extreme caution. If the model uses relative position encoding (RoPE), positions "
            f"exceeding derived_max_model_len lead to nan. If the model uses absolute position encoding, positions "
            f"exceeding derived_max_model_len will cause a CUDA array out-of-bounds error. [type=value_error, "
            f"input_value=ArgsKwargs((), {{'model': ...nderer_num_workers': 1}}), input_type=ArgsKwargs]")
    log.raw("    For further information visit https://errors.pydantic.dev/2.14/v/value_error")


def _engine_core_failed(log: VllmLog, error: str, failed: str) -> None:
    """EngineCore's start-up failure: its ERROR lines, the executor's shutdown, the API server's RuntimeError
    (fail-kv-cache-too-small.log, fail-kv-cache-below-max-model-len.log)."""
    log.line("EngineCore", "core.py:1510", "EngineCore failed to start.", "ERROR")
    log.line("EngineCore", "core.py:1510", "Traceback (most recent call last):", "ERROR")
    log.line("EngineCore", "core.py:1510", error, "ERROR")
    log.line("EngineCore", "multiproc_executor.py:479", "[shutdown] Executor: waiting for worker exit count=1")
    log.raw("Process EngineCore:")
    log.raw("Traceback (most recent call last):")
    log.raw(error)
    log.raw("Traceback (most recent call last):")
    log.raw(f"RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {failed}")


def no_cache_blocks(log: VllmLog) -> None:
    """fail-kv-cache-too-small.log: a KV budget below one block."""
    _engine_core_failed(log, "ValueError: No available memory for the cache blocks. Try increasing "
                             "`gpu_memory_utilization` when initializing the engine (this flag also controls CPU "
                             "memory reservation on the CPU backend, despite its name). " + _DOCS, "{}")


def kv_below_max_model_len(log: VllmLog, max_model_len: int, needed_gib: float, avail_gib: float,
                           estimated: int) -> None:
    """fail-kv-cache-below-max-model-len.log: blocks, but fewer tokens than one request of max_model_len."""
    _engine_core_failed(log, f"ValueError: To serve at least one request with the model's max seq len "
                             f"({max_model_len}), ({needed_gib:.1f} GiB KV cache is needed, which is larger than the "
                             f"available KV cache memory ({avail_gib:.1f} GiB). Based on the available memory, the "
                             f"estimated maximum model length is {estimated}. Try increasing `gpu_memory_utilization` "
                             f"(which also controls CPU memory on the CPU backend) or decreasing `max_model_len` when "
                             f"initializing the engine. " + _DOCS, "{'EngineCore': 1}")


def memory_utilization_too_high(log: VllmLog, avail_gib: float, total_gib: float, util: float) -> None:
    """fail-defaults-no-kvcache-space.log: the worker cannot reserve --gpu-memory-utilization of the memory."""
    log.line("Worker_TP0", "multiproc_executor.py:953", "WorkerProc failed to start.", "ERROR")
    log.line("Worker_TP0", "multiproc_executor.py:953",
             f"ValueError: Available memory on node 0 ({avail_gib:.2f}/{total_gib:.2f} GiB) on startup is less than "
             f"desired CPU memory utilization ({util}, {util * total_gib:.1f} GiB). On the CPU backend, the "
             f"`--gpu-memory-utilization` flag controls the fraction of CPU memory reserved (despite its name). To "
             f"resolve: decrease `--gpu-memory-utilization` (e.g. `--gpu-memory-utilization 0.5`) or reduce CPU memory "
             f"used by other processes.", "ERROR")
    _engine_core_failed(log, "Exception: WorkerProc initialization failed due to an exception in a background "
                             "process. See stack trace for root cause.", "{'EngineCore': 1}")


def engine_dead(log: VllmLog, peer: str | None = None, peer_port: int = 0) -> None:
    """tp2b-rank0.log: the engine's worker fails in a forward pass (with `peer`: gloo lost the peer rank), the
    engine core dies, the API server finishes."""
    if peer is not None:
        log.line("Worker_TP0", "multiproc_executor.py:1063", "WorkerProc hit an exception.", "ERROR")
        log.line("Worker_TP0", "multiproc_executor.py:1063",
                 f"RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
                 f"closed by peer [{peer}]:{peer_port}. This is typically caused by a remote worker crashing. Check "
                 f"the logs of the remote worker before reporting an error. GLHF! 🏖️", "ERROR")
    log.line("EngineCore", "core.py:1512", "EngineCore encountered a fatal error.", "ERROR")
    log.line("EngineCore", "multiproc_executor.py:479", "[shutdown] Executor: waiting for worker exit count=1")
    log.line("APIServer", "async_llm.py:906", "AsyncLLM output_handler failed.", "ERROR")
    log.line("APIServer", "async_llm.py:906", "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an "
             "issue. See stack trace (above) for the root cause.", "ERROR")
    log.raw(f"INFO:     Finished server process [{log.pid}]")


def shutdown_api_server(log: VllmLog) -> None:
    """tp1-sigterm-shutdown.log / tp2-rank0.log: rank 0's SIGTERM, the lines of its shutdown (the EngineDeadError
    traceback vLLM logs even on a clean SIGTERM included, its triton/nanobind exit noise left out)."""
    for proc, src, msg in (
            ("APIServer", "launcher.py:254", "[shutdown] API server: shutdown triggered"),
            ("APIServer", "launcher.py:270", "[shutdown] API server: stopping engine client mode=abort timeout=0s"),
            ("APIServer", "core_client.py:770", "[shutdown] MPClient: start timeout=0s"),
            ("APIServer", "core_client.py:772", "[shutdown] MPClient: stopping engine manager"),
            ("APIServer", "utils.py:628", "[shutdown] Process manager: send sigterm to process EngineCore"),
            ("EngineCore", "core.py:1454", "[shutdown] EngineCore: trigger received signal=SIGTERM"),
            ("EngineCore", "core.py:1635", "[shutdown] EngineCore: start mode=abort timeout=0s"),
            ("EngineCore", "core.py:1666", "[shutdown] EngineCore: request processing complete; starting resource "
                                           "teardown"),
            ("EngineCore", "core.py:1499", "[shutdown] EngineCore: exiting busy loop"),
            ("Worker_TP0", "multiproc_executor.py:843", "Parent process exited, terminating worker queues"),
            ("EngineCore", "multiproc_executor.py:479", "[shutdown] Executor: waiting for worker exit count=1"),
            ("APIServer", "core_client.py:774", "[shutdown] MPClient: engine manager stopped"),
            ("APIServer", "core_client.py:775", "[shutdown] MPClient: cleaning up background resources"),
            ("APIServer", "core_client.py:777", "[shutdown] MPClient: complete")):
        log.line(proc, src, msg)
    log.line("APIServer", "async_llm.py:906", "AsyncLLM output_handler failed.", "ERROR")
    log.line("APIServer", "async_llm.py:906", "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an "
             "issue. See stack trace (above) for the root cause.", "ERROR")
    for src, msg in (("launcher.py:279", "[shutdown] API server: engine client stopped"),
                     ("launcher.py:282", "[shutdown] API server: signalling HTTP server shutdown"),
                     ("launcher.py:304", "[shutdown] API server: shutting down FastAPI HTTP server")):
        log.line("APIServer", src, msg)
    for text in ("INFO:     Shutting down", "INFO:     Waiting for application shutdown.",
                 "INFO:     Application shutdown complete."):
        log.raw(text)


def shutdown_headless(log: VllmLog, tp_rank: int) -> None:
    """tp2-rank1.log: a headless rank's SIGTERM (its handler logs at debug; the executor's lines show)."""
    log.line("MainProcess", "multiproc_executor.py:479", "[shutdown] Executor: waiting for worker exit count=1")
    log.line(f"Worker_TP{tp_rank}", "multiproc_executor.py:843", "Parent process exited, terminating worker queues")
