"""Every rank of a measured deployment watched while the bench runs: a rank that dies fails the run.

Rank 1 of a TP=2 pair serves no API of its own (its ``/health`` is a dummy), and rank 0 may keep answering for a
while after its peer died (until the NCCL watchdog fires), so a bench that only talks HTTP could record numbers
from a broken deployment as a success. ``RankWatch`` asks each rank's runtime for its liveness (the same check
``sparkctl status`` makes: the process or container state) before the arm is measured, every ``interval_s``
while it is, and once after. The first death trips the run's guard with a ``BenchError`` naming the rank, its
node, when (UTC, and seconds into the run), what the bench was doing and the runtime's word for it, with the
rank's log tail as evidence; every client of the run stops within ``bounds.SLICE_S``.

Example::

    with RankWatch(deployer.runtimes(rec.id), rec, guard, doing=lambda: last_step):
        measure_arm(arm, ...)
    watch.death   # {"rank": 1, "node": "spark-b", "at": "...Z", "elapsed_s": 12.3, "during": "...", ...}
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sparkctl.errors import BenchError, SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.redaction import redact
from sparkctl.sglang.bounds import RunGuard

if TYPE_CHECKING:
    from sparkctl.deploy.runtimes import Runtimes
    from sparkctl.nodes.runtime import Handle, Liveness
    from sparkctl.state.records import DeploymentRecord

log = logging.getLogger("sparkctl.bench")

__all__ = ["RankWatch", "RankWatches"]

_TAIL_LINES = 15
FOLLOW_UNBOUNDED_S = 24 * 3600.0     # a run without a deadline: its log streams' bound on the node


def _utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RankWatch:
    """Liveness of every rank of ``record`` polled while a bench arm is measured (a context manager)."""

    def __init__(self, runtimes: Runtimes, record: DeploymentRecord, guard: RunGuard, *, doing: Callable[[], str],
                 interval_s: float | None = None) -> None:
        self.runtimes = runtimes
        self.record = record
        self.guard = guard
        self.doing = doing
        self.handles = sorted(record.handles, key=lambda h: -h.rank)      # rank 1 first: it has no API
        polls = [getattr(runtimes.for_node(h.node), "poll_interval_s", 0.5) for h in self.handles]
        self.interval_s = interval_s if interval_s is not None else max(0.5, 2 * max(polls, default=0.5))
        self.death: JSONObject | None = None
        self.last_alive: tuple[str, float, str] | None = None     # (UTC, seconds into the run, what ran then)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._last_check = 0.0

    def poll(self) -> None:
        """A look between two steps of the bench (its progress lines), at most every 0.2 s."""
        now = time.monotonic()
        if self.death is None and now - self._last_check >= 0.2:
            self.check()

    def check(self) -> bool:
        """One look at every rank; False (and the guard tripped) when one is dead."""
        with self._lock:
            self._last_check = time.monotonic()
            doing = self.doing() or "setting up the arm"
            alive = self._look()
            if alive:
                self.last_alive = (_utc(), round(self.guard.elapsed(), 1), doing)
            return alive

    def _look(self) -> bool:
        for h in self.handles:
            try:
                live = self.runtimes.for_node(h.node).liveness(h)
            except SparkctlError as exc:         # cannot tell (SSH hiccup): say so, judge at the next poll
                log.warning("rank %s on %s: liveness unknown: %s", h.rank, h.node, exc.message)
                continue
            if not live.alive:
                self._died(h, live)
                return False
        return True

    def _died(self, h: Handle, live: Liveness) -> None:
        if self.death is not None:
            return
        at = _utc()
        elapsed = round(self.guard.elapsed(), 1)
        during = self.doing() or "setting up the arm"
        self.death = {"rank": h.rank, "node": h.node, "deployment": self.record.id, "at": at, "elapsed_s": elapsed,
                      "during": during, "state": live.detail, "exit_code": live.exit_code,
                      "last_alive": None if self.last_alive is None else
                      dict(zip(("at", "elapsed_s", "during"), self.last_alive))}
        seen = (f"; last seen alive at {self.last_alive[0]}, {self.last_alive[1]:.1f} s into the run, during "
                f"{self.last_alive[2]}" if self.last_alive else "; it was dead when the arm was set up")
        tail = self._log_tail(h)
        err = BenchError(f"rank {h.rank} ({h.node}) died during the bench: found dead at {at}, {elapsed:.1f} s into "
                         f"the run, during {during} ({live.detail}){seen}", where=f"deployment {self.record.id}",
                         hint=f"`sparkctl logs --rank {h.rank}` shows why; `sparkctl status` shows the deployment. "
                              "Numbers measured before the death are in the card; none after it",
                         evidence=tail)
        if self.guard.trip(err):
            log.warning("%s", err.message)

    def _log_tail(self, h: Handle) -> str | None:
        try:
            text, _ = self.runtimes.for_node(h.node).read_log(h, 0)
        except Exception:  # noqa: BLE001 - evidence is best-effort; the death itself is already known
            return None
        lines = text.rstrip().splitlines()[-_TAIL_LINES:]
        return redact("\n".join(lines), ()) if lines else None     # ServerArgs' api_key='...' fields masked

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.check():
                return

    def _follow(self) -> None:
        """Each rank's log streamed while the arm is measured (`Runtime.follow`; docker: one `docker logs --follow`
        per rank), so a look reads memory and asks the node only after a quiet spell: a poll over SSH runs the
        docker CLI on the nodes, on the cores the measured engine uses. A stream that cannot start is no failure:
        the looks ask the node as before."""
        run_s = self.guard.run_s
        left = run_s - self.guard.elapsed() if run_s is not None else FOLLOW_UNBOUNDED_S
        for h in self.handles:
            try:
                self.runtimes.for_node(h.node).follow(h, max(1.0, left) + 60.0)
            except SparkctlError as exc:
                log.warning("rank %s on %s: its log is read per look (%s)", h.rank, h.node, exc.message)

    def _unfollow(self) -> None:
        for rt in {id(rt): rt for rt in (self.runtimes.for_node(h.node) for h in self.handles)}.values():
            rt.unfollow()

    def __enter__(self) -> RankWatch:
        self._follow()
        if self.check():
            self._thread = threading.Thread(target=self._loop, name="bench-rank-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        try:
            if self.death is None:
                self.check()
        finally:
            self._unfollow()


class RankWatches:
    """Several deployments watched as one (every replica of a replicated deployment): the first death of any."""

    def __init__(self, watches: list[RankWatch]) -> None:
        self.watches = watches

    @property
    def death(self) -> JSONObject | None:
        return next((w.death for w in self.watches if w.death is not None), None)

    def poll(self) -> None:
        for w in self.watches:
            w.poll()

    def __enter__(self) -> RankWatches:
        for w in self.watches:
            w.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for w in self.watches:
            w.__exit__(*exc)
