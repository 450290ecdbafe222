"""Entry point and boot sequence of the SGLang engine emulator.

``python -m sparkctl.sim <launch_server argv>`` or ``sparkctl.sim.engine.main(argv) -> int``.
It parses argv in the emulated SGLang version's dialect (``SPARKCTL_SIM_SGLANG_VERSION``,
default 0.5.23), reads its knobs (``sparkctl.sim.config``), then walks SGLang's start-up
milestones over ``boot_s`` seconds, printing the same log lines, and serves:

* rank 0: the HTTP API (``sparkctl.sim.http_api``) on ``--host:--port``, ready after warm-up;
* ranks > 0: only the dummy health server, after joining rank 0's store (``sparkctl.sim.dist``).

Multi-node: rank 0 hosts the store at ``--dist-init-addr`` and is not ready before every rank
joined; a vanished peer makes the survivor print the NCCL watchdog failure and exit non-zero
within ``peer_timeout_s``. Faults (``fail_load_oom``, ``hang_at_init``, ``crash_after_s``,
``never_healthy``) are knobs. SIGTERM/SIGINT shut down cleanly (exit 0).

The first line it prints says that this is the sparkctl emulator, not SGLang.
See ``sparkctl/sim/README.md`` for every knob.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from sparkctl.sim import failures
from sparkctl.sim.args import Resolved, build_parser, resolve, server_args_repr, startup_error, torch_dtype
from sparkctl.sim.config import KnobError, Knobs, load_knobs, sglang_version
from sparkctl.sim.config_file import ConfigFileError, merge_config_args
from sparkctl.sim.dist import DistError, StoreClient, StoreServer
from sparkctl.sim.logfmt import EngineLog

if TYPE_CHECKING:  # imported where used: a worker rank never loads the HTTP API or the scheduler
    from sparkctl.sim.responses import ApiState
    from sparkctl.sim.scheduler import Scheduler

EXIT_FAILURE = 1
_BOOT_COLLECTIVES = 1000   # NCCL work items done during boot (base of the watchdog SeqNum)


class _Stop(Exception):
    """Unwinds the boot when the engine is stopping (signal or failure)."""


class Engine:
    def __init__(self, res: Resolved, knobs: Knobs, log: EngineLog, parser_warning: str | None = None) -> None:
        self.res, self.knobs, self.log = res, knobs, log
        self.parser_warning = parser_warning
        self.stopping = threading.Event()
        self.exit_code: int | None = None
        self._exit_lock = threading.Lock()
        self.t_start = time.monotonic()
        self.group: StoreServer | StoreClient | None = None
        self.sched: Scheduler | None = None
        self.api_state: ApiState | None = None
        self.servers: list = []
        self.ready = False

    # ---- lifecycle ------------------------------------------------------------------------
    def finish(self, code: int) -> None:
        with self._exit_lock:
            if self.exit_code is None:
                self.exit_code = code
        self.stopping.set()

    def _pause(self, frac: float) -> None:
        if self.stopping.wait(max(0.0, self.knobs.boot_s * frac)):
            raise _Stop

    def _block_forever(self) -> None:
        while not self.stopping.wait(0.5):
            pass
        raise _Stop

    def _on_signal(self, signum, frame) -> None:  # noqa: ARG002
        if self.stopping.is_set():
            return
        name = "SIGTERM" if signum == signal.SIGTERM else "SIGINT"
        self.log.main(f"{name} received. signum=None frame=None. Draining requests and shutting down...")
        self.finish(0)

    def _on_peer_lost(self, peer: int, silent_s: float, last_seq: int) -> None:
        if self.stopping.is_set():
            return
        seq = max(last_seq, self._seq())
        failures.nccl_watchdog(self.log, self.res.tp_rank, seq, self.knobs.peer_timeout_s, silent_s)
        self.log.main("Received sigquit from a child process. It usually means the child failed.")
        self.finish(EXIT_FAILURE)

    def _seq(self) -> int:
        return _BOOT_COLLECTIVES + (self.sched.forward_ct if self.sched else 0)

    def _set_ready(self) -> None:
        self.ready = True
        if self.knobs.crash_after_ready_s is not None:
            timer = threading.Timer(self.knobs.crash_after_ready_s, self._crash)
            timer.daemon = True
            timer.start()

    def _crash(self) -> None:
        if self.stopping.is_set():
            return
        failures.scheduler_crash(self.log, serving=self.ready or self.res.node_rank > 0)
        self.finish(EXIT_FAILURE)

    # ---- run ------------------------------------------------------------------------------
    def run(self) -> int:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        timer = None
        if self.knobs.crash_after_s is not None:
            timer = threading.Timer(self.knobs.crash_after_s, self._crash)
            timer.daemon = True
            timer.start()
        try:
            self._boot()
            self._block_forever()
        except _Stop:
            pass
        finally:
            if timer:
                timer.cancel()
            self._close()
        return self.exit_code if self.exit_code is not None else 0

    def _close(self) -> None:
        if self.sched:
            self.sched.stop()
        for srv in self.servers:
            try:
                srv.shutdown()
                srv.server_close()
            except OSError:
                pass
        if self.group:
            self.group.close()

    # ---- boot -----------------------------------------------------------------------------
    def _boot(self) -> None:
        r, k, log = self.res, self.knobs, self.log
        log.main(f"sparkctl-sim: this is the sparkctl SGLang emulator (emulating SGLang {r.version} "
                 f"launch_server, node rank {r.node_rank}), NOT SGLang: no GPU, no model weights, generated text.")
        if self.parser_warning:
            log.main(self.parser_warning)
        if r.speculative and not r.extras.get("mrr_given"):
            log.main(f"Max running requests is reset to {k.default_max_running_requests} for speculative decoding. "
                     "You can override this by explicitly setting --max-running-requests.")
        log.main(f"server_args={server_args_repr(r.args, r.version)}")
        self._pause(0.02)
        t0 = time.monotonic()
        log.tp("Init torch distributed begin.")
        if r.nnodes > 1:
            self._rendezvous()
        elif k.hang_at_init:
            self._block_forever()
        log.tp(f"Init torch distributed ends. elapsed={time.monotonic() - t0 + 0.21:.2f} s, mem usage=0.61 GB")
        self._pause(0.03)

        avail = k.gpu_mem_gb - 0.6
        t_load = time.monotonic()
        log.tp(f"Load weight begin. avail mem={avail:.2f} GB")
        self._pause(0.40)
        if k.fail_load_oom or r.extras.get("weights_do_not_fit"):   # the static pool cannot hold the weights
            failures.oom_at_load(log, k.gpu_mem_gb)
            self.finish(EXIT_FAILURE)
            raise _Stop
        avail -= k.weight_gb
        log.tp(f"Load weight end. elapsed={time.monotonic() - t_load:.2f} s, type=EmulatedForCausalLM, "
               f"avail mem={avail:.2f} GB, mem usage={k.weight_gb:.2f} GB.")
        graph_gb = 0.26
        if r.speculative:
            self._load_draft(avail)
            avail -= k.draft_weight_gb
        self._pause(0.05)
        if r.extras.get("boot_oom"):   # --mem-fraction-static above oom_mem_fraction: the host runs out (perf.py)
            failures.host_oom_killed(log)
            self.finish(EXIT_FAILURE)
            raise _Stop

        kv_gb = self._allocate_pools(avail)
        avail -= kv_gb
        self._pause(0.05)
        log.tp(f"Capture cuda graph begin. This can take up to several minutes. avail mem={avail:.2f} GB")
        self._pause(0.20)
        t_graph = k.boot_s * 0.20
        log.tp(f"Capture cuda graph end. Time elapsed: {t_graph:.2f} s. mem usage={graph_gb:.2f} GB. "
               f"avail mem={avail - graph_gb:.2f} GB.")
        avail -= graph_gb
        if self.group and not self.group.barrier("model"):
            raise _Stop
        if r.node_rank > 0:   # workers print no capacity line (spark-3node-tp3-rank2-worker-dummy-health.txt)
            self._serve_worker()
            return
        log.tp(f"max_total_num_tokens={r.max_total_num_tokens}, chunked_prefill_size={r.chunked_prefill_size}, "
               f"max_prefill_tokens={r.max_prefill_tokens}, max_running_requests={r.max_running_requests}, "
               f"context_len={r.context_len}, available_gpu_mem={avail:.2f} GB")
        self._serve_rank0(kv_gb, graph_gb)

    def _rendezvous(self) -> None:
        r, k, log = self.res, self.knobs, self.log
        if r.dist_host is None or r.dist_port is None:
            log.raw("ValueError: --dist-init-addr is required when --nnodes > 1")
            self.finish(EXIT_FAILURE)
            raise _Stop
        dist_host, dist_port = r.dist_host, r.dist_port
        common = dict(peer_timeout_s=k.peer_timeout_s, heartbeat_s=k.heartbeat_period(), seq=self._seq,
                      on_peer_lost=self._on_peer_lost, stopping=self.stopping)
        if r.node_rank == 0:
            try:
                self.group = StoreServer(r.dist_host, r.dist_port, r.nnodes, reserved=k.reserved_ports, **common)
            except DistError as e:
                failures.store_listen(log, r.dist_port, str(e))
                self.finish(EXIT_FAILURE)
                raise _Stop from None
            timeout = r.dist_timeout or k.store_wait_timeout_s
            if not self.group.wait_joined(timeout):
                if self.stopping.is_set():
                    raise _Stop
                failures.store_wait(log, timeout, self.group.joined(), r.nnodes)
                self.finish(EXIT_FAILURE)
                raise _Stop
        else:
            timeout = r.dist_timeout or k.store_connect_timeout_s

            def on_retry(attempt: int, err: str) -> None:
                if attempt == 1 or attempt % 20 == 0:
                    failures.store_connect_warning(log, dist_host, dist_port, err)
            try:
                self.group = StoreClient(r.node_rank, r.dist_host, r.dist_port, r.nnodes, timeout,
                                         on_retry=on_retry, **common)
            except DistError as e:
                if self.stopping.is_set():
                    raise _Stop from None
                failures.store_connect(log, r.dist_host, r.dist_port, e.attempts, timeout, str(e))
                self.finish(EXIT_FAILURE)
                raise _Stop from None
        if not self.group.barrier("gloo"):
            raise _Stop
        world = r.tp_size
        per_node = max(1, r.tp_size // r.nnodes)
        for local in range(per_node):
            log.raw(f"[Gloo] Rank {r.tp_rank + local} is connected to {world - 1} peer ranks. "
                    f"Expected number of connected peer ranks is : {world - 1}")
        if r.node_rank == 0:
            log.tp(f"sglang is using nccl=={k.nccl_version}")
        if k.hang_at_init:
            self._block_forever()
        if not self.group.barrier("nccl"):
            raise _Stop
        who = "CustomAllreduce" if r.vt >= (0, 5, 16) else "Custom allreduce"
        log.tp(f"{who} is disabled because this process group spans across nodes.")

    def _load_draft(self, avail: float) -> None:
        r, k, log = self.res, self.knobs, self.log
        log.tp("Init torch distributed begin.")
        log.tp("Init torch distributed ends. elapsed=0.00 s, mem usage=0.00 GB")
        log.tp(f"Load weight begin. avail mem={avail:.2f} GB")
        self._pause(0.05)
        kind = "DFlash" if r.spec_algorithm == "DFLASH" else "Eagle"
        log.tp(f"Load weight end. elapsed={k.boot_s * 0.05:.2f} s, type={kind}DraftModel, "
               f"avail mem={avail - k.draft_weight_gb:.2f} GB, mem usage={k.draft_weight_gb:.2f} GB.")
        if r.spec_algorithm == "DFLASH":
            log.tp(f"Initialized DFLASH draft runner. attention_backend="
                   f"{r.args.get('speculative_draft_attention_backend') or 'flashinfer'}, model=DFlashDraftModel, "
                   f"block_size={r.num_draft_tokens}, draft_window_size=None, compact_cache=False")

    def _allocate_pools(self, avail: float) -> float:
        r, k, log = self.res, self.knobs, self.log
        per_token = k.kv_bytes_per_token / (2 if r.kv_dtype.startswith("fp8") else 1)
        half_gb = r.max_total_num_tokens * per_token / 2 / 1e9
        total = 2 * half_gb
        if r.hybrid:
            conv = 0.0005 * r.mamba_cache_size + 0.01
            ssm = 0.0235 * r.mamba_cache_size
            log.tp(f"Mamba Cache is allocated. max_mamba_cache_size: {r.mamba_cache_size}, "
                   f"conv_state size: {conv:.2f}GB, ssm_state size: {ssm:.2f}GB ")
            total += conv + ssm
        log.tp(f"KV Cache is allocated. dtype: {torch_dtype(r.kv_dtype)}, #tokens: {r.max_total_num_tokens}, "
               f"K size: {half_gb:.2f} GB, V size: {half_gb:.2f} GB")
        log.tp(f"Memory pool end. avail mem={avail - total:.2f} GB")
        if r.mamba_capped:
            log.tp(f"max_running_requests is capped to {r.max_running_requests} by the mamba state cache "
                   f"(max_mamba_cache_size={r.mamba_cache_size}, 3 state slots per request). To raise it: increase "
                   f"--mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state size with "
                   f"--mamba-ssm-dtype bfloat16.")
        self._kv_gb = round(2 * half_gb, 2)
        return total

    def _serve_worker(self) -> None:
        from sparkctl.sim.http_api import serve_dummy
        r = self.res
        try:
            self.servers.append(serve_dummy(r.host, r.port))
        except OSError as e:
            self.log.main(f"Dummy health check server failed to start: {e}")
            self.finish(EXIT_FAILURE)
            raise _Stop from None
        self.log.main(f"Dummy health check server started in background thread at {r.host}:{r.port}")
        self._set_ready()

    def _serve_rank0(self, kv_gb: float, graph_gb: float) -> None:
        from sparkctl.sim import decoding as dec
        from sparkctl.sim.http_api import serve_api
        from sparkctl.sim.responses import ApiState
        from sparkctl.sim.scheduler import Request, Scheduler
        r, k, log = self.res, self.knobs, self.log
        sched = self.sched = Scheduler(r, k, log)
        sched.start()
        state = ApiState(r, k, sched, log)
        state.memory_usage.update({"weight": round(k.weight_gb, 2), "kvcache": round(kv_gb, 2), "graph": graph_gb})
        self.api_state = state
        try:
            self.servers.append(serve_api(r.host, r.port, state))
        except OSError as e:
            log.raw(f"ERROR:    [Errno {e.errno}] error while attempting to bind on address ('{r.host}', {r.port}): "
                    f"{e.strerror}")
            self.finish(EXIT_FAILURE)
            raise _Stop from None
        log.main(f"INFO:     Started server process [{os.getpid()}]")
        log.main("INFO:     Waiting for application startup.")
        log.main("INFO:     Application startup complete.")
        log.main(f"INFO:     Uvicorn running on http://{r.host}:{r.port} (Press CTRL+C to quit)")
        self._pause(0.05)
        if k.never_healthy:
            return  # the warm-up request never comes back: /health stays 503, no "fired up"
        log.main(f'INFO:     127.0.0.1:{30000 + os.getpid() % 30000} - "GET /model_info HTTP/1.1" 200 OK')
        text = "The capital city of France is"
        warm = Request(prompt_tokens=dec.tokenize(text), max_new_tokens=1,
                       plan=dec.make_plan(text, thinking=False, knobs=k, spec_on=False, temperature=0.0))
        sched.submit(warm)
        while warm.finish_reason is None:
            if self.stopping.wait(0.01):
                raise _Stop
        log.main(f'INFO:     127.0.0.1:{30001 + os.getpid() % 30000} - "POST /generate HTTP/1.1" 200 OK')
        self._pause(0.05)
        log.main("The server is fired up and ready to roll!")
        self._set_ready()
        state.ready.set()


def main(argv: list[str] | None = None) -> int:
    """Run the emulator with SGLang launch_server's argv; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    version = sglang_version()
    try:
        parser, warning = build_parser(version)
    except Exception as e:  # noqa: BLE001 - unknown version etc.: one clear line
        print(f"sparkctl-sim: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        argv = merge_config_args(parser, argv)
    except ConfigFileError as e:  # SGLang's prepare_server_args raises before parsing: traceback, exit 1
        print(e.traceback, file=sys.stderr, flush=True)
        return 1
    try:
        ns = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed "launch_server.py: error: ..."
        return int(e.code) if isinstance(e.code, int) else 2
    failure = startup_error(ns, version)
    if failure:  # SGLang's launcher raises before it starts a process: traceback on stderr, exit 1
        print(failure, file=sys.stderr, flush=True)
        return 1
    try:
        knobs = load_knobs(int(getattr(ns, "node_rank", 0) or 0))
    except KnobError as e:
        print(f"sparkctl-sim: {e}", file=sys.stderr, flush=True)
        return 2
    res = resolve(ns, argv, version, knobs)
    tag = f"TP{res.tp_rank}" if (res.tp_size > 1 or res.old_dialect) else None
    return Engine(res, knobs, EngineLog(sys.stdout, tag), warning).run()
