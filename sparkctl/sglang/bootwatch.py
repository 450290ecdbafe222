"""The boot state machine of one engine rank: fed its log line by line through its engine's `LogDialect` (SGLang's
`sparkctl.sglang.logparse` by default, vLLM's `sparkctl.vllm.logparse`; `sparkctl.enginelog.follower_for(engine)`
picks it), it keeps the milestones, capacity, pools and the first fatal error with context, and `classify` says where
the boot stands (READY, WORKER_READY, FAILED, STUCK, STARTING, STOPPED).

Rules kept on purpose (see logparse): a failure only when an error line was printed; a log that stops is STUCK
with its last milestone and last line, not FAILED.
"""
from __future__ import annotations

import enum
import logging
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime

from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.logparse import (
    FATAL_KINDS,
    SGLANG_LOG,
    STAT_KINDS,
    DecodeStats,
    EventKind,
    LogDialect,
    LogEvent,
    split_segments,
)

log = logging.getLogger("sparkctl.sglang")

__all__ = ["BootState", "BootFailure", "BootVerdict", "MilestoneSeen", "LogFollower"]


# --------------------------------------------------------------------------- follower

class BootState(enum.Enum):
    READY = "ready"                # rank 0: HTTP server fired up
    WORKER_READY = "worker-ready"  # non-zero node rank: dummy health server up, scheduler running
    FAILED = "failed"              # an error was printed
    STUCK = "stuck"                # no ready line, no error line: hung, stopped, or still booting
    STARTING = "starting"          # classify(final=False) instead of STUCK
    STOPPED = "stopped"            # the engine logged its shutdown (vLLM: one the caller asked for) and no error before


@dataclass
class MilestoneSeen:
    kind: EventKind
    ts: datetime | None
    line_no: int
    line: str


@dataclass
class BootFailure:
    """The first fatal error printed, refined by a more specific cause printed right after it."""

    kind: EventKind
    first_line: str
    line_no: int
    ts: datetime | None
    first_kind: EventKind
    exception: str | None = None
    exit_code: int | None = None
    fields: JSONObject = field(default_factory=dict)
    context: list[str] = field(default_factory=list)   # lines before + after the first error


@dataclass
class BootVerdict:
    state: BootState
    kind: EventKind | None = None          # failure kind when FAILED
    first_error_line: str | None = None
    last_milestone: EventKind | None = None
    last_line: str | None = None
    detail: str = ""
    failure: BootFailure | None = None


_BOOT_MILESTONES = frozenset(EventKind) - FATAL_KINDS - STAT_KINDS
_GENERIC = {EventKind.TRACEBACK: 0, EventKind.SCHEDULER_EXCEPTION: 1, EventKind.NCCL_ERROR: 2}
_SPECIFIC = {EventKind.NCCL_ERROR: 2, EventKind.OOM: 3, EventKind.NCCL_WATCHDOG_TIMEOUT: 3,
             EventKind.CONFIG_ERROR: 3, EventKind.MEMORY_BUDGET: 3}     # the last two: vLLM's root causes


