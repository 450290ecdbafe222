"""Boot stage: start rank N-1 .. 1, then rank 0; follow every rank's log to readiness.

Fails fast on a fatal log line (OOM, NCCL error, Traceback) or a dead rank, with the
node, the first error and the log tail as evidence; never waits past its timeout.

Rank 0's /health is polled on a thread of its own (`HealthWatch`) from the moment its log shows the capacity
resolved, while the logs are followed: SGLang's /health (health_generate) answers 200 only after an
``asyncio.sleep(1)`` inside the handler, so a probe sent only once the "fired up" line was read added that second
(plus the line's trip through the log pipe and a poll) after the engine was already up. A person polling /health by
hand from the start sees the 200 about one second after SGLang turns Up; the boot now does too. The gate is the
same: the "fired up" line *and* a 200 (in either order).

Each poll reads every rank's log and liveness, the nodes at once (`_check_all`), at the runtime's interval; from rank
0's capacity line its /health is asked every `HEALTH_POLL_S` (one request at a time), and a 200 cuts the poll's pause
short: ready at once when the line was read, else the logs are read every `READY_POLL_S` until it is. Every rank
started is followed (`Runtime.follow`) until the boot ends, whatever the outcome (`unfollow`): on the docker runtime
its log comes over one SSH stream (`nodes.docker_follow`), so a poll reads memory, where it was an SSH session and
`docker logs`, `inspect` and `top` on every node (150-290 ms of the machine's CPU per round on the two-node test
cluster, taken from the engines booting on the same cores: the same containers started by hand pay none of it).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkctl.deploy.progress import Reporter
from sparkctl.enginelog import SIGNATURES_OF, follower_for
from sparkctl.errors import DeployError, SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.nodes.fanout import fan_out, raise_first
from sparkctl.nodes.runtime import Handle, Liveness, Runtime, log_tail
from sparkctl.sglang.bootwatch import BootState, LogFollower
from sparkctl.sglang.findings import LogText, finding_lines, match_sources
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.sglang.logparse import EventKind

# Milestones worth a progress line, in boot order.
_ANNOUNCE = {
    EventKind.SPANS_ACROSS_NODES: "process group spans across nodes",
    EventKind.WEIGHTS_LOADED: "weights loaded",
    EventKind.KV_ALLOCATED: "KV cache allocated",
    EventKind.MAMBA_ALLOCATED: "mamba cache allocated",
    EventKind.CAPACITY: "capacity resolved",
    EventKind.WORKER_DUMMY_HEALTH: "worker up (dummy health server)",
    EventKind.HEADLESS: "headless worker started (vLLM: no HTTP server on this rank)",
    EventKind.READY: "server fired up and ready",
}


@dataclass
class BootingRank:
    spec: LaunchSpec
    runtime: Runtime
    handle: Handle
    reporter: Reporter
    follower: LogFollower = field(init=False)     # reads the log of the rank's engine (spec.engine)
    offset: int = 0
    announced: set[EventKind] = field(default_factory=set)
    cap_line: str | None = None          # the engine's own line saying it caps concurrency (mamba state cache)

    def __post_init__(self) -> None:
        self.follower = follower_for(self.spec.engine)

    def poll(self) -> None:
        self.take(*self.runtime.read_log(self.handle, self.offset))

    def take(self, text: str, offset: int) -> None:
        """The log text read from `self.offset` up to `offset` (what `poll` reads), fed to the follower."""
        reporter = self.reporter
        self.offset = offset
        for line in text.splitlines():
            for ev in self.follower.feed(line):
                if ev.kind is EventKind.MAMBA_CAP_WARNING and self.cap_line is None:
                    self.cap_line = ev.message
                if ev.kind in _ANNOUNCE and ev.kind not in self.announced:
                    self.announced.add(ev.kind)
                    extra = ""
                    if ev.kind is EventKind.CAPACITY:
                        extra = ": " + ", ".join(f"{k}={v}" for k, v in ev.fields.items()
                                                 if k in ("max_total_num_tokens", "max_running_requests",
                                                          "context_len"))
                    reporter.event(f"rank {self.spec.rank}: {_ANNOUNCE[ev.kind]}{extra}", self.spec.node)

    def full_log(self) -> str:
        return self.runtime.read_log(self.handle, 0)[0]


@dataclass
class BootResult:
    watches: list[BootingRank]
    elapsed_s: float

    @property
    def handles(self) -> list[Handle]:
        return [w.handle for w in self.watches]

    def capacity(self) -> JSONObject | None:
        rank0 = next(w for w in self.watches if w.spec.rank == 0)
        return rank0.follower.capacity


READY_POLL_S = 0.2       # the logs' poll once rank 0's /health said 200 before its log said ready
FOLLOW_MARGIN_S = 30.0   # a rank's log stream outlives the boot's timeout by at most this (its `timeout` on the node)
HEALTH_POLL_S = 0.1      # rank 0's /health is asked this often (one at a time) once its scheduler is up: as a person
                         # polling by hand would; an HTTP GET on the fabric, not an SSH round trip


class HealthWatch:
    """`probe` (rank 0's /health is 200) called on a daemon thread until it says yes or `stop()`: a probe that
    takes a second (SGLang's /health generates a token and sleeps 1 s first) never holds up the log and liveness
    polls, and the answer is there the moment the engine gives it. `ok` is set once a probe returned True."""

    def __init__(self, probe: Callable[[], bool], interval_s: float) -> None:
        self.ok = threading.Event()
        self.answered_at: float | None = None       # time.monotonic() of the first 200
        self._probe = probe
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sparkctl-health-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                healthy = self._probe()
            except Exception:  # noqa: BLE001 - a probe that raises is a probe that did not say 200
                healthy = False
            if healthy:
                self.answered_at = time.monotonic()
                self.ok.set()
                return
            self._stopping.wait(self._interval_s)

    def stop(self) -> None:
        self._stopping.set()


def doctor_lines(logs: list[tuple[str, str]], engine: str = "sglang") -> list[str]:
    """What the doctor recognises in these (name, log text) pairs, as evidence lines (sparkctl.doctor): its cause,
    fix and source, so a failed `up` names a known failure without a second command. Empty when nothing matches."""
    return finding_lines(match_sources([LogText(name, text) for name, text in logs], SIGNATURES_OF[engine]))


def _fail(watch: BootingRank, message: str, hint: str, elapsed: float) -> DeployError:
    f = watch.follower.failure
    evidence = []
    if f is not None:
        evidence.append(f"first error ({f.kind.value}): {f.first_line}")
        if f.exception is not None and f.exception != f.first_line:
            evidence.append(f"raised: {f.exception}")
    full = watch.full_log()
    evidence.append(f"log tail ({watch.handle.log_ref}):")
    evidence.append(log_tail(full, 25))
    evidence += doctor_lines([(f"rank {watch.spec.rank} [{watch.spec.node}]", full)], watch.spec.engine)
    return DeployError(f"boot failed on rank {watch.spec.rank} ({watch.spec.node}) after {elapsed:.1f}s: {message}",
                       where=f"[{watch.spec.node}] boot", hint=hint, evidence="\n".join(evidence), node=watch.spec.node,
                       failure_kind=f.kind.value if f is not None else None)


_HINTS: dict[EventKind | None, str] = {
    EventKind.OOM: "unified memory ran out while loading: lower server.mem_fraction_static, free memory on the node "
                   "(page cache counts), or check nothing else holds the GPU",
    EventKind.NCCL_ERROR: "NCCL could not talk across the fabric: check fabric_interface/fabric_address and "
                          "roce_hcas in the inventory, the link state, and `sparkctl preflight`",
    EventKind.NCCL_WATCHDOG_TIMEOUT: "a collective timed out: a peer rank died or the fabric dropped; check the other "
                                     "rank's log and the fabric link",
    EventKind.CONFIG_ERROR: "the engine refused its configuration before starting (the line above names the "
                            "setting): fix that profile key (`sparkctl render` shows the argv it became)",
    EventKind.MEMORY_BUDGET: "the engine's memory check refused the KV cache budget: lower server.context_length, "
                             "or give it more memory (server.mem_fraction_static; on a CPU, VLLM_CPU_KVCACHE_SPACE)",
}


def boot(specs: list[LaunchSpec], runtime_for: Callable[[str], Runtime], deployment_id: str, reporter: Reporter,
         *, timeout_s: float, worker_grace_s: float = 0.0,
         started: list[tuple[Runtime, Handle]] | None = None,
         ready_probe: Callable[[], bool] | None = None,
         on_start: Callable[[LaunchSpec, Handle | None], None] | None = None,
         log_room: Callable[[], bool] | None = None) -> BootResult:
    """Start ranks (highest first, rank 0 last) and wait for rank 0 to be ready.

    Ready = rank 0 logged "fired up" and, when given, `ready_probe()` (its /health answers 200; asked on a
    `HealthWatch` thread from the moment rank 0's log shows its capacity, so the 200 and the line count in
    either order and a slow /health never delays the log and liveness checks). When the log
    cannot grow (`log_room()` False: the state directory holding the process runtime's rank logs is full or
    read-only, and the log pipe drops lines rather than the engine), `ready_probe()` alone: rank 0's /health is
    503 until SGLang is ready (shared/reference/sglang.md), so a restore needs no disk to know it serves.
    `started` collects (runtime, handle) as each rank starts, so a caller can stop them on failure or Ctrl-C.
    `on_start(spec, None)` runs before each start and `on_start(spec, handle)` right after: the caller writes
    the intent and the handle to the ledger, so a command after a SIGKILL of this one finds the engine.
    """
    t0 = time.monotonic()
    started = started if started is not None else []
    watches: list[BootingRank] = []
    try:
        return _boot(specs, runtime_for, deployment_id, reporter, t0, timeout_s, worker_grace_s, started, watches,
                     ready_probe, on_start, log_room)
    finally:
        followed = {id(rt): rt for rt, _ in started}
        for rt in followed.values():
            rt.unfollow()


def _boot(specs: list[LaunchSpec], runtime_for: Callable[[str], Runtime], deployment_id: str, reporter: Reporter,
          t0: float, timeout_s: float, worker_grace_s: float, started: list[tuple[Runtime, Handle]],
          watches: list[BootingRank], ready_probe: Callable[[], bool] | None,
          on_start: Callable[[LaunchSpec, Handle | None], None] | None,
          log_room: Callable[[], bool] | None) -> BootResult:
    order = sorted(specs, key=lambda s: -s.rank)
    # what each start reads and makes first, for every rank at once: the starts then follow each other closely
    prepared = raise_first(fan_out(order, lambda s: runtime_for(s.node).prepare(s, deployment_id)))
    for spec, ahead in zip(order, prepared, strict=True):
        rt = runtime_for(spec.node)
        if on_start is not None:
            on_start(spec, None)
        handle = rt.start(spec, deployment_id, ahead)
        started.append((rt, handle))
        if on_start is not None:
            on_start(spec, handle)
        rt.follow(handle, timeout_s + FOLLOW_MARGIN_S)
        watch = BootingRank(spec, rt, handle, reporter)
        watches.append(watch)
        reporter.event(f"rank {spec.rank} started ({handle.where})", spec.node)
        if spec.rank != 0:
            # With a grace (default none): give the worker a moment before the next start, until SGLang accepted
            # its arguments (the server_args line). Without one, a rank that dies at once (bad flag, missing
            # model) is caught by the wait below, which checks every rank, highest first, on each poll.
            deadline = time.monotonic() + worker_grace_s
            while time.monotonic() < deadline:
                _check(watch, t0)
                if {EventKind.SERVER_ARGS, EventKind.HEADLESS} & watch.follower.milestones.keys():
                    break
                time.sleep(rt.poll_interval_s)
    try:
        return _wait_ready(watches, specs, t0, timeout_s, ready_probe, log_room, reporter)
    except DeployError as exc:
        _let_waiting_peers_report(watches, exc.node)
        raise _with_peer_findings(exc, watches) from exc


# How long the ranks that wait on a failed one get to say so before they are stopped (a rank past its weights waits in a
# collective on the others: SGLang's post-load barrier prints "TP rank 1 could finish the model loading, but there are
# other ranks that didn't finish loading ... or a slow node." once the failed rank's process is gone). A whole run of
# the suite on a busy machine stopped such a rank 2.4 s after its weights loaded (the same second as the other rank's
# error) and before it printed, so the failure could not name the doctor's slow-rank signature. A peer ends the wait by
# failing (its burst read whole) or exiting; one that never reacts (a collective that hangs until its watchdog) is
# stopped at this bound.
PEER_REPORT_S = 10.0


def _let_waiting_peers_report(watches: list[BootingRank], failed_node: str | None) -> None:
    """Before the other ranks' logs are read for what they say about a failed one: when that rank ended (its fatal
    line, or its death; not a rank that is only slow to be ready, which still holds its peers), the live ones past
    their weights (not ready) are followed until each has failed or exited, within `PEER_REPORT_S` (the failed rank's
    own exit, which is what they react to, counted in it). Ranks still loading or connecting are not waited for:
    they learn of the failure only when they reach the others."""
    waiting = [w for w in watches if w.spec.node != failed_node and not w.follower.ready
               and EventKind.WEIGHTS_LOADED in w.follower.milestones]
    failed = next((w for w in watches if w.spec.node == failed_node), None)
    if not waiting or failed is None:
        return
    deadline = time.monotonic() + PEER_REPORT_S
    try:
        if failed.follower.classify(final=False).state is not BootState.FAILED and \
                failed.runtime.liveness(failed.handle).alive:
            return                               # not ready in time, alive: no peer has anything to report yet
        while failed.runtime.liveness(failed.handle).alive and time.monotonic() < deadline:
            time.sleep(failed.runtime.poll_interval_s)
    except (SparkctlError, OSError):
        return
    while waiting and time.monotonic() < deadline:
        still = []
        for w in waiting:
            try:
                w.poll()
                if w.follower.classify(final=False).state is BootState.FAILED:
                    _read_rest(w)
                elif not w.runtime.liveness(w.handle).alive:
                    _read_rest(w, alive=False)
                else:
                    still.append(w)
            except (SparkctlError, OSError):      # an unreachable peer never delays the failure being reported
                continue
        waiting = still
        if waiting:
            time.sleep(max(w.runtime.poll_interval_s for w in waiting))


def _with_peer_findings(exc: DeployError, watches: list[BootingRank]) -> DeployError:
    """The failure with what the doctor recognises in the *other* ranks' logs: in a TP group one rank's error is
    often explained in another's (SGLang's "TP rank 1 could finish the model loading ..." is printed by the rank that
    waited, about the one that failed or was slow). Unchanged when they show nothing known."""
    logs = []
    for w in watches:
        if w.spec.node == exc.node:
            continue
        try:
            logs.append((f"rank {w.spec.rank} [{w.spec.node}]", w.full_log()))
        except (SparkctlError, OSError):    # an unreachable peer never hides the failure being reported
            continue
    lines = doctor_lines(logs, watches[0].spec.engine) if logs else []
    if not lines:
        return exc
    return exc.amended(evidence="\n".join([exc.evidence or "", "in the other ranks' logs:", *lines]).lstrip("\n"))


def _wait_ready(watches: list[BootingRank], specs: list[LaunchSpec], t0: float, timeout_s: float,
                ready_probe: Callable[[], bool] | None, log_room: Callable[[], bool] | None,
                reporter: Reporter) -> BootResult:
    """Wait for rank 0 to be ready while every rank is checked on each poll (see `boot`)."""
    rank0 = next(w for w in watches if w.spec.rank == 0)
    deadline = t0 + timeout_s
    interval = max(w.runtime.poll_interval_s for w in watches)
    health: HealthWatch | None = None
    try:
        while True:
            _check_all(watches, t0)
            if ready_probe is not None and health is None and (
                    EventKind.CAPACITY in rank0.follower.milestones or rank0.follower.ready):
                # this engine's scheduler is up (its HTTP server and SGLang's own warm-up come next): from here a
                # /health 200 can only be its own, so start asking while the logs are followed
                health = HealthWatch(ready_probe, HEALTH_POLL_S)
            if rank0.follower.ready and (health is None or health.ok.is_set()):
                return BootResult(watches, round(time.monotonic() - t0, 3))
            if ready_probe is not None and log_room is not None and not log_room() and \
                    (health.ok.is_set() if health is not None else ready_probe()):
                reporter.event(f"rank 0: ready by /health 200 (its log cannot grow: no room in the state directory, "
                               f"the log pipe drops the lines; {rank0.handle.log_ref})", rank0.spec.node)
                return BootResult(watches, round(time.monotonic() - t0, 3))
            if time.monotonic() > deadline:
                elapsed = time.monotonic() - t0
                verdict = rank0.follower.classify(final=True)
                stuck = f"not ready within {timeout_s:.0f}s; last milestone: " \
                        f"{verdict.last_milestone.value if verdict.last_milestone else 'none'}"
                hint = ("the ranks never met: check the fabric link and that every node reaches "
                        f"{specs[0].env.get('SGLANG_HOST_IP') or specs[0].env.get('VLLM_HOST_IP') or 'rank 0'} "
                        "(sparkctl preflight)"
                        if EventKind.SPANS_ACROSS_NODES not in rank0.follower.milestones and len(specs) > 1 else
                        "raise lifecycle.boot_timeout_s if this model needs longer, or read the log for the stall")
                raise _fail(rank0, stuck, hint, elapsed)
            if health is None:
                time.sleep(interval)
            elif not health.ok.is_set():
                # the poll's pause, cut short by the 200: /health (an HTTP GET) is the fast signal, so the logs are
                # read no more often near the end than before it (each read costs the node CPU its engine boots on)
                if health.ok.wait(interval) and rank0.follower.ready:
                    return BootResult(watches, round(time.monotonic() - t0, 3))   # the 200 came after the line
            else:
                time.sleep(min(interval, READY_POLL_S))     # the 200 came first: the line is next in the log
    finally:
        if health is not None:
            health.stop()


def _check_all(watches: list[BootingRank], t0: float) -> None:
    """One poll of every rank, judged highest rank first. The reads (log, then liveness) of ranks on different
    runtimes (nodes) are made at once, one thread per runtime: on the docker runtime each is an SSH round trip, and a
    poll of two nodes one after the other took twice the time to see rank 0 ready. What was read is judged here,
    in rank order, on this thread (the follower and the reporter are not shared between threads)."""
    groups: dict[int, list[BootingRank]] = {}
    for w in watches:
        groups.setdefault(id(w.runtime), []).append(w)
    if len(groups) == 1:
        for w in watches:
            _check(w, t0)
        return

    def read(group: list[BootingRank]) -> list[tuple[tuple[str, int], Liveness]]:
        return [(w.runtime.read_log(w.handle, w.offset), w.runtime.liveness(w.handle)) for w in group]
    outcomes = fan_out(list(groups.values()), read)
    seen: dict[int, tuple[tuple[str, int], Liveness]] = {}
    for outcome in outcomes:
        if outcome.error is not None:
            raise outcome.error
        for w, got in zip(outcome.item, outcome.value or [], strict=True):
            seen[id(w)] = got
    for w in watches:
        _check(w, t0, seen[id(w)])


def _check(watch: BootingRank, t0: float, seen: tuple[tuple[str, int], Liveness] | None = None) -> None:
    """`seen`: the rank's log read and liveness, read already (`_check_all`); else read here."""
    if seen is None:
        watch.poll()
    else:
        watch.take(*seen[0])
    _raise_if_failed(watch, t0)
    live = watch.runtime.liveness(watch.handle) if seen is None else seen[1]
    if not live.alive:
        _read_rest(watch, alive=False)
        _raise_if_failed(watch, t0, read_rest=False)  # it printed its error and exited between the reads: name it
        raise _fail(watch, f"rank {watch.spec.rank} died: {live.detail}", "read the log tail below",
                    time.monotonic() - t0)


