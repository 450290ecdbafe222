"""Stopping engines: a deployment's ranks (all nodes at once), what a failed command started, superseded ones.

Every stop is idempotent (a stopped or missing engine stops as a no-op), so a command re-run after a crash
converges. Each reports every node's outcome (`nodes.fanout`), and raises the first error only after all.
"""
from __future__ import annotations

from collections.abc import Collection

from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.observe import observe
from sparkctl.errors import SparkctlError
from sparkctl.nodes.fanout import fan_out, raise_first
from sparkctl.nodes.runtime import Handle, Runtime
from sparkctl.state.ledger import now_iso
from sparkctl.state.records import DeploymentRecord, Status


def sweep_secrets(c: Cluster) -> None:
    """After a kill -9: each node's runtime removes the secret files of every engine of this cluster that no
    longer runs (`Runtime.cleanup_secrets`; a running engine's are kept). A stop removes its own already."""
    rts = c.runtimes("sweep")
    outcomes = fan_out(list(c.inventory.nodes), lambda node: rts.for_node(node).cleanup_secrets())
    for o in outcomes:
        if o.error is not None:
            why = o.error.message if isinstance(o.error, SparkctlError) else f"{type(o.error).__name__}: {o.error}"
            c.reporter.event(f"could not look for stale secret files: {why}", o.item.name)


def stop_engines(c: Cluster, record: DeploymentRecord, *, keep: bool) -> None:
    """Stop every rank of a deployment, all nodes in parallel; `keep` leaves them restartable (containers kept)."""
    rts = c.runtimes(record.id)

    def stop(handle: Handle) -> None:
        rt = rts.for_node(handle.node)
        rt.stop(handle)
        if not keep:
            rt.remove(handle)
        c.reporter.event(f"rank {handle.rank} stopped", handle.node)
    outcomes = fan_out(sorted(record.handles, key=lambda h: h.rank), stop)
    for o in outcomes:
        if o.error is not None and isinstance(o.error, SparkctlError):
            c.reporter.event(f"could not stop rank {o.item.rank}: {o.error.message}", o.item.node)
    raise_first(outcomes)


def stop_started(c: Cluster, started: list[tuple[Runtime, Handle]], *, sweep: str | None = None,
                 running_only: bool = False) -> None:
    """Stop and remove the engines a failed command started (every one, even when one of them refuses).

    `sweep` names the deployment they belong to: afterwards every engine of it still found on the nodes is
    stopped and removed too (`running_only`: only the running ones, for a deployment whose stopped containers
    are kept). `started` is what the command knew of; an interrupt (Ctrl-C, SIGTERM, SIGHUP, or the one a
    parallel `up` raises in each replica's thread) can land between an engine's start and the line that records
    it, and such an engine runs with no handle anywhere. What runs is the truth: the sweep finds it by its rank
    log (process runtime) or its deployment label (Docker), whatever point the interrupt landed at."""
    def stop(item: tuple[Runtime, Handle]) -> None:
        rt, handle = item
        rt.stop(handle)
        rt.remove(handle)
    outcomes = fan_out(sorted(started, key=lambda x: x[1].rank), stop)
    for o in outcomes:
        rank, node = o.item[1].rank, o.item[1].node
        if o.error is None:
            c.reporter.event(f"rank {rank} of the failed deployment stopped", node)
        else:
            c.reporter.event(f"could not stop rank {rank}: {_why(o.error)}", node)
    if sweep is not None:
        _sweep(c, sweep, running_only=running_only)


def _why(exc: BaseException) -> str:
    return exc.message if isinstance(exc, SparkctlError) else f"{type(exc).__name__}: {exc}"


def _sweep(c: Cluster, deployment: str, *, running_only: bool) -> None:
    """Stop (and remove) every engine of `deployment` found on the nodes (see `stop_started`)."""
    unreachable: list[str] = []
    found = [e for e in observe(c, unreachable) if e.handle.deployment == deployment
             and (e.running or not running_only)]
    for where in unreachable:
        c.reporter.event(f"could not look for engines of {deployment} that started unrecorded: {where}")
    rts = c.runtimes(deployment)

    def stop(handle: Handle) -> None:
        rt = rts.for_node(handle.node)
        rt.stop(handle)
        if not running_only:
            rt.remove(handle)
    for o in fan_out(sorted((e.handle for e in found), key=lambda h: h.rank), stop):
        if o.error is None:
            c.reporter.event(f"rank {o.item.rank} of {deployment} stopped (it had started, unrecorded, as the "
                             f"command was interrupted)", o.item.node)
        else:
            c.reporter.event(f"could not stop rank {o.item.rank} of {deployment}: {_why(o.error)}", o.item.node)


def mark_superseded(c: Cluster, old: DeploymentRecord, new_id: str) -> None:
    """The old deployment stays stopped-but-restartable; the ones superseded before it are removed."""
    old = c.ledger.load(old.id)
    if old.status != Status.SUPERSEDED:
        old.status, old.superseded_by, old.stopped = Status.SUPERSEDED, new_id, now_iso()
        c.ledger.save(old)
    remove_superseded(c, kept_for_rollback(c, skip={old.id, new_id}))


def kept_for_rollback(c: Cluster, *, skip: Collection[str] = ()) -> list[DeploymentRecord]:
    """The superseded deployments whose engines are kept restartable (Docker keeps their stopped containers; a
    rollback to one runs it again from its record), except `skip`, newest first.

    Every hand-off removes all but the newest superseded one, and `down` removes its active deployment's and every
    kept one, so walking back from the newest record can stop at the first one whose engines were removed (either
    way): the scan stays a few records long however long the history grows (tests/lifecycle/test_history_bound.py)."""
    out: list[DeploymentRecord] = []
    for dep_id in reversed(c.ledger.index()["history"]):
        if dep_id in skip:
            continue
        try:
            rec = c.ledger.load(dep_id)
        except SparkctlError:
            continue  # a damaged record is reported by the commands that read it; never rewritten here
        if rec.engines_removed:
            break
        if rec.status == Status.SUPERSEDED and rec.handles:
            out.append(rec)
    return out


def remove_superseded(c: Cluster, kept: list[DeploymentRecord]) -> list[str]:
    """Stop and remove the engines of `kept` (what `kept_for_rollback` found) and mark each record so; the ids whose
    engines were removed."""
    removed: list[str] = []
    for rec in kept:
        try:
            stop_engines(c, rec, keep=False)
            rec.engines_removed = now_iso()
            c.ledger.save(rec)
            removed.append(rec.id)
        except SparkctlError as exc:
            c.reporter.event(f"could not remove the engines of {rec.id}: {exc.message}")
    return removed
