"""Stopping engines: a deployment's ranks (all nodes at once), what a failed command started, superseded ones.

Every stop is idempotent (a stopped or missing engine stops as a no-op), so a command re-run after a crash
converges. Each reports every node's outcome (`deploy.fanout`), and raises the first error only after all.
"""
from __future__ import annotations

from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.fanout import fan_out, raise_first
from sparkctl.errors import SparkctlError
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


def stop_started(c: Cluster, started: list[tuple[Runtime, Handle]]) -> None:
    """Stop and remove the engines a failed command started (every one, even when one of them refuses)."""
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
            why = o.error.message if isinstance(o.error, SparkctlError) else f"{type(o.error).__name__}: {o.error}"
            c.reporter.event(f"could not stop rank {rank}: {why}", node)


def mark_superseded(c: Cluster, old: DeploymentRecord, new_id: str) -> None:
    """The old deployment stays stopped-but-restartable; the ones superseded before it are removed."""
    old = c.ledger.load(old.id)
    if old.status != Status.SUPERSEDED:
        old.status, old.superseded_by, old.stopped = Status.SUPERSEDED, new_id, now_iso()
        c.ledger.save(old)
    # Every hand-off prunes all older superseded engines, so walking back from the newest record can stop at
    # the first one already pruned: the scan stays a few records long however long the history grows.
    for dep_id in reversed(c.ledger.index()["history"]):
        if dep_id in (old.id, new_id):
            continue
        try:
            rec = c.ledger.load(dep_id)
        except SparkctlError:
            continue  # a damaged record is reported by the commands that read it; never rewritten here
        if rec.engines_removed:
            break
        if rec.status == Status.SUPERSEDED and rec.handles:
            try:
                stop_engines(c, rec, keep=False)
                rec.engines_removed = now_iso()
                c.ledger.save(rec)
            except SparkctlError as exc:
                c.reporter.event(f"could not remove the engines of {dep_id}: {exc.message}")
