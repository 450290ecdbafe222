"""`down` and `status`: stop everything sparkctl started on the cluster; tell the truth about what runs.

Both read the nodes, not only the ledger: `down` stops the engines it finds (deploy/observe.py) after
settling what a dead controller left (deploy/settle.py); `status` names an `up` in progress (the lock
holder), any deployment whose controller died, and a comparison that did not finish.
"""
from __future__ import annotations

import contextlib

from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.engines import kept_for_rollback, remove_superseded, stop_engines, sweep_secrets
from sparkctl.deploy.observe import leftovers, observe, stop_engine, unrecorded
from sparkctl.deploy.results import (
    DownPlanResult,
    DownResult,
    InProgress,
    InterruptedView,
    StatusResult,
    refusing,
    watcher_of,
)
from sparkctl.deploy.settle import controller_text, interrupted, settle, step_of
from sparkctl.deploy.steps import SETTLE, boundary
from sparkctl.errors import LedgerError
from sparkctl.state.controller import live_lock_holder
from sparkctl.state.ledger import now_iso
from sparkctl.state.records import Status


def down(c: Cluster, *, unfinished_compare: str | None = None) -> DownResult:
    """Under the lock: stop the active deployment on every node (containers removed, logs kept), remove the stopped
    containers superseded deployments kept for rollback, then stop every other engine sparkctl started on the
    cluster (docker: by label; process runtime: by its rank log, pid and start time); `engines` lists each one
    stopped. A no-op when nothing runs."""
    boundary("down", SETTLE, "before")
    settled = settle(c, "down")
    boundary("down", SETTLE, "after")
    engines: list[str] = list(settled.stopped)
    active = c.ledger.active()
    boundary("down", "stop-active", "before")
    if active:
        c.reporter.stage("down", f"stopping {active.id} ({active.profile})")
        rts = c.runtimes(active.id)
        alive = [h for h in active.handles if rts.for_node(h.node).liveness(h).alive]
        stop_engines(c, active, keep=False)
        engines += [f"rank {h.rank} ({h.where} on {h.node}) of {active.id}" for h in alive]
        rec = c.ledger.load(active.id)
        # stopped-and-known-good stays a rollback target; a recovered (never verified) one stays recovered
        rec.status = Status.STOPPED if rec.known_good else rec.status
        rec.stopped = now_iso()
        c.ledger.save(rec)       # one write: no longer active (Ledger.active_id)
    # nothing of an engine outlives `down`: the stopped containers a superseded deployment kept for a quick
    # rollback go too (a rollback to it runs it again from its record and its launch image); the walk back for them
    # passes the deployment just stopped (not yet marked: the mark below stops that walk)
    kept = kept_for_rollback(c, skip={active.id} if active else ())
    removed = remove_superseded(c, kept)
    for dep_id in removed:
        c.reporter.event(f"removed the stopped engines of {dep_id} kept for rollback (a rollback runs it again from "
                         f"its record)")
    if active and len(removed) == len(kept):
        # its engines and every older kept one are removed: later walks back for kept engines stop here instead of
        # reading every older record (a history of up/down cycles made every hand-off and `down` read them all).
        # A removal that failed leaves it unmarked, so the next walk still finds that one; so does a failed write of
        # the mark (a full disk): only a shortcut, it never stops `down` before the rest is stopped.
        with contextlib.suppress(LedgerError):
            rec.engines_removed = now_iso()      # the record saved above, held under the lock
            c.ledger.save(rec)
    boundary("down", "stop-active", "after")
    boundary("down", "stop-rest", "before")
    unreachable: list[str] = []
    for e in observe(c, unreachable):      # whatever still runs: found on the nodes, not in the ledger
        if e.running:
            err = stop_engine(c, e)
            c.reporter.event(f"stopped {e.describe()}" if err is None else f"could not stop {e.describe()}: {err}")
            if err is None:
                engines.append(e.describe())
    for why in unreachable:
        c.reporter.event(f"could not look for engines on {why}: run `sparkctl down` again once it answers")
    sweep_secrets(c)
    boundary("down", "stop-rest", "after")
    c.ledger.sync_index()
    if not active and not engines:
        return DownResult(changed=False, reason="no active deployment and no engine running",
                          settled=settled.lines)
    return DownResult(changed=True, stopped=active.id if active else None, engines=engines,
                      settled=settled.lines)