# How long a failing rank's error burst may take to reach its log, once its first fatal line was read.
BURST_QUIET_S = 1.0      # the log did not grow for this long while the rank lives: the burst is over
BURST_BOUND_S = 8.0      # never wait longer than this for a rank that keeps logging


def _read_rest(watch: BootingRank, *, alive: bool = True) -> None:
    """Read the rest of the error burst before the rank is judged. A failure is seen at its first fatal line, and a
    poll can land between the lines of one burst: Python writes a traceback line by line and the log pipe forwards
    what it has, so judging at once named ``Traceback (most recent call last):`` with a tail cut off above the
    exception (CI, a context length the real server refused). Reads until the rank has exited and its log stopped
    growing, or its log was quiet for `BURST_QUIET_S` while it lives, within `BURST_BOUND_S`."""
    step = watch.runtime.poll_interval_s
    start = quiet_since = time.monotonic()
    while time.monotonic() - start < BURST_BOUND_S:
        before = watch.offset
        watch.poll()
        now = time.monotonic()
        if watch.offset != before:
            quiet_since = now
        elif not alive or now - quiet_since >= BURST_QUIET_S:
            return
        else:
            alive = watch.runtime.liveness(watch.handle).alive
            if not alive:
                continue               # it exited: read once more for what its pipe still held, then judge
        time.sleep(step)


def _raise_if_failed(watch: BootingRank, t0: float, *, read_rest: bool = True) -> None:
    """`read_rest=False`: the caller already read the rest of the log (a dead rank's whole output)."""
    verdict = watch.follower.classify(final=False)
    if verdict.state is BootState.FAILED:
        if read_rest:
            _read_rest(watch)
            verdict = watch.follower.classify(final=False)      # refined by the rest of its burst
        kind = verdict.kind
        raise _fail(watch, verdict.detail, _HINTS.get(kind, "read the log tail below"), time.monotonic() - t0)

