"""Settle what a dead controller left (Kubernetes-style: from what is observed on the nodes, not the ledger).

A deployment record is *in progress* while its status is `running` or a restore is under way (`restoring`).
Its controller is dead when the cluster lock is free and the recorded pid is gone or recycled (SIGKILL,
power loss, OOM-killer). `up`, `rollback` and `down` call `settle` under the lock before anything else:

* a deployment whose every verify gate had passed and whose ranks all serve /health 200 is **adopted**:
  the hand-off the controller did not finish is done (it becomes the active deployment);
* anything else it started is **stopped** (it never proved itself), and the record ends `interrupted`;
* engines a dead restore restarted are stopped too; the deployment being restored stays known-good
  (it did not fail: its controller died), stopped and restartable;
* any other running engine that is not the active deployment's is stopped as an orphan.

Each decision prints one line saying which and why, and is written to the record (`settled`).
`status` uses `interrupted()` to report the same without changing anything.

A replicated `up` (deploy/replicated.py) stopped mid-way is settled here too (`settle_replicated`), from its
journal (the same `JournalEntry`): by itself when a signal stopped it, or by the next replicated `up` when its
controller died. Each replica's own deployment is settled by that replica's own `settle`, in its own `up`.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence

from pydantic import BaseModel, Field

from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.engines import mark_superseded, sweep_secrets
from sparkctl.deploy.observe import ObservedEngine, observe, stop_engine, stop_leftovers, unrecorded
from sparkctl.deploy.steps import REPLICA_ATTACH, REPLICA_UP, SETTLE, VERIFY
from sparkctl.errors import SparkctlError
from sparkctl.nodes.fanout import beside
from sparkctl.sglang.responses import SGLangAPIError
from sparkctl.state.controller import controller_alive, live_lock_holder
from sparkctl.state.ledger import Ledger, now_iso
from sparkctl.state.records import DeploymentRecord, Failure, JournalEntry, Status

RECENT = 3   # only the newest records can be in progress: every command that takes the lock settles them first


def in_progress(rec: DeploymentRecord) -> bool:
    return rec.status == Status.RUNNING or rec.restoring is not None


def _ours(rec: DeploymentRecord) -> bool:
    c = rec.controller
    return c is not None and c.pid == os.getpid() and c.host == socket.gethostname()


def interrupted(ledger: Ledger, *, locked: bool) -> list[DeploymentRecord]:
    """Records in progress whose controller is dead. `locked`: the caller holds the cluster lock, so every
    in-progress record but its own is dead; otherwise dead = lock free (or held by another pid) and the
    recorded controller pid provably gone."""
    holder = None if locked else live_lock_holder(ledger.root)
    out = []
    for dep_id in list(reversed(ledger.history()))[:RECENT]:
        rec = ledger.load(dep_id)
        if not in_progress(rec) or _ours(rec):
            continue
        if locked:
            out.append(rec)
            continue
        c = rec.controller
        driven = holder is not None and (c is None or (holder.get("pid") == c.pid and holder.get("host") == c.host))
        if not driven and (c is None or not controller_alive(c)):
            out.append(rec)
    return out


def controller_text(rec: DeploymentRecord) -> str:
    c = rec.controller
    return f"controller pid {c.pid} on {c.host} gone" if c else "controller gone (not recorded)"


def step_of(rec: DeploymentRecord) -> str:
    if rec.restoring:
        return f"restore of {rec.restoring}"
    return next((s.name for s in reversed(rec.steps) if s.status != "ok"), "plan")


class Settled(BaseModel):
    """What settling did: one line per decision, the deployment adopted, the engines stopped."""

    lines: list[str] = Field(default_factory=list)
    adopted: str | None = None
    stopped: list[str] = Field(default_factory=list)


def _healthy(d: Cluster, rec: DeploymentRecord, engines: list[ObservedEngine]) -> bool:
    ranks = {e.handle.rank for e in engines if e.running}
    if ranks != {s.rank for s in rec.specs}:
        return False
    try:
        with d.client(rec.specs[0], rec.api_key_env, timeout=5) as c:
            return c.health() == 200
    except SGLangAPIError:
        return False


def settle(d: Cluster, command: str) -> Settled:
    """Under the cluster lock: adopt or stop what dead controllers left, then stop orphans (module docstring)."""
    say = d.reporter.event
    dead = interrupted(d.ledger, locked=True)
    unreachable: list[str] = []
    # the stale secret files of engines that no longer run are swept beside the look for engines (one round trip
    # per node for both; again at the end when this settle stopped something: a stop removes its own, and this
    # catches one whose removal failed)
    found = [e for e in beside(lambda: observe(d, unreachable), lambda: sweep_secrets(d)) if e.running]
    unrecorded(d, found)
    for why in unreachable:   # the command goes on: its own checks (preflight) name the node properly
        say(f"could not look for leftover engines on {why}")
    lines: list[str] = []
    stopped: list[str] = []
    adopted = None
    active_id = d.ledger.active_id()
    if dead or any(e.deployment != active_id for e in found):
        d.reporter.stage(SETTLE, f"`sparkctl {command}` first settles what a dead controller left")

    def stop_all(engines: list[ObservedEngine], why: str) -> None:
        for e in engines:
            err = stop_engine(d, e)
            line = f"stopped {e.describe()}: {why}" if err is None else f"could not stop {e.describe()}: {err}"
            if err is None:
                stopped.append(e.describe())
            lines.append(line)
            say(line)

    for rec in dead:
        why = controller_text(rec)
        step = step_of(rec)
        mine = [e for e in found if e.deployment == rec.id]
        verified = any(s.name == VERIFY and s.status == "ok" for s in rec.steps)
        if rec.status == Status.RUNNING and verified and _healthy(d, rec, mine):
            line = (f"adopted {rec.id} ({rec.profile}): its {why} after every gate passed; all ranks serve "
                    f"/health 200 (hand-off completed by `sparkctl {command}`)")
            say(line)
            lines.append(line)
            rec.status, rec.handed_off, rec.finished = Status.SUCCESSFUL, now_iso(), now_iso()
            rec.handles = [e.handle for e in sorted(mine, key=lambda e: -e.handle.rank)] or rec.handles
            rec.settled = line
            d.ledger.save(rec)        # the hand-off: this one write makes it the active deployment
            adopted = rec.id
            found = [e for e in found if e.deployment != rec.id]
            continue
        reason = (f"deployment {rec.id} was interrupted ({why}) during {step}; "
                  + ("it never passed its gates" if not verified else "not every rank serves"))
        stop_all(mine, reason)
        restoring = rec.restoring
        if rec.restoring:
            _stop_interrupted_restore(d, rec, rec.restoring, found, why, stop_all)
        if rec.status == Status.RUNNING:
            rec.status = Status.INTERRUPTED
            rec.failure = Failure(step=step, message=f"interrupted: {why} (SIGKILL, power loss or OOM-killer)")
            rec.finished = rec.finished or now_iso()
        rec.settled = (f"settled by `sparkctl {command}` at {now_iso()}: "
                          + (f"stopped {len(mine)} engine(s)" if mine else "no engine of it was running"))
        d.ledger.save(rec)
        found = [e for e in found if e.deployment not in (rec.id, restoring)]
        if not mine:
            line = f"deployment {rec.id} was interrupted ({why}) during {step}; none of its engines runs"
            say(line)
            lines.append(line)
    active_id = d.ledger.active_id()
    if active_id:
        finish_hand_off(d, active_id, say, lines)
        refresh_handles(d, active_id, [e for e in found if e.deployment == active_id], say, lines)
    orphans = [e for e in found if e.deployment != active_id]
    if orphans:
        stop_all(orphans, "an orphan (not the active deployment's engine; its ledger record is not in progress)")
    for line in stop_leftovers(d):       # processes that outlived their engine: none of them serves
        lines.append(line)
        if line.startswith("stopped "):
            stopped.append(line.removeprefix("stopped "))
    if stopped:
        sweep_secrets(d)
    d.ledger.sync_index()
    return Settled(lines=lines, adopted=adopted, stopped=stopped)


def _stop_interrupted_restore(d: Cluster, rec: DeploymentRecord, restoring: str, found: list[ObservedEngine], why: str,
                              stop_all: Callable[[list[ObservedEngine], str], None]) -> None:
    """`rec` died while restoring `restoring` (its `rec.restoring`): the engines that restore restarted were never
    verified and are stopped; the deployment they belong to stays known-good and restartable (stopped, not
    serving)."""
    restarted = [e for e in found if e.deployment == restoring]
    stop_all(restarted, f"restarted by the interrupted restore of {restoring} ({why}), never verified; "
                        f"{restoring} stays known-good and restartable")
    rec.restore_error = rec.restore_error or f"restore interrupted ({why})"
    try:
        prev = d.ledger.load(restoring)
        if prev.status == Status.SUCCESSFUL:     # not serving, still known-good and restartable
            prev.status, prev.stopped = Status.STOPPED, now_iso()
            d.ledger.save(prev)
    except SparkctlError:
        pass
    rec.restoring = None


def refresh_handles(d: Cluster, active_id: str, engines: list[ObservedEngine], say: Callable[[str], None],
                    lines: list[str]) -> None:
    """The active deployment's engines as found on the nodes, written to its record when it names others (a
    restore that ran without the disk restarted them)."""
    if not engines:
        return
    rec = d.ledger.load(active_id)
    by_rank = {e.handle.rank: e.handle for e in engines}
    found = sorted((by_rank.get(h.rank, h) for h in rec.handles), key=lambda h: -h.rank)
    if [h.where for h in found] == [h.where for h in sorted(rec.handles, key=lambda h: -h.rank)]:
        return
    rec.handles = found
    d.ledger.save(rec)
    line = f"recorded the running engines of {active_id}: " + ", ".join(f"rank {h.rank} {h.where}" for h in found)
    say(line)
    lines.append(line)


def finish_hand_off(d: Cluster, active_id: str, say: Callable[[str], None], lines: list[str]) -> None:
    """A hand-off is one write (the new record's status); marking the replaced deployment superseded and pruning
    older engines come after it. A controller killed between the two left the old one `successful`: finish."""
    history = d.ledger.history()
    if active_id not in history:
        return
    for dep_id in reversed(history[:history.index(active_id)][-RECENT:]):
        try:
            rec = d.ledger.load(dep_id)
        except SparkctlError:
            continue
        if rec.status == Status.SUCCESSFUL:
            line = f"marked {rec.id} superseded by {active_id} (its controller died after the hand-off)"
            say(line)
            lines.append(line)
            mark_superseded(d, rec, active_id)


# ---- a replicated `up` --------------------------------------------------------------------------------------
def open_steps(journal: Sequence[JournalEntry]) -> list[JournalEntry]:
    """The steps a journal began and never ended (an intent with no outcome after it, per step and replica):
    where its controller was when it died."""
    open_: dict[tuple[str, int | None], JournalEntry] = {}
    for e in journal:
        key = (e.step, e.replica)
        if e.phase == "intent":
            open_[key] = e
        else:
            open_.pop(key, None)
    return list(open_.values())


def settle_replicated(journal: Sequence[JournalEntry], replicas: Sequence[tuple[int, str]], *, died: bool,
                      serves: Callable[[str], bool], out_of_router: Callable[[str], bool] | None,
                      attach: Callable[[str], object],
                      write: Callable[[str, str, str, int | None, str | None], None]) -> list[int]:
    """What a replicated `up` stopped mid-way leaves, and the one decision about it:

    * when its controller `died`, a replica whose own `up` was cut (replica-up begun, never ended) is left to
      that `up`'s own settle (the replica's `settle`, when the next replicated `up` runs its step): its engines
      may be new and never verified, so it is not put in the router here;
    * every other replica that serves and is out of the router goes back in (a detach or an attach was cut, or
      its `up` ended and the attach never came): none is left out.

    `out_of_router(url)`: True when ours runs and does not list it (None: no router of ours runs, nothing to put
    back). Not `died` (a signal, settled by the `up` itself): every replica's own `up` has returned, having
    stopped or restored what it started, so a replica-up left open (a signal at its `before` boundary) cut
    nothing. `write(step, phase, what, replica, detail)` journals each attach. Returns the replicas put back; an
    attach that fails is journaled "failed" and left to the next `up`."""
    if out_of_router is None:
        return []
    cut = {e.replica for e in open_steps(journal) if e.step == REPLICA_UP} if died else set()
    back = []
    for index, url in replicas:
        if index in cut:
            continue
        try:
            if serves(url) and out_of_router(url):
                what = f"replica {index}: back into the router (the `up` was interrupted)"
                write(REPLICA_ATTACH, "intent", what, index, None)
                attach(url)
                write(REPLICA_ATTACH, "ok", what, index, None)
                back.append(index)
        except SparkctlError as exc:     # the next `up` attaches it; the record says so
            write(REPLICA_ATTACH, "failed", f"replica {index}", index, exc.render())
    return back
