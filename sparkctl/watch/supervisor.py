"""The supervisor loop: observe -> decide -> act, every `interval_s`, through deploy's one door. Each poll reads the
desired state from the ledger (a user's `up`, `rollback` or `down` since the last poll becomes the new one:
`desired.read_desired`'s fingerprint changed) and checks it (`desired.check`). On a failure it acts under the cluster
lock, like every command, after reading the ledger and checking once more there:

* it acts once `fail_checks` checks within `fail_window_s` have failed (one slow check is not a dead rank).
* a TP group is restarted as a whole by `up` of the deployment **as recorded** (door's `Deployed.restart`: the
  record's profile, every rank rendered again and compared with the record first): stop what is left (kept
  restartable), boot ranks N-1 ... 1 then 0, warm-up, every gate, hand-off; a group that fails them is restored by
  that `up` (its own undo). A replicated deployment goes through the replicated `up` of the profile its record
  kept (a replica that fails is redeployed alone; a router that is gone is started again). What cannot be started
  exactly as recorded (a secret's variable missing here, an inventory changed) is refused loudly (log, status,
  metrics, webhook), nothing started, and retried after the backoff without counting toward the crash loop.
* failed attempts back off (`backoff_s`, doubling up to `backoff_max_s`); a restart that served and died again
  within `window_s` is a failed one too (flapping); `max_failures` failures within `window_s` are a crash loop:
  the watcher rolls back (`Deployer.rollback`, never to the launch identity that keeps failing, never without the
  failing deployment's secrets), then stops acting and says why, and keeps checking and reporting until a user's
  command gives it a new desired state.
* before each restart, before the lock, the page cache is dropped where `prepare` granted it (watch/caches.py);
  it and the metrics' node reads run within `node_deadline_s` in total (watch/deadline.py).
* the cluster lock is held for the restart or rollback itself only: webhook events are queued and sent by the
  outbox's thread (watch/outbox.py), so a hook that hangs never holds the lock, a check, or a user's command.
* a restart that preflight refuses changed nothing (nodes not ready): backed off, not counted as a crash loop.
* a lock held by a user's command is never fought: the watcher waits and reads the desired state again after it.
* a poll that cannot read the cluster (a damaged ledger, a node not answering) is said once and decides nothing.

SIGINT/SIGTERM/SIGHUP reach it as `Interrupted` (cli/signals.py): between polls it ends at once; during a restart,
`up`'s own path stops what it started and restores the previous deployment, then the watcher ends.
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkctl.config.inventory import Inventory
from sparkctl.deploy import door
from sparkctl.deploy.commands import Deployer
from sparkctl.deploy.inputs import unresolved_secrets
from sparkctl.deploy.progress import Reporter
from sparkctl.deploy.results import UpResult
from sparkctl.errors import LockHeldError, PreflightError, RestartRefusedError, SparkctlError
from sparkctl.jsontypes import JSONObject, JSONValue
from sparkctl.nodes import procfs
from sparkctl.state.controller import live_lock_holder
from sparkctl.state.ledger import now_iso
from sparkctl.state.watchfile import WatchState, exclusive, host, save_watch
from sparkctl.watch.deadline import NodeActions, within
from sparkctl.watch.desired import Desired, Verdict, check, read_desired
from sparkctl.watch.outbox import Outbox

if TYPE_CHECKING:
    from sparkctl.deploy.results import ReplicatedUpResult
    from sparkctl.state.records import DeploymentRecord
    from sparkctl.watch.metrics import WatchMetrics
    from sparkctl.watch.notify import Notifier


# What the watcher does on its own; tests/watch/test_watch_matrix.py is generated from this list.
ACTIONS: dict[str, str] = {
    "restart": "a failed group restarted: the recorded deployment through door's restart (`_attempt`), or refused",
    "flap": "a restart that died again within the window: counted toward the crash loop, backed off (`_flapped`)",
    "give-up": "the crash loop's rollback, then no more action until a user's command (`_give_up`)",
}


@dataclass
class WatchOptions:
    interval_s: float = 5.0          # between two checks
    backoff_s: float = 10.0          # after a failed restart; doubles with each failure in a row
    backoff_max_s: float = 300.0
    max_failures: int = 3            # this many failed restarts within `window_s` is a crash loop
    window_s: float = 600.0          # a restart that dies within it counts as a failed one (flapping)
    boot_timeout_s: float | None = None     # for each restart's boot (default: the profile's)
    fail_checks: int = 2             # failed checks within `fail_window_s` before a restart (one slow check is not)
    fail_window_s: float = 60.0
    node_deadline_s: float = 30.0    # a node action in total: the page-cache drop, one check's metrics reads


class Watcher:
    """One cluster's supervisor. `metrics` and `notifier` are optional sinks (watch/metrics.py, watch/notify.py);
    the notifier's events go through an `Outbox` (watch/outbox.py): sent off this thread, never under the lock.

    Example::

        Watcher(resolve_inventory(None), Reporter(), WatchOptions(interval_s=2)).run()
    """

    def __init__(self, inventory: Inventory, reporter: Reporter, opts: WatchOptions, *,
                 metrics: WatchMetrics | None = None, notifier: Notifier | None = None) -> None:
        self.d = Deployer(inventory, reporter)
        self.c = self.d.cluster
        self.r = reporter
        self.opts = opts
        self.metrics = metrics
        self.outbox = Outbox(notifier, reporter) if notifier is not None else None
        self.state = WatchState(pid=os.getpid(), host=host(), start_ticks=procfs.start_ticks(os.getpid()),
                                since=now_iso(), interval_s=opts.interval_s)
        self.desired = Desired("down")
        self.baseline = ""
        self.failed_at: list[float] = []      # monotonic times of failed restarts (the crash-loop window)
        self.in_a_row, self.next_attempt = 0, 0.0       # failures in a row (the backoff's exponent); when next
        self.detected: float | None = None    # monotonic time the current failure was first seen
        self.failed_checks: list[float] = []  # monotonic times of the failed checks of the current failure
        self.restarted_at: float | None = None   # monotonic time of the watcher's last successful restart
        self.waiting_on: int | None = None    # pid of the lock holder we said we wait for
        self.poll_error: str | None = None    # the last poll's own failure, said once
        self.said_refused: str | None = None  # the last refusal said (said again only when it changes)
        self.nodes = NodeActions(self.c.inventory, self._say, node_deadline_s=opts.node_deadline_s)
        self.give_up_due: Verdict | None = None   # a crash loop reached while the lock was held: given up next poll

    # -- the loop ----------------------------------------------------------------------------------------------
    def run(self, *, polls: int | None = None) -> None:
        """Poll until interrupted (or `polls` times). LockHeldError (exit 5) when the cluster is already watched."""
        with exclusive(self.c.ledger.root):
            try:         # from the lock on: however it ends (a signal at any point), it says it stopped
                self.begin()
                n = 0
                while polls is None or n < polls:
                    self._poll_once()
                    n += 1
                    if polls is None or n < polls:
                        time.sleep(self.opts.interval_s)
            finally:
                self.end()

    def begin(self) -> None:
        """Read the desired state and say what is watched (`run` calls it under the watcher's lock)."""
        if self.metrics is not None:
            self.state.metrics = self.metrics.url
        self.desired, self.baseline = read_desired(self.c)
        self.state.desired = self.desired.label
        self._save()
        self._say(f"watching cluster {self.c.name}: desired state {self.desired.label}; a check every "
                  f"{self.opts.interval_s:g}s, a restart after {self.opts.fail_checks} failed checks within "
                  f"{self.opts.fail_window_s:g}s, crash loop at {self.opts.max_failures} failed (or died "
                  f"again) restarts within {self.opts.window_s:g}s"
                  + (f"; metrics at {self.metrics.url}" if self.metrics else ""))

    def end(self) -> None:
        """Say it stopped (in its file too), and give the queued webhook events their last deadline."""
        self.state.stopped = now_iso()
        self._save()
        self._say("watcher stopped")
        if self.outbox is not None:
            self.outbox.close()

    def _poll_once(self) -> None:
        """One poll; a known failure of the poll itself (the ledger damaged, a node not answering over SSH) is
        reported once (and again when it changes) and the watcher goes on without acting: it decides nothing from
        what it could not read."""
        try:
            self.poll()
        except SparkctlError as exc:
            line = exc.render().splitlines()[0]
            self.state.healthy, self.state.detail, self.state.last_check = None, line, now_iso()
            self._save()
            if line != self.poll_error:
                self.poll_error = line
                self._say(f"cannot check the cluster now: {exc.render()}")
            return
        if self.poll_error is not None:
            self.poll_error = None
            self._say("checking again")

    def poll(self) -> None:
        holder = live_lock_holder(self.c.ledger.root)
        if holder and holder.get("pid") != os.getpid():
            self._wait_on(holder)
            return
        self.waiting_on = None
        desired, fp = read_desired(self.c)
        if fp != self.baseline:
            self._adopt(desired, fp)
        verdict = check(self.c, self.desired)
        new_failure = verdict.healthy is False and self.detected is None
        self._checked(verdict)
        self.nodes.read(self.metrics)
        if verdict.healthy is not False:
            return
        if (new_failure and self._flapped(verdict)) or self.state.gave_up:
            return
        if self.give_up_due is not None:        # the crash loop was reached while a command held the lock
            self._locked(lambda: self._give_up(self.give_up_due or verdict))
            return
        if self.state.gave_up or time.monotonic() < self.next_attempt:
            return
        if len(self.failed_checks) < self.opts.fail_checks:
            return                      # one missed check is a slow rank, not a dead one: look again first
        self.nodes.drop_caches()        # a node action: before the lock, with its own deadline
        self._locked(self._attempt)

    # -- deciding ----------------------------------------------------------------------------------------------
    def _checked(self, v: Verdict) -> None:
        now = time.monotonic()
        self.state.healthy, self.state.detail, self.state.last_check = v.healthy, v.detail, now_iso()
        if self.metrics is not None:
            self.metrics.check(self.c, self.desired, v, gave_up=self.state.gave_up is not None)
        lines = []
        if v.healthy is False:
            span = max(self.opts.fail_window_s, 2 * self.opts.fail_checks * self.opts.interval_s)   # N fit in it
            self.failed_checks = [t for t in self.failed_checks if now - t <= span] + [now]
        else:
            self.failed_checks = []
        if v.healthy is False and self.detected is None:
            self.detected = now
            self.state.detected_at = now_iso()
            lines.append(f"detected: {self.desired.label} is not serving ({v.reason}): {v.detail}")
            if self.state.gave_up:
                lines.append(f"not acting: {self.state.gave_up}")
            elif self.opts.fail_checks > 1:
                lines.append(f"acting once {self.opts.fail_checks} checks within {self.opts.fail_window_s:g}s "
                             f"have failed (a rank that is only slow is left alone)")
        elif v.healthy is not False and self.detected is not None:
            took = round(now - self.detected, 3)
            self.detected = None
            if v.healthy:
                self.state.recovered_at, self.state.time_to_recover_s = now_iso(), took
                self.state.refused = self.said_refused = None      # serving again: nothing is refused now
                if self.metrics is not None:
                    self.metrics.refused(False)
                    self.metrics.recovered(took)
                lines.append(f"{self.desired.label} serves again, {took:.1f}s after the failure was seen")
        self._save()
        for line in lines:
            self._say(line)

    def _flapped(self, v: Verdict) -> bool:
        """A failure seen within `window_s` of the watcher's own successful restart: that restart did not hold,
        and it counts as a failed one (backoff, crash loop). True when the watcher gave up on it."""
        if self.restarted_at is None or self.state.gave_up:
            return False
        now = time.monotonic()
        lasted = now - self.restarted_at
        if lasted > self.opts.window_s:
            return False
        self.restarted_at = None
        self.state.flaps += 1
        self._counted_failure(v, f"{self.desired.label} died {lasted:.1f}s after the watcher's restart (flapping)",
                              "died-after-restart")
        return self.state.gave_up is not None

    def _wait_on(self, holder: JSONObject) -> None:   # said once per holder
        if self.waiting_on != holder.get("pid"):
            self.waiting_on = holder.get("pid")
            self._say(f"waiting: `sparkctl {holder.get('command')}` (pid {holder.get('pid')} on {holder.get('host')}) "
                      f"holds the cluster lock; the desired state is read again once it is done")

    def _adopt(self, desired: Desired, fp: str) -> None:
        """Someone else changed the cluster (a user's up, rollback, down, repair): that is the desired state now,
        and whatever the watcher had decided before (backoff, crash loop, give-up, a refusal) is forgotten."""
        before = self.desired.label
        self.desired, self.baseline = desired, fp
        self.failed_at.clear()
        self.failed_checks.clear()
        self.in_a_row, self.next_attempt, self.detected, self.restarted_at = 0, 0.0, None, None
        self.give_up_due = None
        was_given_up = self.state.gave_up is not None
        self.state.gave_up = self.state.refused = self.said_refused = None
        self.state.desired = desired.label
        self._save()
        if self.metrics is not None:
            self.metrics.refused(False)
        if was_given_up:
            self._say("a command changed the cluster after the watcher gave up: acting again")
        if desired.label != before:
            self._act_line(f"followed a command: desired state {before} -> {desired.label}")

    # -- acting ------------------------------------------------------------------------------------------------
    def _locked(self, action: Callable[[], None]) -> None:
        """Run `action` under the cluster lock (a held lock: wait for the next poll). Only the ledger and the
        action itself run under it: events are queued (sent by the outbox), node reads happen before."""
        try:
            lock = self.c.ledger.lock("watch")
            lock.__enter__()
        except LockHeldError as exc:
            self._say(f"waiting: {exc.message}")
            return
        except SparkctlError as exc:        # the state directory full or unwritable: no command could act either
            self.in_a_row += 1
            self._act_line(f"could not act on {self.desired.label}: {exc.message.splitlines()[0]}"
                           + (f" ({exc.hint})" if exc.hint else ""))
            self._back_off(time.monotonic(), "nothing was started")
            return
        try:
            desired, fp = read_desired(self.c)          # under the lock: what a command did just before counts
            if fp != self.baseline:
                self._adopt(desired, fp)
                return
            action()
        finally:
            lock.__exit__(None, None, None)

    def _attempt(self) -> None:
        """Under the lock: check once more (within the node deadline), then restart (or refuse, or count)."""
        done, v = within(self.opts.node_deadline_s, lambda: check(self.c, self.desired))
        if v is None or v.healthy is not False:
            if not done:
                self._say(f"the check under the lock took over {self.opts.node_deadline_s:g}s: not acting now")
            return
        label = self.desired.label
        self.state.restarts += 1
        self._act_line(f"restarting {label} ({v.reason}): the whole group in order, with up's gates "
                       f"(attempt {self.in_a_row + 1})")
        t0 = time.monotonic()
        try:
            result = self._up_again()
        except LockHeldError as exc:        # a replica's own lock (a command on it): wait, like for the cluster's
            self._after_own_action(success=False)
            self.state.restarts -= 1
            self._say(f"waiting: {exc.message}")
            return
        except RestartRefusedError as exc:  # it cannot be started as recorded: nothing was changed; say so loudly
            self.state.restarts -= 1
            self._refused(v, exc)
            return
        except PreflightError as exc:       # nothing was changed: the nodes are not ready (a fabric still down
            self._after_own_action(success=False)      # after a reboot); back off, but it is no crash loop
            self._failed(v, exc, counts=False)
            return
        except SparkctlError as exc:
            self._after_own_action(success=False)
            self._failed(v, exc)
            return
        self._after_own_action(success=True)
        self.in_a_row = 0
        self.restarted_at = time.monotonic()
        self.state.refused = self.said_refused = None
        took = time.monotonic() - t0
        new = getattr(result, "deployment", None) or label
        if self.metrics is not None:
            self.metrics.restarted(v.reason, "ok")
            self.metrics.refused(False)
        self._checked(check(self.c, self.desired))     # serving again: the time to recover is known now
        self._act_line(f"restarted {label} as {new} ({v.reason}) in {took:.1f}s")
        self._notify("restart", v, outcome="ok", deployment=new, seconds=round(took, 3))

    def _up_again(self) -> UpResult | ReplicatedUpResult:
        """Restart what is desired the way deploy's door says it is restarted (`door.Deployed.restart`: exactly
        the recorded deployment, or RestartRefusedError)."""
        target = self.desired.target
        if target is None:           # a desired state not read from the ledger: read it now
            target = door.deployed(self.d)
        return target.restart(boot_timeout_s=self.opts.boot_timeout_s, node_deadline_s=self.opts.node_deadline_s)

    def _after_own_action(self, *, success: bool) -> None:
        """The ledger after the watcher's own action is the new baseline (its own records are not a user's
        command). A failed restart whose undo left nothing active keeps the old target: that is still desired."""
        desired, self.baseline = read_desired(self.c)
        if success or desired.kind != "down":
            self.desired = desired
            self.state.desired = desired.label

    def _refused(self, v: Verdict, exc: RestartRefusedError) -> None:
        """A restart that cannot start what was deployed: nothing started, loudly (log, status, metrics, webhook),
        then a backoff (a mount may come back) that does not count toward the crash loop (a rollback would not
        start what was deployed either). Said again only when the reason changes: the output stays bounded."""
        first = exc.message.splitlines()[0]
        self.in_a_row += 1
        self.state.refused = f"{first} ({exc.hint})" if exc.hint else first
        if self.metrics is not None:
            self.metrics.restarted(v.reason, "refused")
            self.metrics.refused(True, cause=exc.cause)
        if self.state.refused != self.said_refused:
            self.said_refused = self.state.refused
            self._act_line(f"REFUSED to restart {self.desired.label} ({exc.cause}): {self.state.refused}; nothing "
                           f"was started")
            self._notify("refused", v, outcome="refused", cause=exc.cause, error=first)
        else:               # one short line per attempt (as its `restarting` line): status's last action agrees
            self._act_line(f"REFUSED to restart {self.desired.label} again ({exc.cause}), for the reason above; "
                           f"nothing was started")
        self._back_off(time.monotonic(), "the restart is refused until what is missing is back")

    def _failed(self, v: Verdict, exc: SparkctlError, *, counts: bool = True) -> None:
        """A failed restart: backoff; `counts` toward the crash loop unless preflight refused it (nothing was
        changed, and rolling back cannot help nodes that are not ready: the watcher keeps trying, backing off)."""
        self.state.failures += 1
        first = exc.message.splitlines()[0]
        if counts:
            self._counted_failure(v, f"restart of {self.desired.label} failed: {first}", "failed", error=first)
            return
        self.in_a_row += 1
        self._act_line(f"restart of {self.desired.label} failed: {first} (preflight: nothing changed; not counted "
                       f"toward the crash loop)")
        if self.metrics is not None:
            self.metrics.restarted(v.reason, "preflight-failed")
        self._notify("restart", v, outcome="preflight-failed", error=first)
        self._back_off(time.monotonic(), "")

    def _counted_failure(self, v: Verdict, line: str, outcome: str, *, error: str | None = None) -> None:
        """One failure of the crash loop (a failed restart, or a restart that died within the window): said,
        counted, notified; then the backoff, or at `max_failures` within `window_s` the rollback and give-up."""
        now = time.monotonic()
        if outcome != "failed":
            self.state.failures += 1
        self.in_a_row += 1
        self.failed_at = [t for t in self.failed_at if now - t <= self.opts.window_s] + [now]
        self._act_line(line)
        if self.metrics is not None:
            self.metrics.restarted(v.reason, outcome)
        self._notify("restart", v, outcome=outcome, error=error or line)
        if len(self.failed_at) >= self.opts.max_failures:
            self.give_up_due = v
            if outcome == "failed":
                self._give_up(v)               # already under the lock (the failed restart's)
            else:
                self._locked(lambda: self._give_up(v))
            if self.give_up_due is None:
                return
        self._back_off(now, "")

    def _back_off(self, now: float, why: str) -> None:
        n = max(self.in_a_row, len(self.failed_at), 1)
        delay = min(self.opts.backoff_s * 2 ** (n - 1), self.opts.backoff_max_s)
        self.next_attempt = now + delay
        self._say(f"next attempt in {delay:g}s ({len(self.failed_at)} of {self.opts.max_failures} failed restarts "
                  f"within {self.opts.window_s:g}s before the watcher rolls back and stops acting)"
                  + (f"; {why}" if why else ""))

    def _give_up(self, v: Verdict) -> None:
        self.give_up_due = None
        label = self.desired.label
        n = len(self.failed_at)
        if self.desired.kind == "deployment":
            failing = self.c.ledger.load(str(self.desired.deployment))
            self._say(f"crash loop: {n} failed restarts of {label} within {self.opts.window_s:g}s: rolling back")
            unset, changed = unresolved_secrets(failing)
            unset = sorted(set(unset) | set(door.missing_secrets(failing)))
            if unset or changed:   # whatever it rolls back to would start here without them: nothing weaker starts
                rolled = "not rolled back: " + "; ".join(
                    ([f"{', '.join(unset)} not set in the watcher's environment (the deployment was made with "
                      f"them; anything started here would lack them)"] if unset else [])
                    + ([f"{', '.join(changed)} set to another value than the deployment was made with"]
                       if changed else []))
                self.state.refused = rolled
                if self.metrics is not None:
                    self.metrics.refused(True, cause="secret-missing" if unset else "secret-changed")
            else:
                rolled = self._roll_back(failing)
        else:
            rolled = "not rolled back (a replicated deployment keeps no known-good history)"
        self.state.gave_up = (f"crash loop: {n} failed restarts of {label} within {self.opts.window_s:g}s; {rolled}; "
                              f"the watcher no longer acts (it keeps checking) until a `sparkctl up`, `rollback` or "
                              f"`down` sets a new desired state")
        self._checked(check(self.c, self.desired))      # what runs after the rollback, seen before the line
        self._act_line(f"gave up: {self.state.gave_up}")
        self._notify("give-up", v, outcome=rolled)

    def _roll_back(self, failing: DeploymentRecord) -> str:
        """The crash loop's rollback (never to the launch identity that keeps failing); what it did, in a phrase."""
        try:
            res = door.rollback(self.d, None, door.UpRequest(boot_timeout_s=self.opts.boot_timeout_s),
                                confirm=door.proceed, failing=failing)
            # a rollback with no target is one group's (the door refuses it for replicas, which keep no history)
            what = res.deployment if isinstance(res, UpResult) else res.endpoint
            rolled = f"rolled back to {what} ({res.profile})"
            self.state.rollbacks += 1
            if self.metrics is not None:
                self.metrics.rolled_back("ok")
        except SparkctlError as exc:
            rolled = f"the rollback failed: {exc.message.splitlines()[0]}"
            if self.metrics is not None:
                self.metrics.rolled_back("failed")
        self._after_own_action(success=True)
        return rolled

    # -- reporting ---------------------------------------------------------------------------------------------
    def _say(self, message: str) -> None:
        self.r.stage("watch", message)

    def _act_line(self, message: str) -> None:
        """Record an action, then say it (what was said is on disk: `status` agrees with the line)."""
        self.state.last_action, self.state.last_action_at = message, now_iso()
        self._save()
        self._say(message)

    def _save(self) -> None:
        try:
            save_watch(self.c.ledger.root, self.state)
        except SparkctlError as exc:      # a full state directory: say so, keep supervising
            self.r.event(f"note: could not write the watcher's state: {exc.message}")

    def _notify(self, event: str, v: Verdict, **extra: JSONValue) -> None:
        """Queue one webhook event (watch/outbox.py sends it off this thread: never a wait, never under the lock)."""
        if self.outbox is None:
            return
        key_env: tuple[str, ...] = ()
        if self.desired.kind == "deployment":
            with contextlib.suppress(SparkctlError):
                key_env = tuple(filter(None, [self.c.ledger.load(str(self.desired.deployment)).api_key_env]))
        self.outbox.put({"event": event, "cluster": self.c.name, "desired": self.desired.label,
                         "reason": v.reason, "detail": v.detail, "restarts": self.state.restarts,
                         "failures": self.state.failures, "flaps": self.state.flaps, "gave_up": self.state.gave_up,
                         "refused": self.state.refused, "at": now_iso(), **extra}, secret_env=key_env)
