"""The text of the emulator's failures, shaped after real captures (tests/fixtures/captures/sglang/).

* ``oom_at_load``      CUDA OOM raised while loading weights (scheduler traceback, then the launcher's
                       "Rank 0 scheduler is dead" / "Exit code" / EOFError tail of
                       multinode-scheduler-exception-rank0-dead.txt).
* ``host_oom_killed``  the scheduler SIGKILLed by the host OOM-killer at pool allocation ("Rank 0 scheduler
                       died during initialization (exit code: -9)", 2spark-load-host-oom-*.txt).
* ``scheduler_crash``  an exception in the running scheduler, then "Received sigquit from a child process".
* ``nccl_watchdog``    the ProcessGroupNCCL watchdog timeout (nccl-watchdog-timeout-*.txt) and the
                       ``c10::DistBackendError`` terminate (nccl-watchdog-terminate-*.txt).
* ``unknown_speculative_algorithm``  SGLang 0.5.23 resolving an unknown ``--speculative-algorithm`` in the
                       launcher (argparse takes any string): the uncaught ValueError of
                       ``SpeculativeAlgorithm.from_string``, exit 1, before any process starts.
* ``store_connect``    rank > 0 cannot reach the store: c10d socket warnings + NCCL WARN socketPollConnect
                       + DistNetworkError (multinode-rank1-nccl-bootstrap-wrong-interface.txt).
"""
from __future__ import annotations

import os
import socket

from sparkctl.sim.logfmt import EngineLog, c10d_stamp

_SITE = "/usr/local/lib/python3.12/dist-packages"
_SG = f"{_SITE}/sglang/srt"


def _frames(frames: list[tuple[str, int, str, str]]) -> list[str]:
    out = []
    for path, line, func, code in frames:
        out.append(f'  File "{path}", line {line}, in {func}')
        out.append(f"    {code}")
    return out


def _launcher_tail(log: EngineLog, exit_code: int) -> None:
    log.main("Rank 0 scheduler is dead. Please check if there are relevant logs.")
    log.main(f"Exit code: {exit_code}")
    log.raw("\n".join(["Traceback (most recent call last):",
                       '  File "<frozen runpy>", line 198, in _run_module_as_main',
                       '  File "<frozen runpy>", line 88, in _run_code'] + _frames([
        (f"{_SITE}/sglang/launch_server.py", 32, "<module>", "run_server(server_args)"),
        (f"{_SG}/entrypoints/http_server.py", 1723, "launch_server", "_launch_subprocesses("),
        (f"{_SG}/entrypoints/engine.py", 1013, "_launch_subprocesses",
         "scheduler_infos = _wait_for_scheduler_ready(scheduler_pipe_readers, scheduler_procs)"),
        (f"{_SG}/entrypoints/engine.py", 847, "_wait_for_scheduler_ready", "data = scheduler_pipe_readers[i].recv()"),
        ("/usr/lib/python3.12/multiprocessing/connection.py", 250, "recv", "buf = self._recv_bytes()"),
        ("/usr/lib/python3.12/multiprocessing/connection.py", 430, "_recv_bytes", "buf = self._recv(4)"),
        ("/usr/lib/python3.12/multiprocessing/connection.py", 399, "_recv", "raise EOFError"),
    ]) + ["EOFError", ""]))


def oom_at_load(log: EngineLog, gpu_mem_gb: float) -> None:
    total_gib = gpu_mem_gb / 1.0737 + 12.0
    log.tp("Scheduler hit an exception: " + "\n".join(["Traceback (most recent call last):"] + _frames([
        (f"{_SG}/managers/scheduler.py", 2937, "run_scheduler_process", "scheduler = Scheduler("),
        (f"{_SG}/managers/scheduler.py", 346, "__init__", "self.init_model_worker()"),
        (f"{_SG}/managers/tp_worker.py", 246, "__init__", "self._init_model_runner()"),
        (f"{_SG}/model_executor/model_runner.py", 460, "initialize", "self.load_model()"),
        (f"{_SG}/model_executor/model_runner.py", 889, "load_model", "self.model = self.loader.load_model("),
        (f"{_SG}/model_loader/loader.py", 677, "load_model", "self.load_weights_and_postprocess("),
        (f"{_SG}/model_loader/loader.py", 701, "load_weights_and_postprocess", "model.load_weights(weights)"),
        (f"{_SITE}/torch/utils/_device.py", 104, "__torch_function__", "return func(*args, **kwargs)"),
    ]) + [
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a total capacity of "
        f"{total_gib:.2f} GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has "
        f"{total_gib - 1.2:.2f} GiB memory in use. Of the allocated memory {total_gib - 3.1:.2f} GiB is allocated "
        f"by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
        f"large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        f"documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        ""]))
    _launcher_tail(log, -3)