class LogFollower:
    """Fed one rank's log line by line; keeps what the boot has shown so far.

    ``feed`` accepts raw physical lines (``\\r`` and ANSI tolerated). State: first occurrence
    of each milestone, last line, resolved capacity, KV/mamba pools (one rank's view), decode
    stats, and the first fatal error with context. ``classify`` turns it into a verdict.
    """

    def __init__(self, *, context_before: int = 5, context_after: int = 15, tail: int = 50,
                 refine_window: int = 10, dialect: LogDialect = SGLANG_LOG) -> None:
        self.dialect = dialect
        self.milestones: dict[EventKind, MilestoneSeen] = {}
        self.last_milestone: MilestoneSeen | None = None
        self.last_line: str | None = None
        self.line_no = 0
        self.capacity: dict[str, int | float] | None = None
        self.kv_pools: list[JSONObject] = []
        self.mamba_pools: list[JSONObject] = []
        self.mamba_cap: int | None = None
        self.nccl_version: str | None = None
        self.server_args: JSONObject | None = None
        self.engine_config: JSONObject | None = None     # vLLM: the settings its engine resolved (config line)
        self.worker_health_address: str | None = None
        self.failure: BootFailure | None = None
        self.shutdown: LogEvent | None = None          # the engine's first shutdown line (vLLM: fields["requested"])
        self.shutdown_errors: list[LogEvent] = []      # error lines after a requested shutdown: its noise, no failure
        self.fatal_events: list[LogEvent] = []
        self.request_errors: list[LogEvent] = []
        self.decode = DecodeStats()
        self.tail: deque[str] = deque(maxlen=tail)
        self._before: deque[str] = deque(maxlen=context_before)
        self._after_left = 0
        self._context_after = context_after
        self._refine_window = refine_window
        self._pool_ranks: dict[EventKind, tuple[str, ...]] = {}

    # feeding ---------------------------------------------------------------
    def feed(self, raw_line: str) -> list[LogEvent]:
        """Consume one physical line; return the events recognised in it."""
        events = []
        for seg in split_segments(raw_line):
            self.line_no += 1
            ev = self.dialect.parse_segment(seg)
            self._record_line(self.dialect.display(seg))
            if ev is not None:
                self._apply(ev)
                events.append(ev)
            self._before.append(self.dialect.display(seg))
        return events

    def feed_text(self, text: str) -> list[LogEvent]:
        out: list[LogEvent] = []
        for line in text.splitlines():
            out.extend(self.feed(line))
        return out

    def _record_line(self, seg: str) -> None:
        self.last_line = seg
        self.tail.append(seg)
        if self.failure is not None and self._after_left > 0:
            self.failure.context.append(seg)
            self._after_left -= 1

    def _apply(self, ev: LogEvent) -> None:
        k = ev.kind
        if k in _BOOT_MILESTONES:
            seen = MilestoneSeen(k, ev.ts, self.line_no, ev.line)
            self.milestones.setdefault(k, seen)
            self.last_milestone = seen
        if k is EventKind.CAPACITY:
            # the first line's values; keys only a later line prints are added (vLLM 0.25.1 split its capacity line)
            self.capacity = dict(ev.fields) if self.capacity is None else {**ev.fields, **self.capacity}
        elif k in (EventKind.KV_ALLOCATED, EventKind.MAMBA_ALLOCATED):
            # one rank's view: keep events from the rank tag that printed this kind first
            owner = self._pool_ranks.setdefault(k, ev.ranks)
            if ev.ranks == owner:
                (self.kv_pools if k is EventKind.KV_ALLOCATED else self.mamba_pools).append(dict(ev.fields))
        elif k is EventKind.MAMBA_CAP_WARNING:
            self.mamba_cap = ev.fields["max_running_requests"]
        elif k is EventKind.NCCL_VERSION and self.nccl_version is None:
            self.nccl_version = ev.fields["version"]
        elif k is EventKind.SERVER_ARGS and self.server_args is None:
            self.server_args = ev.fields["args"]
        elif k is EventKind.ENGINE_CONFIG and self.engine_config is None:
            self.engine_config = dict(ev.fields)
        elif k is EventKind.WORKER_DUMMY_HEALTH:
            self.worker_health_address = ev.fields["address"]
        elif k is EventKind.DECODE_BATCH:
            self.decode.add(ev)
        elif k is EventKind.SHUTDOWN and "requested" in ev.fields and self.shutdown is None:
            self.shutdown = ev
        elif ev.fatal:
            self._apply_fatal(ev)

    def _apply_fatal(self, ev: LogEvent) -> None:
        f = self.failure
        if f is None and self.shutdown_requested:
            # vLLM force-kills its engine core on a requested shutdown and then logs EngineDeadError: not a crash
            self.shutdown_errors.append(ev)
            return
        self.fatal_events.append(ev)
        if f is None and ev.kind is EventKind.TRACEBACK and self.ready:
            # a bare traceback after "fired up" is usually one request failing (logged, server
            # keeps serving); kept as evidence, not a boot failure. Scheduler/NCCL/OOM still fail.
            self.request_errors.append(ev)
            return
        if f is None:
            self.failure = BootFailure(kind=ev.kind, first_line=ev.line, line_no=self.line_no, ts=ev.ts,
                                   first_kind=ev.kind, exception=ev.fields.get("exception"),
                                   exit_code=ev.fields.get("exit_code"), fields=dict(ev.fields),
                                   context=[*self._before, ev.line])
            self._after_left = self._context_after
            log.debug("first fatal line %d (%s): %s", self.line_no, ev.kind.value, ev.line)
            return
        if f.exception is None and "exception" in ev.fields:
            f.exception = ev.fields["exception"]
        if f.exit_code is None and "exit_code" in ev.fields:
            f.exit_code = ev.fields["exit_code"]
        if "detail" in ev.fields:   # pydantic prints a config error's message on the line after the exception
            f.fields.setdefault("detail", ev.fields["detail"])
        # refine a generic first error by a specific cause printed in the same burst
        same_exc = "exception" in ev.fields and f.exception == ev.fields["exception"]
        in_burst = self.line_no - f.line_no <= self._refine_window or same_exc
        if (in_burst and f.kind in _GENERIC and ev.kind in _SPECIFIC and not ev.fields.get("weak")
                and _SPECIFIC[ev.kind] > _GENERIC[f.kind]):
            f.kind = ev.kind
            f.fields.update(ev.fields)

    # results ---------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return EventKind.READY in self.milestones

    @property
    def shutdown_requested(self) -> bool:
        """The engine logged a shutdown that only a signal to it starts (vLLM's API server: launcher.py:254)."""
        return self.shutdown is not None and self.shutdown.fields.get("requested") is True

    @property
    def worker_ready(self) -> bool:
        return self.dialect.worker_ready <= self.milestones.keys()

    def classify(self, *, final: bool = True) -> BootVerdict:
        """Verdict on the boot so far.

        FAILED only when an error line was printed (before a requested shutdown: vLLM's EngineDeadError after one is
        kept in ``shutdown_errors``); STOPPED once the engine logged its shutdown with no error before it (only
        vLLM's parser marks one); READY (rank 0) / WORKER_READY (node rank > 0: the dialect's ``worker_ready``
        milestones, SGLang's dummy health server up, vLLM's headless rank at its KV cache line); otherwise STUCK with
        the last milestone and last line (``final=False`` says STARTING instead: the caller's timeout decides when it
        is a hang).
        """
        last_ms = self.last_milestone.kind if self.last_milestone else None
        if self.failure is not None:
            f = self.failure
            detail = f"{f.kind.value}: {f.exception or f.first_line}"
            if "detail" in f.fields:
                detail += f": {f.fields['detail']}"
            if f.exit_code is not None:
                detail += f" (exit code {f.exit_code})"
            return BootVerdict(BootState.FAILED, kind=f.kind, first_error_line=f.first_line,
                               last_milestone=last_ms, last_line=self.last_line, detail=detail, failure=f)
        if self.shutdown is not None:
            was = "ready" if self.ready else "worker-ready" if self.worker_ready else "not ready yet"
            asked = "on request" if self.shutdown_requested else "(its executor stopped; no error line before it)"
            return BootVerdict(BootState.STOPPED, last_milestone=last_ms, last_line=self.last_line,
                               detail=f"shut down {asked} ({was}): {self.shutdown.message}")
        if self.ready:
            return BootVerdict(BootState.READY, last_milestone=last_ms, last_line=self.last_line,
                               detail=self.dialect.ready_detail)
        if self.worker_ready:
            where = f" at {self.worker_health_address}" if self.worker_health_address else ""
            return BootVerdict(BootState.WORKER_READY, last_milestone=last_ms, last_line=self.last_line,
                               detail=f"{self.dialect.worker_detail}{where}")
        state = BootState.STUCK if final else BootState.STARTING
        where = last_ms.value if last_ms else "no milestone"
        return BootVerdict(state, last_milestone=last_ms, last_line=self.last_line,
                           detail=f"no ready line and no error; last milestone: {where}")