def plan_down(c: Cluster) -> DownPlanResult:
    """What `down` would do (`down --dry-run`), its steps in order, read from the ledger and the nodes with nothing
    changed: settle what a dead controller left, stop the active deployment (and remove the stopped engines kept
    for rollback), stop every other engine of the cluster found running and the processes that outlived theirs.
    `engines` is what `down` would list as stopped: every engine of this cluster that runs."""
    lines = [f"{SETTLE}: {rec.id} ({rec.profile}) was interrupted during {step_of(rec)} ({controller_text(rec)}): "
             "adopted if it passed its gates and every rank serves, else its engines are stopped"
             for rec in interrupted(c.ledger, locked=False)]
    unreachable: list[str] = []
    running = [e for e in observe(c, unreachable) if e.running]
    active = c.ledger.active()
    if active is None:
        lines.append("stop-active: no-op (no active deployment)")
    else:
        mine = [e.describe() for e in running if e.deployment == active.id]
        lines.append(f"stop-active: stop {active.id} ({active.profile}): "
                     + ("; ".join(mine) if mine else "none of its ranks runs")
                     + (" (containers removed, logs kept; it stays a rollback target)" if active.known_good else ""))
    lines += [f"stop-active: remove the stopped engines of {rec.id} kept for rollback (a rollback runs it again "
              "from its record)" for rec in kept_for_rollback(c)]
    lines += [f"stop-rest: stop {e.describe()}" for e in running if active is None or e.deployment != active.id]
    lines += [f"stop-rest: stop leftover processes of {lo.describe()} (they outlived their engine)"
              for lo in leftovers(c)]
    lines += [f"stop-rest: could not look for engines on {why}" for why in unreachable]
    return DownPlanResult(active=active.id if active else None, plan=lines, engines=[e.describe() for e in running])


def status(c: Cluster, *, unfinished_compare: str | None = None) -> StatusResult:
    """The active deployment: profile, identity, live health per rank, endpoint, since when; plus any
    deployment a dead controller left (`interrupted`), a command holding the lock (`in_progress`) and a
    comparison whose restore did not run (`unfinished_compare`). Read-only."""
    holder = live_lock_holder(c.ledger.root)
    in_progress = None
    if holder:
        history = c.ledger.history()
        newest = c.ledger.load(history[-1]) if history else None
        in_progress = InProgress(command=holder.get("command"), pid=holder.get("pid"), host=holder.get("host"),
                                 since=holder.get("since"))
        if newest is not None and newest.status == Status.RUNNING and newest.controller \
                and newest.controller.pid == holder.get("pid"):
            in_progress.deployment, in_progress.profile, in_progress.stage = newest.id, newest.profile, \
                step_of(newest)
    dead = interrupted(c.ledger, locked=False)
    views: list[InterruptedView] = []
    running = [e for e in observe(c, []) if e.running]     # the records and what runs, read together
    unrecorded(c, running)
    if dead:
        views = [InterruptedView(deployment=r.id, profile=r.profile, stage=step_of(r), detail=controller_text(r),
                                 controller_pid=r.controller.pid if r.controller else None,
                                 ranks_alive=sorted({e.handle.rank for e in running
                                                     if e.deployment in (r.id, r.restoring)}))
                 for r in dead]
    left = [lo.describe() for lo in leftovers(c)]
    watcher = watcher_of(c.ledger.root)
    base = dict(cluster=c.name, emulated=c.inventory.emulated, in_progress=in_progress, interrupted=views,
                unfinished_compare=unfinished_compare, history=len(c.ledger.history()), watcher=watcher,
                leftovers=left)
    active = c.ledger.active()
    if not active:
        return StatusResult(**base, active=None, ok=not dead and not holder and not unfinished_compare and not left)
    found = {e.handle.rank: e.handle for e in running if e.deployment == active.id}
    merged = sorted((found.get(h.rank, h) for h in active.handles), key=lambda h: -h.rank)
    if [h.where for h in merged] != [h.where for h in sorted(active.handles, key=lambda h: -h.rank)]:
        # what runs is the truth, rank by rank: a restore that could not write its record restarted these
        active = active.model_copy(update={"handles": merged})
    healthy, detail, ranks = c.health_of(active)
    return StatusResult(
        **base, active=active.id, profile=active.profile, healthy=healthy,
        ok=healthy and not dead and not unfinished_compare and not left and not refusing(watcher), ranks=ranks,
        endpoint=active.endpoint,
        speculative_algorithm=active.speculative_algorithm, identity=active.identity,
        sglang_version=active.sglang_version, engine=active.engine,
        images=sorted({v.launch_tag or v.engine_tag or "" for v in active.images.values()}
                      or {s.image for s in active.specs if s.image}),
        image_ids=active.image_ids, images_per_node=active.images,
        since=active.handed_off or active.restored_at or active.created, capacity=active.capacity,
        detail=detail)