def host_oom_killed(log: EngineLog) -> None:
    """The kernel OOM-killer SIGKILLed the scheduler while the pools were allocated (a static fraction that
    leaves the host too little unified memory). The launcher's line, from the 2x Spark capture
    2spark-load-host-oom-scheduler-died-poster-edited.txt (there wrapped by the poster; printed as one line)."""
    log.raw("RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 "
            "(SIGKILL), a common cause is the OS OOM killer.")


def scheduler_crash(log: EngineLog, serving: bool) -> None:
    log.tp("Scheduler hit an exception: " + "\n".join(["Traceback (most recent call last):"] + _frames([
        (f"{_SG}/managers/scheduler.py", 2949, "run_scheduler_process", "scheduler.event_loop_overlap()"),
        (f"{_SITE}/torch/utils/_contextlib.py", 120, "decorate_context", "return func(*args, **kwargs)"),
        (f"{_SG}/managers/scheduler.py", 1108, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
        (f"{_SG}/managers/scheduler.py", 2211, "run_batch",
         "batch_result = self.model_worker.forward_batch_generation("),
        (f"{_SG}/model_executor/model_runner.py", 2318, "forward", "output = self._forward_raw("),
    ]) + ["RuntimeError: CUDA error: an illegal memory access was encountered",
          "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
          "might be incorrect.",
          "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
          "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.", ""]))
    if serving:
        log.main("Received sigquit from a child process. It usually means the child failed.")
    else:
        _launcher_tail(log, -3)


def nccl_watchdog(log: EngineLog, rank: int, seq: int, timeout_s: float, ran_for_s: float) -> None:
    tms = int(timeout_s * 1000)
    ran = max(tms, int(ran_for_s * 1000))
    numel = 1290240
    what = (f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
            f"NumelIn={numel}, NumelOut={numel}, Timeout(ms)={tms}) ran for {ran} milliseconds before timing out.")
    log.raw(f"[rank{rank}]:[E{c10d_stamp()} ProcessGroupNCCL.cpp:616] {what}")
    log.raw(f"[rank{rank}]:[E{c10d_stamp()} ProcessGroupNCCL.cpp:1785] [PG ID 2 PG GUID 3 Rank {rank}] Exception "
            f"(either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq}, "
            f"last completed NCCL work: {seq - 1}.")
    log.raw(f"[rank{rank}]:[E{c10d_stamp()} ProcessGroupNCCL.cpp:1834] [PG ID 2 PG GUID 3 Rank {rank}] Timeout at "
            f"NCCL work: {seq}, last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}.")
    log.raw("terminate called after throwing an instance of 'c10::DistBackendError'")
    log.raw(f"  what():  [PG 3 Rank {rank}] Process group watchdog thread terminated with exception: {what}")
    log.raw("Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:609 "
            "(most recent call first):")


def store_connect_warning(log: EngineLog, host: str, port: int, err: str) -> None:
    log.raw(f"[W{c10d_stamp()} socket.cpp:767] [c10d] The client socket has failed to connect to "
            f"[{host}]:{port} (errno: 111 - {err}).")


def store_connect(log: EngineLog, host: str, port: int, attempts: int, timeout_s: float, err: str) -> None:
    pid = os.getpid()
    log.main(f"{socket.gethostname()}:{pid}:{pid} [0] misc/socket.cc:578 NCCL WARN socketPollConnect: connect to "
             f"{host}<{port}> returned {err}, exceeded error retry count after {attempts} attempts")
    log.tp("Scheduler hit an exception: " + "\n".join(["Traceback (most recent call last):"] + _frames([
        (f"{_SG}/managers/scheduler.py", 2937, "run_scheduler_process", "scheduler = Scheduler("),
        (f"{_SG}/model_executor/model_runner.py", 365, "__init__",
         "min_per_gpu_memory = self.init_torch_distributed()"),
        (f"{_SG}/model_executor/model_runner.py", 740, "init_torch_distributed", "init_distributed_environment("),
        (f"{_SITE}/torch/distributed/rendezvous.py", 189, "_create_c10d_store", "return TCPStore("),
    ]) + [f"torch.distributed.DistNetworkError: The client socket has timed out after {int(timeout_s)}s while "
          f"trying to connect to ({host}, {port}).", ""]))
    log.main("Received sigquit from a child process. It usually means the child failed.")


def store_listen(log: EngineLog, port: int, err: str) -> None:
    log.tp("Scheduler hit an exception: Traceback (most recent call last):\n"
           f"torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
           f"address. port: {port}, useIpv6: false, code: -98, name: EADDRINUSE, message: {err.lower()}\n")
    _launcher_tail(log, -3)


def store_wait(log: EngineLog, timeout_s: float, joined: int, nnodes: int) -> None:
    log.tp("Scheduler hit an exception: Traceback (most recent call last):\n"
           f"torch.distributed.DistStoreError: Timed out after {int(timeout_s)} seconds waiting for clients. "
           f"{joined}/{nnodes} clients joined.\n")
    _launcher_tail(log, -3)


def launcher_value_error(message: str) -> str:
    """The launcher's traceback for a ValueError of SGLang 0.5.23's --config merger (prepare_server_args, before
    any process starts), e.g. "Config file not found: /x.yaml"."""
    return "\n".join(["Traceback (most recent call last):",
                       '  File "<frozen runpy>", line 198, in _run_module_as_main',
                       '  File "<frozen runpy>", line 88, in _run_code'] + _frames([
        (f"{_SITE}/sglang/launch_server.py", 81, "<module>", "server_args = prepare_server_args(sys.argv[1:])"),
        (f"{_SG}/server_args.py", 689, "prepare_server_args", "argv = config_merger.merge_config_with_args(argv)"),
    ]) + [f"ValueError: {message}"])


def unknown_speculative_algorithm(error: str) -> str:
    """The launcher's traceback for an unknown algorithm, frames as in the sglang 0.5.23 wheel: launch_server.py
    run_server -> ServerArgs.resolve_once -> the resolution pipeline's speculative hook -> from_string's raise.
    `error` is the dialect's line with the name filled in ("ValueError: Unknown speculative algorithm name: X")."""
    return "\n".join(["Traceback (most recent call last):",
                       '  File "<frozen runpy>", line 198, in _run_module_as_main',
                       '  File "<frozen runpy>", line 88, in _run_code'] + _frames([
        (f"{_SITE}/sglang/launch_server.py", 84, "<module>", "run_server(server_args)"),
        (f"{_SITE}/sglang/launch_server.py", 29, "run_server", "server_args.resolve_once()"),
        (f"{_SG}/server_args.py", 277, "resolve_once", "run_resolution_pipeline(self)"),
        (f"{_SG}/arg_groups/pipeline.py", 306, "run_resolution_pipeline",
         "run_hook(handle_speculative_decoding, server_args)"),
        (f"{_SG}/arg_groups/resolution_hooks.py", 139, "run_hook", "step(server_args)"),
        (f"{_SG}/arg_groups/speculative_hook.py", 242, "handle_speculative_decoding",
         "algo = SpeculativeAlgorithm.from_string(cfg.speculative_algorithm)"),
        (f"{_SG}/speculative/spec_info.py", 65, "from_string",
         'raise ValueError(f"Unknown speculative algorithm name: {name}")'),
    ]) + [error])
