"""The emulated scheduler: admission, prefill, decode steps on a monotonic clock, batch log lines.

One thread runs the engine like SGLang's event loop: while requests wait and fewer than
``max_running_requests`` run, it prefills them (cost ``ttft_base_s + uncached/prefill_tps``; the
first token comes out of prefill); otherwise it runs one decode step for every running request.
A step costs ``1/decode_tps`` (spec off) or ``c(D)/decode_tps`` (spec on, each request accepting L
tokens), times ``tokens/batch_no_slowdown`` when the step holds more tokens than that knob (tokens =
running requests, times D with speculation); see ``sparkctl/sim/perf.py``. Admission also needs room in
the KV pool for every running request's prompt + max_new_tokens.
Steps are scheduled against absolute deadlines on ``time.monotonic()`` (deadline += cost): the
deadlines are the engine's clock. A late wake-up (a CPU-starved machine) makes the next sleeps
shorter, and while any request is in flight the schedule is never reset, so a request that was
delayed catches up instead of losing the delay for good: what a client measures over a request is
the configured cost. An idle engine restarts its clock at the arrival of the first request it
admits (its HTTP arrival, before tokenizing), so the time this process spent tokenizing or waiting
for a CPU is inside the modelled TTFT, not added to it. Decode steps are paced from the moment the
first token actually came out, so a late first token is not followed by a catch-up burst.
"""
from __future__ import annotations

import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

from sparkctl.sim import perf
from sparkctl.sim.args import Resolved
from sparkctl.sim.config import Knobs
from sparkctl.sim.decoding import AcceptanceModel, RadixCache, TokenPlan
from sparkctl.sim.logfmt import EngineLog

TTFT_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 120.0, 160.0)


@dataclass
class Request:
    prompt_tokens: list[str]
    plan: TokenPlan
    max_new_tokens: int
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    out: queue.Queue = field(default_factory=queue.Queue)  # (start, end) index ranges, then None
    generated: int = 0
    cached_tokens: int = 0
    verify_ct: int = 0
    accepted: int = 0
    finish_reason: str | None = None
    created: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    finished_at: float | None = None
    aborted: bool = False
    accept: AcceptanceModel | None = None
    ignore_eos: bool = False      # SGLang's sampling parameter: generate max_new_tokens, past the natural end

    @property
    def limit(self) -> int:
        return self.max_new_tokens if self.ignore_eos else min(self.max_new_tokens, self.plan.natural_len)

    def emit(self, n: int) -> None:
        start = self.generated
        self.generated = min(self.limit, self.generated + n)
        if self.generated > start:
            self.out.put((start, self.generated))
        if self.generated >= self.limit:
            self.finish_reason = "length" if self.generated >= self.max_new_tokens and \
                (self.ignore_eos or self.max_new_tokens < self.plan.natural_len) else "stop"


