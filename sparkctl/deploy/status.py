"""`down` and `status`: stop everything sparkctl started on the cluster; tell the truth about what runs.

Both read the nodes, not only the ledger: `down` stops the engines it finds (deploy/observe.py) after
settling what a dead controller left (deploy/reconcile.py); `status` names an `up` in progress (the lock
holder) and any deployment whose controller died.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkctl.deploy.rollback import stop_engines
from sparkctl.state.ledger import now_iso
from sparkctl.state.records import Status

if TYPE_CHECKING:
    from sparkctl.deploy.lifecycle import Deployer


def down(d: "Deployer") -> dict[str, Any]:
    """Stop the active deployment on every node (containers removed, logs kept), then every other engine
    sparkctl started on the cluster (docker: by label; process runtime: by its rank log, pid and start time);
    `engines` lists each one stopped. A no-op when nothing runs."""
    from sparkctl.deploy.observe import observe, stop_engine

    with d.ledger.lock("down"):
        settled = d.reconcile("down")
        engines: list[str] = list(settled["stopped"])
        active = d.ledger.active()
        if active:
            d.reporter.stage("down", f"stopping {active.id} ({active.profile})")
            rts = d.runtimes(active.id)
            alive = [h for h in active.handles if rts.for_node(h.node).liveness(h).alive]
            stop_engines(d, active, keep=False)
            engines += [f"rank {h.rank} ({h.where} on {h.node}) of {active.id}" for h in alive]
            rec = d.ledger.load(active.id)
            # stopped-and-known-good stays a rollback target; a recovered (never verified) one stays recovered
            rec.status = Status.STOPPED if rec.known_good else rec.status
            rec.stopped = now_iso()
            d.ledger.save(rec)
            d.ledger.set_active(None)
        unreachable: list[str] = []
        for e in observe(d, unreachable):      # whatever still runs: found on the nodes, not in the ledger
            if e.running:
                err = stop_engine(d, e)
                d.reporter.event(f"stopped {e.describe()}" if err is None else
                            f"could not stop {e.describe()}: {err}")
                if err is None:
                    engines.append(e.describe())
        for why in unreachable:
            d.reporter.event(f"could not look for engines on {why}: run `sparkctl down` again once it answers")
        if not active and not engines:
            return {"changed": False, "reason": "no active deployment and no engine running"}
        return {"changed": True, "stopped": active.id if active else None, "engines": engines,
                "reconciled": settled["lines"]}


def status(d: "Deployer") -> dict[str, Any]:
    """The active deployment: profile, identity, live health per rank, endpoint, since when; plus any
    deployment a dead controller left (`interrupted`) and a command holding the lock (`in_progress`).
    `ok` is False when the active deployment is unhealthy or something was interrupted, or when nothing is
    active and a command is changing the cluster."""
    from sparkctl.deploy.observe import observe
    from sparkctl.deploy.reconcile import controller_text, interrupted, stage_of
    from sparkctl.state.controller import live_lock_holder

    base: dict[str, Any] = {"cluster": d.inventory.cluster.name, "emulated": d.inventory.emulated}
    holder = live_lock_holder(d.ledger.root)
    if holder:
        newest = next((d.ledger.load(i) for i in reversed(d.ledger.index()["history"][-1:])), None)
        base["in_progress"] = {"command": holder.get("command"), "pid": holder.get("pid"),
                               "host": holder.get("host"), "since": holder.get("since")}
        if newest is not None and newest.status == Status.RUNNING and newest.controller \
                and newest.controller.pid == holder.get("pid"):
            base["in_progress"].update(deployment=newest.id, profile=newest.profile, stage=stage_of(newest))
    dead = interrupted(d.ledger, locked=False)
    if dead:
        running = [e for e in observe(d, []) if e.running]
        base["interrupted"] = [
            {"deployment": r.id, "profile": r.profile, "stage": stage_of(r), "detail": controller_text(r),
             "controller_pid": r.controller.pid if r.controller else None,
             "ranks_alive": sorted({e.handle.rank for e in running if e.deployment in (r.id, r.restoring)})}
            for r in dead]
    active = d.ledger.active()
    if not active:
        idx = d.ledger.index()
        return {**base, "active": None, "history": len(idx["history"]), "ok": not dead and not holder}
    healthy, detail, ranks = d.health_of(active)
    return {**base, "active": active.id, "profile": active.profile,
            "healthy": healthy, "ok": healthy and not dead, "ranks": ranks, "endpoint": active.endpoint,
            "speculative_algorithm": active.speculative_algorithm, "identity": active.identity,
            "sglang_version": active.sglang_version,
            "images": sorted({v.get("launch_tag") or v.get("engine_tag", "") for v in active.images.values()}
                             or {s.get("image") for s in active.specs if s.get("image")}),
            "image_ids": active.image_ids, "images_per_node": active.images,
            "since": active.handed_off or active.restored_at or active.created,
            "capacity": active.capacity, "emulated": active.emulated, "detail": detail}
