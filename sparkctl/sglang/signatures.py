"""The catalogue of known failure signatures: SGLang, NCCL and GB10 failures as users and SGLang itself report them.

Data, not code: each `Signature` is an id, a regular expression searched in one log line (ANSI codes and the
``\\r`` of progress bars already taken apart), the cause, the fix and where that knowledge comes from. Every entry
starts from the failure-signature table of shared/reference/operations.md, a real capture under
tests/fixtures/captures/, or SGLang 0.5.23's own source; each has a test on a real or published line
(tests/doctor/test_catalogue.py), never on a line written here.

Adding one: append a `Signature` below with its source, and a test that feeds it the line as it was printed or
published (a capture file, or the exact published message with its reference).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Signature:
    """One known failure: `pattern` is searched in each line; `cancelled_by`, when set, is a pattern whose match on
    a later line of the same log means the failure did not last (a capture that went on, a server that came up)."""

    id: str
    title: str
    pattern: re.Pattern[str]
    cause: str
    fix: str
    source: str
    cancelled_by: re.Pattern[str] | None = None


def _sig(id: str, title: str, pattern: str, cause: str, fix: str, source: str,
         cancelled_by: str | None = None) -> Signature:
    return Signature(id, title, re.compile(pattern), cause, fix, source,
                     re.compile(cancelled_by) if cancelled_by else None)


DROP_CACHES = "sync; echo 3 | sudo tee /proc/sys/vm/drop_caches"

CATALOGUE: tuple[Signature, ...] = (
    # ---------------------------------------------------------------------------------------- unified memory
    _sig("sglang-kv-pool-no-memory", "SGLang found no memory left for the KV cache",
         r"Not enough memory\. Please try to increase --mem-fraction-static",
         "after the weights loaded, what --mem-fraction-static leaves for the KV pool was zero or less: on GB10's "
         "unified memory, page cache or memory a previous engine leaked (a UVM reserve, a restart loop) was held "
         "when the engine started",
         f"free the memory before the boot ({DROP_CACHES}; stop leftover engines or containers) and check "
         "`sparkctl preflight`; SGLang's own advice is to raise --mem-fraction-static, which on unified memory also "
         "takes from the host (OOM-killer risk)",
         "SGLang 0.5.23 python/sglang/srt/model_executor/pool_configurator.py (the message); cause on GB10: "
         "operations.md (eugr #257; MiaAI GLM #47, Qwen3.8 #35)"),
    _sig("vllm-free-memory-below-utilization", "free memory at start-up below the requested share (vLLM)",
         r"Free memory on device \S+ \(.*\) on startup is less than desired GPU memory utilization",
         "page cache or a leaked UVM reserve holds unified memory when the engine starts; memory leaked by restart "
         "loops",
         f"drop the page cache ({DROP_CACHES}) or posix_fadvise the checkpoint out of it; lower the memory fraction",
         "operations.md: eugr #257; MiaAI GLM #47, Qwen3.8 #35"),
    _sig("sglang-memory-unbalanced", "memory capacity unbalanced across ranks",
         r"The memory capacity is unbalanced",
         "one rank's GPU had much less free memory than the others at start-up: unified memory still held by a "
         "crashed container (or another process on that node's GPU)",
         "wait for the leaked memory to be returned or reboot that node; `sparkctl preflight` shows each node's "
         "free memory",
         "operations.md (al-engr.com); message: SGLang 0.5.23 python/sglang/srt/distributed/bootstrap.py"),
    _sig("nvrm-no-memory", "the NVIDIA driver ran out of memory (kernel log)",
         r"NVRM\b.*Out of memory \[NV_ERR_NO_MEMORY\]",
         "unified memory exhausted (a large prefill, a checkpoint held in page cache); the OOM killer or a hard "
         "reset follows",
         f"cap batched tokens (server.chunked_prefill_size, max_running_requests) and evict the page cache "
         f"({DROP_CACHES}) before the boot",
         "operations.md: NVIDIA/dgx-spark-playbooks #97"),
    _sig("host-oom-killed-at-load", "the host OOM-killer killed the scheduler while loading",
         r"scheduler died during initialization \(exit code: -9\)",
         "exit code -9 is SIGKILL, commonly the OS OOM-killer: weights plus the static pool took more unified memory "
         "than the host could give",
         f"lower server.mem_fraction_static, drop the page cache before the boot ({DROP_CACHES}), and check the "
         "kernel log (`dmesg | grep -i oom`) on the node",
         "captures/sglang/2spark-load-host-oom-scheduler-died-poster-edited.txt (PixelML/qwen3-8-flash-next-sglang-"
         "2x-dgx-spark@6b84351 armB-load-failure.md)"),
    _sig("sglang-rank-did-not-finish-loading", "a TP rank did not reach SGLang's barrier after weight loading",
         r"TP rank \d+ could finish the model loading, but there are other ranks that didn't finish loading",
         "SGLang's barrier after loading the weights (torch.distributed.monitored_barrier over the TP group's gloo "
         "group) failed. Printed by rank 0: another rank did not arrive within 480 s (UNBALANCED_MODEL_LOADING_"
         "TIMEOUT_S, fixed in SGLang: no flag or variable changes it), so it was slow (a busy CPU, swap, a slow "
         "disk) or died. Printed by a rank above 0: rank 0 failed, was stopped or went away while this rank waited; "
         "SGLang's wording names OOM or a slow node, but the first error, if any, is in the other rank's log",
         "read the other ranks' logs for their first error (`sparkctl logs --rank 0`, `sparkctl doctor`); if none "
         "failed, the node was slow: stop what competes for its CPU, memory or disk (on CPU give each rank its own "
         "core, SGLANG_CPU_OMP_THREADS_BIND) and run `sparkctl up` again (the failed deployment is stopped and the "
         "previous one kept)",
         "SGLang 0.5.23 python/sglang/srt/model_executor/model_runner_components/load_model_utils.py, "
         "dist_barrier_after_load (the message; the 480 s barrier timeout is UNBALANCED_MODEL_LOADING_TIMEOUT_S "
         "in the same file)"),
    # ---------------------------------------------------------------------------------------- NCCL / fabric
    _sig("nccl-bootstrap-connect-failed", "NCCL bootstrap could not connect to a peer",
         r"NCCL WARN socketPollConnect: connect to \S+ returned [^,]+, exceeded error retry count",
         "NCCL's bootstrap dialled an address the peer does not listen on: NCCL_SOCKET_IFNAME names another "
         "interface (the management network instead of the fabric), or the peer rank is gone",
         "set fabric_interface/fabric_address in the inventory to the CX-7 fabric (sparkctl passes them as "
         "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME) and run `sparkctl preflight`; read the peer rank's log",
         "captures/sglang/multinode-rank1-nccl-bootstrap-wrong-interface.txt (devopsrustem/slurmv4@3e72c52 3/5.sh)"),
    _sig("nccl-remote-exited", "NCCL: a remote rank exited or the network failed",
         r"NCCL error: remote process exited or there was a network error",
         "another rank of the group died (its log has the first error) or the fabric dropped the connection",
         "read every rank's log for the first error (`sparkctl logs --rank N`), then check the fabric link",
         "captures/sglang/multinode-rank1-nccl-bootstrap-wrong-interface.txt (devopsrustem/slurmv4@3e72c52 3/5.sh)"),
    _sig("nccl-watchdog-timeout", "a collective operation timed out (NCCL watchdog)",
         r"Watchdog caught collective operation timeout: WorkNCCL\(",
         "a collective did not complete within the timeout: a peer rank hung or died, or the fabric stopped "
         "carrying traffic",
         "read the other ranks' logs for what stopped first; check the fabric (`sparkctl preflight`); a long "
         "first compile may need a larger server.dist_timeout / watchdog_timeout",
         "captures/sglang/nccl-watchdog-timeout-multinode-2node-tp16.txt (sgl-project/sglang PR #3709), "
         "nccl-watchdog-terminate-dist-backend-error.txt (sgl-project/sglang #1693)"),
    _sig("nccl-ib-completion-error", "an RDMA transfer to a peer failed (NCCL NET/IB)",
         r"NCCL WARN NET/IB: Got completion from peer \S+ with status=[1-9]\d*",
         "the RoCE/InfiniBand transfer completed with an error: wrong HCA pairing, a drifted GID index or a bad "
         "link on that port",
         "pin the HCA of the cabled port (inventory roce_hcas; `ibdev2netdev`), resolve the RoCEv2 GID index per "
         "node, and test the link with ib_write_bw / nccl-tests",
         "captures/sglang/multinode-hang-before-spans-across-nodes.txt (devopsrustem/slurmv4@1ac5007 3/13.sh); "
         "operations.md (ainode #89; MiaAI #10/#95)"),
    _sig("nccl-qp-or-system-error", "NCCL could not set up the RoCE queue pair",
         r"ibv_modify_qp failed with (?:110|61)\b|unhandled system error",
         "wrong HCA pairing or a drifted GID index",
         "pin the active HCA (inventory roce_hcas), resolve the RoCEv2 GID per node (NCCL_IB_GID_INDEX)",
         "operations.md: ainode #89; MiaAI #10/#95; sparkring #186"),
    # ---------------------------------------------------------------------------------------- GB10 (sm_121) kernels
    _sig("moe-shared-memory-sm121", "MoE kernel tiles too big for GB10's shared memory",
         r"OutOfResources: shared memory, Required: \d+, Hardware limit: \d+",
         "the default MoE (Triton) tile configs need more shared memory than GB10 (sm_121) has",
         "use tuned MoE configs for GB10 or a Spark image that ships them",
         "operations.md: BTankut/dgx-spark-sglang-moe-configs"),
    _sig("deepgemm-no-sm121-kernel", "DeepGEMM JIT has no sm_121 kernel",
         r"Failed to open .*sm121_fp8_mqa_logits\.cuh",
         "DeepGEMM's JIT looks for an sm_121 kernel source that the upstream image does not have",
         "use a patched image (the profile's GB10 patch series)",
         "operations.md: sparkrun #220"),
    _sig("image-newer-than-driver", "the image needs a newer NVIDIA driver than the host has",
         r"container was built for NVIDIA Driver Release \S+.*detected",
         "the engine image was built for a newer driver (590.x) than the host runs (580.x)",
         "use an image built for the host's driver, or update the driver on every node (`sparkctl facts` shows it)",
         "operations.md: eugr #266"),
    _sig("cutlass-fp4-sm121", "FlashInfer CUTLASS FP4 grouped GEMM fails on sm_121",
         r"Failed to initialize cutlass TMA WS grouped gemm",
         "FlashInfer's CUTLASS FP4 MoE path does not run on GB10 (sm_121)",
         "use the Marlin MoE backend for FP4 models",
         "operations.md: Sggin1 DGX-SPARK guide"),
    _sig("cuda-graph-capture-stalled", "CUDA-graph capture made no progress",
         r"Captur\w+ .*\|\s*0/\d+ \[",
         "the log stops at the first CUDA-graph capture: a cold FlashInfer/JIT compile (the capture's own account) "
         "or, across nodes, an NCCL deadlock during graph capture",
         "give a cold JIT cache time (lifecycle.boot_timeout_s) and keep the JIT cache between boots; across nodes, "
         "server.disable_cuda_graph as reported",
         "operations.md (al-engr.com); captures/sglang/spark-1node-dflash-stopped-at-capture-0of58.txt "
         "(sostrowsk/dgx-spark-local-llm@4b54864)",
         cancelled_by=r"\|\s*[1-9]\d*/\d+ \[|The server is fired up and ready to roll"),
    # ---------------------------------------------------------------------------------------- image contents
    _sig("deepep-not-installed", "DeepEP missing from the engine image",
         r"DeepEP is not installed",
         "the launch asks for DeepEP (--moe-a2a-backend deepep) but the image has no DeepEP package",
         "drop --moe-a2a-backend deepep from the profile's extra_args, or build an image with DeepEP",
         "captures/sglang/multinode-scheduler-exception-rank0-dead.txt (devopsrustem/slurmv4@3e72c52 3/4.sh)"),
)


def by_id(signature_id: str) -> Signature:
    """The catalogue entry `signature_id` (KeyError when there is none)."""
    for sig in CATALOGUE:
        if sig.id == signature_id:
            return sig
    raise KeyError(signature_id)
