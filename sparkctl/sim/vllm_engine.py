"""The emulator's vLLM dialect: ``python -m sparkctl.sim serve MODEL ...`` is ``vllm serve MODEL ...``.

It parses argv with vLLM 0.32.0's own flag schema (`sparkctl.sim.vllm_args`), walks vLLM's start-up over
``boot_s`` printing its lines (`sparkctl.sim.vllm_logfmt`; every line copied from tests/fixtures/captures/
vllm-0.32.0-cpu/, the file named beside it), and serves:

* rank 0: vLLM's HTTP API (`sparkctl.sim.vllm_api`) once the engine is up (the port is closed before);
* a ``--headless`` rank (``--node-rank`` > 0): no HTTP server; it joins rank 0's store at
  ``--master-addr:--master-port`` (`sparkctl.sim.dist`), loads, allocates its KV cache and waits.

Multi-node: rank 0 is not up before every node joined. A vanished peer: rank 0 logs gloo's ``Connection closed by
peer``, its engine dies and the API server finishes (exit 1), as tp2b-rank0.log; a headless rank whose rank 0 went
away stays, silent, as the real one did (tp2-rank0-sigterm-observation.txt). Faults are the shared knobs
(``hang_at_init``, ``crash_after_s``, ``crash_after_ready_s``, ``never_healthy``); the KV and memory checks fail with
vLLM's words. SIGTERM/SIGINT: vLLM's shutdown lines, exit 0. The first line says this is sparkctl's emulator.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Any

from sparkctl.sglang.dialect import load_dialect
from sparkctl.sim import vllm_failures as fail
from sparkctl.sim.args import Resolved
from sparkctl.sim.config import KnobError, Knobs, load_knobs
from sparkctl.sim.config_file import VllmConfigFileError, merge_vllm_config
from sparkctl.sim.dist import DistError, StoreClient, StoreServer
from sparkctl.sim.engine import EXIT_FAILURE, Engine, _Stop
from sparkctl.sim.vllm_args import (
    BLOCK_SIZE,
    GIB,
    VllmSettings,
    build_parser,
    resolve,
    vllm_version,
)
from sparkctl.sim.vllm_logfmt import VllmLog

# tp2-rank0.log's route table: the emulator prints the routes it serves (sparkctl.sim.vllm_api.ROUTES)
_LAUNCHER_ROUTES = "launcher.py:195"


class VllmEngine(Engine):
    log: VllmLog

    def __init__(self, res: Resolved, knobs: Knobs, log: VllmLog, settings: VllmSettings) -> None:
        super().__init__(res, knobs, log)
        self.vllm = settings
        self._stats_last: tuple[float, int, int, int, int, int] | None = None

    @property
    def headless(self) -> bool:
        return self.vllm.headless or self.res.node_rank > 0

    @property
    def worker(self) -> str:
        return f"Worker_TP{self.res.tp_rank}"

    # ---- signals and faults ---------------------------------------------------------------------
    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        if self.stopping.is_set():
            return
        if self.headless:
            fail.shutdown_headless(self.log, self.res.tp_rank)
        else:
            fail.shutdown_api_server(self.log)
        self.finish(0)

    def _on_peer_lost(self, peer: int, silent_s: float, last_seq: int) -> None:  # noqa: ARG002
        if self.stopping.is_set() or self.headless:
            return      # the real headless rank stays when rank 0 goes (tp2-rank0-sigterm-observation.txt)
        fail.engine_dead(self.log, peer=self.vllm.master_addr, peer_port=self.vllm.master_port)
        self.finish(EXIT_FAILURE)

    def _crash(self) -> None:
        if self.stopping.is_set():
            return
        if self.headless:
            self.log.line(self.worker, "multiproc_executor.py:1063", "WorkerProc hit an exception.", "ERROR")
        else:
            fail.engine_dead(self.log)
        self.finish(EXIT_FAILURE)

    # ---- boot -------------------------------------------------------------------------------------
    def _boot(self) -> None:
        r, v, k, log = self.res, self.vllm, self.knobs, self.log
        log.raw(f"sparkctl-sim: this is the sparkctl vLLM emulator (emulating vLLM {r.version} `vllm serve`, node "
                f"rank {r.node_rank}{', headless' if self.headless else ''}), NOT vLLM: no GPU, no model weights, "
                f"generated text.")
        main = "MainProcess" if self.headless else "APIServer"
        if not self.headless:     # api_utils.py:286 (tp2-rank0.log); secrets left out (README: KNOWN)
            secret = {f.dest for f in load_dialect(r.version, engine="vllm").flags if f.secret} | {"config"}
            shown = {key: val for key, val in v.non_default.items() if key not in secret}
            log.line("APIServer", "api_utils.py:286", f"non-default args: {shown!r}")
        if r.context_len > v.model_max_len:
            fail.max_model_len_too_long(log, r.context_len, v.model_max_len)
            self.finish(EXIT_FAILURE)
            raise _Stop
        log.line(main, "model.py:2152", f"Using max model len {r.context_len}")
        log.line(main, "scheduler.py:307", f"Chunked prefill is enabled with max_num_batched_tokens="
                                           f"{v.max_num_batched_tokens}.")
        if v.enforce_eager:
            log.line(main, "vllm.py:1703", "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel "
                     "warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and "
                     "--kernel_config.enable_jit_warmup=False", "WARNING")
        if self.headless:
            log.line(main, "serve.py:224", f"Launching vLLM (v{r.version}) headless multiproc executor, with head "
                     f"node address {v.master_addr}:{v.master_port} for torch.distributed process group.")
        else:
            log.line("EngineCore", "core.py:133", self._config_line())
        self._pause(0.05)
        world = r.tp_size
        method = f"tcp://{v.master_addr}:{v.master_port}" if world > 1 else "file:///tmp/vllm_dist_emulated"
        log.line("Worker", "parallel_state.py:1906", f"world_size={world} rank={r.tp_rank} local_rank=0 "
                                                     f"distributed_init_method={method} backend=gloo")
        if r.nnodes > 1:
            self._rendezvous()
        elif k.hang_at_init:
            self._block_forever()
        log.line("Worker", "parallel_state.py:2350", f"rank {r.tp_rank} in world size {world} is assigned as DP rank "
                 f"0, PP rank 0, PCP rank 0, TP rank {r.tp_rank}, ETP rank {r.tp_rank}, EP rank N/A, EPLB rank N/A")
        t_load = time.monotonic()
        log.line(self.worker, "cpu_model_runner.py:68", f"Starting to load model {r.model_path}...")
        self._pause(0.40)
        log.line(self.worker, "default_loader.py:501", f"Loading weights took {time.monotonic() - t_load:.2f} seconds")
        if r.extras.get("boot_oom"):
            fail.memory_utilization_too_high(log, k.gpu_mem_gb * (1 - v.gpu_memory_utilization) + 1.0,
                                             k.gpu_mem_gb, v.gpu_memory_utilization)
            self.finish(EXIT_FAILURE)
            raise _Stop
        self._pause(0.10)
        self._kv_cache()
        if self.group and not self.group.barrier("model"):
            raise _Stop
        if self.headless:
            self._set_ready()
            return
        if not self._check_kv():
            self.finish(EXIT_FAILURE)
            raise _Stop
        conc = r.max_total_num_tokens / max(1, r.context_len)
        log.line("EngineCore", "kv_cache_utils.py:2327", f"CPU KV cache size: {r.max_total_num_tokens:,} tokens, "
                 f"Maximum concurrency for {r.context_len:,} tokens per request: {conc:.2f}x")
        self._pause(0.15)
        log.line("EngineCore", "core.py:402", f"init engine (profile, create kv cache, warmup model) took "
                                              f"{k.boot_s * 0.2:.2f} s")
        if k.never_healthy:      # the engine never comes up: no HTTP server, connection refused
            self._block_forever()
        self._serve_rank0_vllm()

    def _config_line(self) -> str:
        """core.py:133's line with the fields sparkctl reads, in the real line's order (tp2-rank0.log,
        spec-ngram-boot.log); the real one goes on with compilation and observability configs."""
        r, v = self.res, self.vllm
        spec = "None" if v.spec_method is None else (
            f"SpeculativeConfig(method={v.spec_method!r}, model={v.spec_model!r}, "
            f"num_spec_tokens={v.num_speculative_tokens if v.num_speculative_tokens is not None else 1})")
        dtype = {"auto": "bfloat16", "half": "float16", "float": "float32"}.get(v.dtype, v.dtype)
        return (f"Initializing a V1 LLM engine (v{r.version}) with config: model={r.model_path!r}, "
                f"speculative_config={spec}, tokenizer={r.model_path!r}, skip_tokenizer_init=False, "
                f"tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code="
                f"{bool(r.args.get('trust_remote_code'))}, dtype=torch.{dtype}, max_seq_len={r.context_len}, "
                f"download_dir=None, load_format=auto, tensor_parallel_size={r.tp_size}, pipeline_parallel_size=1, "
                f"data_parallel_size=1, decode_context_parallel_size=1, disable_custom_all_reduce=True, "
                f"quantization=None, enforce_eager={v.enforce_eager}, kv_cache_dtype={v.kv_cache_dtype}, "
                f"device_config=cpu, seed=0, served_model_name={r.served_model_name}, "
                f"enable_prefix_caching={v.prefix_caching}, enable_chunked_prefill=True, pooler_config=None")

    def _rendezvous(self) -> None:
        r, v, k, log = self.res, self.vllm, self.knobs, self.log
        common: dict[str, Any] = dict(peer_timeout_s=k.peer_timeout_s, heartbeat_s=k.heartbeat_period(),
                                      seq=self._seq, on_peer_lost=self._on_peer_lost, stopping=self.stopping)
        timeout = r.dist_timeout or (k.store_connect_timeout_s if self.headless else k.store_wait_timeout_s)
        try:
            if not self.headless:
                self.group = StoreServer(v.master_addr, v.master_port, r.nnodes, reserved=k.reserved_ports, **common)
                if not self.group.wait_joined(timeout):
                    if self.stopping.is_set():
                        raise _Stop
                    log.raw(f"torch.distributed.DistStoreError: Timed out after {int(timeout)} seconds waiting for "
                            f"clients. {self.group.joined()}/{r.nnodes} clients joined.")
                    self.finish(EXIT_FAILURE)
                    raise _Stop
            else:
                self.group = StoreClient(r.node_rank, v.master_addr, v.master_port, r.nnodes, timeout, **common)
        except DistError as e:
            if self.stopping.is_set():
                raise _Stop from None
            log.raw(f"torch.distributed.DistNetworkError: {e}")
            self.finish(EXIT_FAILURE)
            raise _Stop from None
        if not self.group.barrier("gloo"):
            raise _Stop
        if k.hang_at_init:
            self._block_forever()
        log.line("Worker", "cpu_communicator.py:47", "CPU SHM communicator disabled for group tp:0: ranks do not "
                 "share the same SHM group name, falling back to torch.distributed.")

    def _kv_cache(self) -> None:
        """The worker's KV line (cpu_worker.py:260: tp1-boot.log, tp2-rank1.log; "Auto set" from its source)."""
        v, k = self.vllm, self.knobs
        total = k.gpu_mem_gb
        if v.kv_cache_bytes is not None:
            self.log.line(self.worker, "cpu_worker.py:260", f"Explicitly set ({v.kv_cache_bytes / GIB:.1f}/"
                                                            f"{total:.2f}) GiB for KV cache on node 0.")
            return
        kv = self.res.max_total_num_tokens * k.kv_bytes_per_token / GIB
        self.log.line(self.worker, "cpu_worker.py:260", f"Auto set ({kv:.2f}/{total:.2f}) GiB for KV cache on node 0, "
                      f"with {v.gpu_memory_utilization * total:.2f} GiB requested memory for the worker. "
                      f"{k.weight_gb:.2f} GiB memory was consumed by non-kv usages.")

    def _check_kv(self) -> bool:
        """vLLM's KV checks (kv_cache_utils.py:1010/:1030): at least one block, and one request of max_model_len."""
        r, k = self.res, self.knobs
        tokens = int(r.extras.get("kv_tokens", r.max_total_num_tokens))
        if tokens < BLOCK_SIZE:
            fail.no_cache_blocks(self.log)
            return False
        if tokens < r.context_len:
            cell = k.kv_bytes_per_token / GIB
            fail.kv_below_max_model_len(self.log, r.context_len, r.context_len * cell, tokens * cell, tokens)
            return False
        return True

    def _serve_rank0_vllm(self) -> None:
        from sparkctl.sim.scheduler import Scheduler
        from sparkctl.sim.vllm_api import ROUTES, VllmState, serve_vllm_api
        r, log = self.res, self.log
        sched = self.sched = Scheduler(r, self.knobs, log)
        sched.batch_lines = False
        sched.prefix_caching = self.vllm.prefix_caching
        state = VllmState(r, self.knobs, sched, log, self.vllm)
        self.api_state = state
        sched.start()
        log.line("APIServer", "entry.py:136", "Supported tasks: ['generate']")
        log.line("APIServer", "entry.py:140", f"Starting vLLM server on http://{r.host}:{r.port}")
        log.line("APIServer", "launcher.py:186", "Available routes are:")
        for path, method in ROUTES:
            log.line("APIServer", _LAUNCHER_ROUTES, f"Route: {path}, Methods: {method}")
        log.raw(f"INFO:     Started server process [{log.pid}]")
        log.raw("INFO:     Waiting for application startup.")
        log.raw("INFO:     Application startup complete.")
        try:    # uvicorn binds after its lifespan start-up
            self.servers.append(serve_vllm_api(r.host, r.port, state))
        except OSError as e:
            log.raw(f"ERROR:    [Errno {e.errno}] error while attempting to bind on address ('{r.host}', {r.port}): "
                    f"{e.strerror}")
            self.finish(EXIT_FAILURE)
            raise _Stop from None
        state.ready.set()
        self._set_ready()
        threading.Thread(target=self._stats_loop, daemon=True, name="sim-vllm-stats").start()

    # ---- periodic lines ---------------------------------------------------------------------------
    def _stats_loop(self) -> None:
        """loggers.py:335's ``Engine 000: ...`` and spec_decode/metrics.py:120's ``SpecDecoding metrics: ...`` every
        ``vllm_stats_interval_s`` while there is traffic (tp1-boot.log, spec-ngram-boot.log)."""
        s = self.sched
        assert s is not None
        last = (time.monotonic(), s.prompt_tokens_total, s.generation_tokens_total, s.total_verify,
                s.total_accept, s.cached_tokens_total, list(s.accepted_per_pos))
        while not self.stopping.wait(self.knobs.vllm_stats_interval_s):
            now = (time.monotonic(), s.prompt_tokens_total, s.generation_tokens_total, s.total_verify,
                   s.total_accept, s.cached_tokens_total, list(s.accepted_per_pos))
            with s._cv:
                running, waiting = len(s.running), len(s.waiting)
            dt = max(1e-6, now[0] - last[0])
            prompt, gen = now[1] - last[1], now[2] - last[2]
            if prompt or gen or running or waiting:
                hit = 100.0 * (now[5] - last[5]) / prompt if prompt else 0.0
                usage = 100.0 * s.tokens_in_use() / max(1, self.res.max_total_num_tokens)
                self.log.line("APIServer", "loggers.py:335", f"Engine 000: Avg prompt throughput: {prompt / dt:.1f} "
                              f"tokens/s, Avg generation throughput: {gen / dt:.1f} tokens/s, Running: {running} "
                              f"reqs, Waiting: {waiting} reqs, CPU KV cache usage: {usage:.1f}%, Prefix cache hit "
                              f"rate: {hit:.1f}%")
                drafts = now[3] - last[3]
                if self.res.speculative and drafts:
                    self._spec_line(dt, drafts, now[4] - last[4] - drafts, now[6], last[6])
            last = now

    def _spec_line(self, dt: float, drafts: int, accepted: int, pos_now: list[int], pos_then: list[int]) -> None:
        k = self.res.num_draft_tokens - 1
        drafted = drafts * k
        per_pos = ", ".join(f"{(a - b) / drafts:.3f}" for a, b in zip(pos_now, pos_then))
        self.log.line("APIServer", "metrics.py:120", f"SpecDecoding metrics: Mean acceptance length: "
                      f"{1 + accepted / drafts:.2f}, Accepted throughput: {accepted / dt:.2f} tokens/s, Drafted "
                      f"throughput: {drafted / dt:.2f} tokens/s, Accepted: {accepted} tokens, Drafted: {drafted} "
                      f"tokens, Per-position acceptance rate: {per_pos}, Avg Draft acceptance rate: "
                      f"{100.0 * accepted / max(1, drafted):.1f}%")


def main(argv: list[str]) -> int:
    """``vllm serve`` argv (after ``serve``) -> exit code."""
    version = vllm_version()
    try:
        parser = build_parser(version)
    except Exception as e:  # noqa: BLE001 - no schema for the asked version: say so, like a bad flag
        print(f"sparkctl-sim: {e}", file=sys.stderr, flush=True)
        return 2
    log = VllmLog(sys.stdout)
    try:
        argv = merge_vllm_config(argv)
    except VllmConfigFileError as e:
        log.raw("Traceback (most recent call last):")
        log.raw(f"ValueError: {e}")
        return 1
    try:
        ns = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed "vllm serve: error: ..."
        return int(e.code) if isinstance(e.code, int) else 2
    try:
        knobs = load_knobs(int(getattr(ns, "node_rank", 0) or 0))
    except KnobError as e:
        print(f"sparkctl-sim: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        res, settings = resolve(parser, ns, argv, version, knobs)
    except ValueError as e:
        log.raw(f"ValueError: {e}")
        return 1
    return VllmEngine(res, knobs, log, settings).run()     # Engine.run installs the SIGTERM/SIGINT handlers