class Scheduler:
    def __init__(self, res: Resolved, knobs: Knobs, log: EngineLog) -> None:
        self.res, self.knobs, self.log = res, knobs, log
        self.cache = RadixCache(res.max_total_num_tokens)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self.forward_ct = 0           # every forward pass (prefill or decode): the NCCL SeqNum
        self.decode_ct = 0
        # stats for log lines, /server_info, /metrics
        self.last_gen_throughput = 0.0
        self.last_accept_len: float | None = None
        self.last_accept_rate: float | None = None
        self.total_accept = 0
        self.total_verify = 0
        self._int_tokens = 0
        self._int_accept = 0
        self._int_verify = 0
        self._int_t0 = time.monotonic()
        self._int_busy_s = 0.0   # engine time spent on steps since the last decode log line
        self._last_prefill_log = time.monotonic()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.ttft_buckets: tuple[float, ...] = TTFT_BUCKETS
        self.ttft_hist = [0] * (len(TTFT_BUCKETS) + 1)
        self.ttft_sum = 0.0
        self.ttft_count = 0
        # What a vLLM dialect reads besides (sparkctl.sim.vllm_api): prefix-cache hits, per-position acceptance,
        # finished requests by reason; `batch_lines` off: vLLM prints no per-batch line, `prefix_caching` off:
        # --no-enable-prefix-caching (nothing is matched).
        self.batch_lines = True
        self.prefix_caching = True
        self.cached_tokens_total = 0
        self.accepted_per_pos = [0] * max(0, res.num_draft_tokens - 1)
        self.finished_by_reason: dict[str, int] = {}
        self._thread = threading.Thread(target=self._loop, name="sim-scheduler", daemon=True)

    # ---- public ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify_all()

    def submit(self, req: Request) -> None:
        req.accept = AcceptanceModel(req.plan.key, req.plan.code, self.res.num_draft_tokens, self.knobs) \
            if self.res.speculative else None
        with self._cv:
            self.waiting.append(req)
            self.requests_total += 1
            self._cv.notify_all()

    def use_ttft_buckets(self, buckets: tuple[float, ...]) -> None:
        """Count TTFT in another engine's histogram buckets (before the first request)."""
        self.ttft_buckets = buckets
        self.ttft_hist = [0] * (len(buckets) + 1)

    def abort(self, req: Request) -> None:
        req.aborted = True

    def flush_cache(self) -> bool:
        with self._cv:
            if self.waiting or self.running:
                return False
        self.cache.flush()
        self.log.tp("Cache flushed successfully!")
        return True

    @property
    def avg_accept_len(self) -> float | None:
        return self.total_accept / self.total_verify if self.total_verify else None

    def tokens_in_use(self) -> int:
        return sum(len(r.prompt_tokens) + r.generated for r in list(self.running))

    # ---- timing ---------------------------------------------------------------------------
    def _step_cost(self, n_running: int) -> float:
        return perf.step_seconds(self.knobs, speculative=self.res.speculative, draft=self.res.num_draft_tokens,
                                 running=n_running)

    def _reserve(self, r: Request) -> int:
        """KV tokens a request may hold: its prompt plus what it may still generate (within the context)."""
        return min(self.res.context_len, len(r.prompt_tokens) + r.max_new_tokens)

    def _admit(self) -> list[Request]:
        """Waiting requests that fit: fewer than max_running_requests run and the KV pool holds every running
        request's reservation (the first request is always admitted: one that cannot fit was refused at the API)."""
        room = self.res.max_running_requests - len(self.running)
        used = sum(self._reserve(r) for r in self.running)
        batch: list[Request] = []
        for r in self.waiting:
            if len(batch) >= room:
                break
            need = self._reserve(r)
            if (self.running or batch) and used + need > self.res.max_total_num_tokens:
                break
            batch.append(r)
            used += need
        return batch

    def _sleep_until(self, deadline: float) -> None:
        while not self._stop.is_set():
            dt = deadline - time.monotonic()
            if dt <= 0:
                return
            time.sleep(min(dt, 0.05))

    # ---- the loop -------------------------------------------------------------------------
    def _loop(self) -> None:
        deadline: float | None = None
        while not self._stop.is_set():
            with self._cv:
                self.running = [r for r in self.running if not r.aborted and r.finish_reason is None]
                self.waiting = [r for r in self.waiting if not r.aborted]
                if not self.running and not self.waiting:
                    deadline = None
                    self._cv.wait(timeout=0.5)
                    continue
                batch = self._admit()
                del self.waiting[:len(batch)]
            if deadline is None:       # idle until now: the clock starts at the oldest admitted arrival
                now = time.monotonic()
                deadline = min([now] + [r.created for r in batch])
            deadline = self._prefill(batch, deadline) if batch else self._decode_step(deadline)

    def _prefill(self, batch: list[Request], deadline: float) -> float:
        new_tokens = cached = 0
        for r in batch:
            r.cached_tokens = self.cache.match(r.prompt_tokens) if self.prefix_caching else 0
            cached += r.cached_tokens
            self.cached_tokens_total += r.cached_tokens
            new_tokens += len(r.prompt_tokens) - r.cached_tokens
        deadline += self.knobs.ttft_base_s + new_tokens / max(1e-9, self.knobs.prefill_tps)
        self._sleep_until(deadline)
        self.forward_ct += 1
        now = time.monotonic()
        gap = max(1e-6, now - self._last_prefill_log)
        self._last_prefill_log = now
        with self._cv:
            n_running, n_queue = len(self.running), len(self.waiting)
        if self.batch_lines:
            self._log_prefill(len(batch), new_tokens, cached, n_running, n_queue, new_tokens / gap)
        for r in batch:
            self.prompt_tokens_total += len(r.prompt_tokens)
            if r.aborted:
                continue
            r.first_token_at = now
            self._observe_ttft(now - r.created)
            r.emit(1)
            self.generation_tokens_total += 1
            self._int_tokens += 1
            if r.finish_reason:
                self._finish(r, now)
        with self._cv:
            self.running.extend(r for r in batch if r.finish_reason is None and not r.aborted)
        # Decode steps are paced from when the first token actually came out: a first token that was late
        # (a starved process) is not followed by a burst that would make the stream look faster than modelled.
        return max(deadline, now)

    def _decode_step(self, deadline: float) -> float:
        with self._cv:
            batch = list(self.running)
        if not batch:
            return deadline
        cost = self._step_cost(len(batch))
        deadline += cost
        self._int_busy_s += cost
        self._sleep_until(deadline)
        now = time.monotonic()
        self.forward_ct += 1
        self.decode_ct += 1
        for r in batch:
            if r.aborted or r.finish_reason:
                continue
            n = r.accept.next() if r.accept else 1
            before = r.generated
            r.emit(n)
            got = r.generated - before
            self.generation_tokens_total += got
            self._int_tokens += got
            if r.accept:
                r.verify_ct += 1
                self._int_accept += n
                self._int_verify += 1
                self.total_accept += n
                self.total_verify += 1
                for pos in range(min(n - 1, len(self.accepted_per_pos))):
                    self.accepted_per_pos[pos] += 1
            if r.finish_reason:
                self._finish(r, now)
        if self.batch_lines and self.decode_ct % self.res.decode_log_interval == 0:
            self._log_decode(len(batch))
        return deadline

    def _finish(self, r: Request, now: float) -> None:
        r.finished_at = now
        reason = r.finish_reason or "stop"
        self.finished_by_reason[reason] = self.finished_by_reason.get(reason, 0) + 1
        self.cache.insert(r.prompt_tokens + r.plan.tokens(0, r.generated))
        r.out.put(None)

    def _observe_ttft(self, s: float) -> None:
        self.ttft_sum += s
        self.ttft_count += 1
        for i, b in enumerate(self.ttft_buckets):
            if s <= b:
                self.ttft_hist[i] += 1
                return
        self.ttft_hist[-1] += 1

    # ---- log lines ------------------------------------------------------------------------
    def _usage(self) -> float:
        return self.tokens_in_use() / max(1, self.res.max_total_num_tokens)

    def _log_prefill(self, n_seq: int, new: int, cached: int, n_running: int, n_queue: int, tput: float) -> None:
        usage = self._usage()
        if self.res.old_dialect:
            self.log.tp(f"Prefill batch. #new-seq: {n_seq}, #new-token: {new}, #cached-token: {cached}, "
                        f"token usage: {usage:.2f}, #running-req: {n_running}, #queue-req: {n_queue}, ")
            return
        if self.res.hybrid:
            mamba = (n_running + n_seq) / max(1, self.res.mamba_cache_size)
            pool = f"full token usage: {usage:.2f}, mamba usage: {mamba:.2f}, "
        else:
            pool = f"token usage: {usage:.2f}, "
        self.log.tp(f"Prefill batch, #new-seq: {n_seq}, #new-token: {new}, #cached-token: {cached}, {pool}"
                    f"#running-req: {n_running}, #queue-req: {n_queue}, #pending-token: 0, "
                    f"cuda graph: False, input throughput (token/s): {tput:.2f}")

    def _log_decode(self, n_running: int) -> None:
        now = time.monotonic()
        # Tokens over the engine time the interval's steps took (their scheduled cost), not over wall time:
        # a schedule that catches up after a stall runs steps back to back, and wall time would make the
        # gauge spike to absurd values (seen: 87k tok/s at decode_tps 800).
        gap = max(1e-6, now - self._int_t0, self._int_busy_s)
        self._int_t0 = now
        self._int_busy_s = 0.0
        self.last_gen_throughput = self._int_tokens / gap
        self._int_tokens = 0
        used = self.tokens_in_use()
        usage = used / max(1, self.res.max_total_num_tokens)
        with self._cv:
            n_queue = len(self.waiting)
        if self.res.hybrid and not self.res.old_dialect:
            pool = (f"#full token: {used}, full token usage: {usage:.2f}, mamba num: {n_running}, "
                    f"mamba usage: {n_running / max(1, self.res.mamba_cache_size):.2f}, ")
        else:
            pool = f"#token: {used}, token usage: {usage:.2f}, "
        spec = ""
        if self.res.speculative and self._int_verify:
            alen = self._int_accept / self._int_verify
            d = self.res.num_draft_tokens
            rate = alen / d if self.res.old_accept_rate else ((alen - 1) / (d - 1) if d > 1 else 0.0)
            self.last_accept_len, self.last_accept_rate = alen, rate
            self._int_accept = self._int_verify = 0
            spec = f"accept len: {alen:.2f}, accept rate: {rate:.2f}, "
        sep, tail = (".", ", ") if self.res.old_dialect else (",", "")
        self.log.tp(f"Decode batch{sep} #running-req: {n_running}, {pool}{spec}cuda graph: True, "
                    f"gen throughput (token/s): {self.last_gen_throughput:.2f}, #queue-req: {n_queue}{tail}")
