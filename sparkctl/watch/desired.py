"""What the watcher keeps running, read from the ledger, and one check of it (read-only).

The desired state is whatever the last command a person ran left: the active deployment after `up` or
`rollback`, the replicated deployment (router + replicas), or "down" after `sparkctl down`. A `fingerprint` of
the ledger tells the watcher when someone else changed it (a new record, another active deployment, a stop),
so a user's command always becomes the new desired state. Example::

    desired, fp = read_desired(cluster)
    verdict = check(cluster, desired)        # Verdict(healthy=False, reason="rank-dead", detail="rank 1 ...")
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from sparkctl.deploy import door
from sparkctl.deploy.cluster import Cluster, RankHealth
from sparkctl.deploy.commands import Deployer
from sparkctl.deploy.door import Deployed, Kind, deployed
from sparkctl.deploy.results import ReplicatedStatusResult


@dataclass(frozen=True)
class Desired:
    kind: Kind                         # deploy's door says which (`door.deployed`); the watcher never chooses
    deployment: str | None = None      # kind "deployment": its id
    profile: str | None = None
    target: Deployed | None = field(default=None, compare=False, repr=False)   # how to restart it (the door's)

    @property
    def label(self) -> str:
        if self.kind == "deployment":
            return str(self.deployment)
        if self.kind == "replicated":
            return f"replicated:{self.profile}"
        return "down"


@dataclass
class Verdict:
    """One check: `healthy` None when there is nothing to check (down); `reason` a short category (a metric
    label: rank-dead, rank-stopped, engines-gone, health, router, replica); `detail` the evidence."""

    healthy: bool | None
    reason: str = ""
    detail: str = ""
    ranks: list[RankHealth] = field(default_factory=list)


def read_desired(c: Cluster) -> tuple[Desired, str]:
    """The desired state now, and the ledger's fingerprint (it changes with every command that changes the
    cluster: a new record, another active deployment, a stop, a replicated update)."""
    what = deployed(c)
    rep = what.replicated if what.kind == "replicated" else None
    history = c.ledger.history()
    active = c.ledger.active()
    tail = c.ledger.load(history[-1]) if history else None
    fp = json.dumps([active.id if active else None, tail.id if tail else None, tail.status if tail else None,
                     tail.stopped if tail else None,
                     rep and [rep.profile, rep.status, rep.started]], default=str)
    if rep is not None:
        return Desired("replicated", profile=rep.profile, target=what), fp
    if active is not None:
        return Desired("deployment", deployment=active.id, profile=active.profile, target=what), fp
    return Desired("down", target=what), fp


def _single(c: Cluster, dep_id: str) -> Verdict:
    record = c.ledger.load(dep_id)
    healthy, detail, ranks = c.health_of(record)
    if healthy:
        return Verdict(True, "", detail, ranks)
    dead = [r for r in ranks if not r.alive]
    if any(r.state.startswith("stopped") for r in dead):   # first: a stopped engine still holds its memory,
        reason = "rank-stopped"                             # even once its peer has exited (engines-gone)
    elif ranks and len(dead) == len(ranks):
        reason = "engines-gone"
    elif dead or len(ranks) < len(record.specs):
        reason = "rank-dead"
    else:
        reason = "health"
    return Verdict(False, reason, detail, ranks)


def _replicas(c: Cluster) -> Verdict:
    st = door.status(Deployer(c.inventory, c.reporter, c.ledger))
    if not isinstance(st, ReplicatedStatusResult):          # it went down or became one group since the poll
        return Verdict(False, "router", "router not running (no replicated deployment now)")
    if st.healthy:
        return Verdict(True, "", f"router ready; {len(st.replicas)} replicas healthy")
    router = st.router
    if router is None or not router.ready:
        return Verdict(False, "router", "router " + ("not running" if router is None else "not ready"))
    bad = [r for r in st.replicas if not (r.healthy and r.in_router)]
    return Verdict(False, "replica", "; ".join(
        f"replica {r.index} {'unhealthy' if not r.healthy else 'not in the router'}" for r in bad) or "unhealthy",
        [rank for r in bad for rank in r.ranks])


def check(c: Cluster, desired: Desired) -> Verdict:
    """Process state of every rank (stopped or zombie = not running), rank 0's /health, and for a replicated
    deployment the router and its workers. Read-only."""
    if desired.kind == "deployment" and desired.deployment:
        return _single(c, desired.deployment)
    if desired.kind == "replicated":
        return _replicas(c)
    return Verdict(None, "", "desired state: down (nothing should run)")
