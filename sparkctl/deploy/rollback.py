"""Rollback: stop a deployment's engines, restore a stopped one, prune superseded ones, pick a rollback target.

The lifecycle (`deploy/lifecycle.py`) calls these when `up` fails after the previous deployment was stopped
(restore), when it hands off (prune), and for `sparkctl rollback` / `down`. Every outcome is written to the
ledger: a restore that fails says why in the failed deployment's record (`restore_error`).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, TypeVar

from sparkctl.config.profile import Profile
from sparkctl.deploy.boot import boot
from sparkctl.deploy.gates import run_gates
from sparkctl.deploy.image_stage import LaunchImage
from sparkctl.deploy.plan import launch_identity
from sparkctl.deploy.progress import Reporter
from sparkctl.errors import ConfigError, DeployError, SparkctlError, interrupt_name
from sparkctl.nodes.runtime import Handle, Runtime
from sparkctl.state.ledger import Ledger, now_iso
from sparkctl.state.records import DeploymentRecord, RestoreEntry, Status

if TYPE_CHECKING:
    from sparkctl.deploy.lifecycle import Deployer

T = TypeVar("T")


def on_every(items: Iterable[T], fn: Callable[[T], object]) -> None:
    """Run `fn` on every item at once (one thread each: nodes are few, each call waits on SSH or a process)."""
    items = list(items)
    with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
        list(pool.map(fn, items))


def stop_engines(d: "Deployer", record: DeploymentRecord, *, keep: bool) -> None:
    """Stop every rank of a deployment, all nodes in parallel; `keep` leaves them restartable (containers kept)."""
    rts = d.runtimes(record.id)

    def stop(handle: Handle) -> None:
        rt = rts.for_node(handle.node)
        rt.stop(handle)
        if not keep:
            rt.remove(handle)
        d.reporter.event(f"rank {handle.rank} stopped", handle.node)
    on_every(sorted(record.handles, key=lambda h: h.rank), stop)


def stop_started(reporter: Reporter, started: list[tuple[Runtime, Handle]]) -> None:
    """Stop and remove the engines a failed `up` started (every one, even when one of them refuses)."""
    for rt, handle in sorted(started, key=lambda x: x[1].rank):
        try:
            rt.stop(handle)
            rt.remove(handle)
            reporter.event(f"rank {handle.rank} of the failed deployment stopped", handle.node)
        except SparkctlError as exc:
            reporter.event(f"could not stop rank {handle.rank}: {exc.message}", handle.node)


def mark_superseded(d: "Deployer", old: DeploymentRecord, new_id: str) -> None:
    """The old deployment stays stopped-but-restartable; the ones superseded before it are removed."""
    old = d.ledger.load(old.id)
    old.status, old.superseded_by, old.stopped = Status.SUPERSEDED, new_id, now_iso()
    d.ledger.save(old)
    # Every hand-off prunes all older superseded engines, so walking back from the newest record can stop at
    # the first one already pruned: the scan stays a few records long however long the history grows.
    for dep_id in reversed(d.ledger.index()["history"]):
        if dep_id in (old.id, new_id):
            continue
        try:
            rec = d.ledger.load(dep_id)
        except SparkctlError:
            continue  # a damaged record is reported by the commands that read it; never rewritten here
        if rec.engines_removed:
            break
        if rec.status == Status.SUPERSEDED and rec.handles:
            try:
                stop_engines(d, rec, keep=False)
                rec.engines_removed = now_iso()
                d.ledger.save(rec)
            except SparkctlError as exc:
                d.reporter.event(f"could not remove the engines of {dep_id}: {exc.message}")


def recorded_launch(record: DeploymentRecord) -> LaunchImage | None:
    """The launch image a deployment's ranks ran (recorded by its image-verify step), or None."""
    tags = {v.get("launch_tag") for v in record.images.values()} - {None}
    if not tags or record.launch_doc is None:
        return None
    return LaunchImage(str(tags.pop()), record.launch_doc)


@dataclass(frozen=True)
class RestoreOutcome:
    restored: str | None      # the deployment serving again, or None
    error: str | None = None  # why not (recorded in the failed deployment's record)


def restore(d: "Deployer", previous: DeploymentRecord, failed: DeploymentRecord) -> RestoreOutcome:
    """Bring a stopped known deployment back: restart its ranks, wait ready, verify."""
    d.reporter.stage("rollback", f"restoring {previous.id} ({previous.profile})")
    started: list[tuple[Runtime, Handle]] = []
    try:
        profile = Profile.model_validate(previous.profile_data)
        result = d.render(profile)
        launch = recorded_launch(previous)
        if launch_identity(result, launch.tag if launch else None) != previous.identity:
            d.reporter.event("note: re-rendered launch identity differs from the record "
                             "(inventory or secrets changed); restoring the re-rendered launch")
        rts = d.runtimes(previous.id)
        if launch is not None:
            rts.bind_launch(launch)      # the ranks run the launch image they ran before

        def record_handle(spec: object, handle: Handle | None) -> None:
            # The restarted engine's handle goes to the record at once: after a SIGKILL here, the next command
            # finds it (docker also by label). The status is not touched: restored engines are unverified.
            if handle is not None:
                rec = d.ledger.load(previous.id)
                rec.handles = [h for h in rec.handles if h.rank != handle.rank] + [handle]
                d.ledger.save(rec)
        booted = boot(result.specs, rts.for_node, previous.id, d.reporter,
                      timeout_s=profile.lifecycle.boot_timeout_s, started=started,
                      ready_probe=d.health_probe(result.specs[0], profile.api.api_key_env), on_start=record_handle)
        with d.client(result.specs[0], profile.api.api_key_env) as client:
            gates = run_gates(profile, client, booted.watches)
        bad = [g for g in gates if not g.ok]
        for g in bad:
            d.reporter.event(f"FAIL {g.name}: {g.evidence}")
        prev = d.ledger.load(previous.id)
        prev.handles = booted.handles
        prev.status = Status.SUCCESSFUL if not bad else Status.FAILED
        prev.restored_at, prev.restored_after = now_iso(), failed.id
        prev.restores.append(RestoreEntry(at=now_iso(), after=failed.id, gates=[g.as_dict() for g in gates]))
        d.ledger.save(prev)
        if bad:
            reason = "restored deployment failed gates: " + "; ".join(f"{g.name}: {g.evidence}" for g in bad)
            d.reporter.event(reason)
            stop_started(d.reporter, started)
            d.ledger.set_active(None)
            return RestoreOutcome(None, reason)
        d.ledger.set_active(previous.id)
        d.reporter.event(f"restored {previous.id}: serving again at {prev.endpoint}")
        return RestoreOutcome(previous.id)
    except (SparkctlError, KeyboardInterrupt) as exc:
        reason = exc.render() if isinstance(exc, SparkctlError) else f"interrupted ({interrupt_name(exc)})"
        d.reporter.event(f"restore of {previous.id} failed: {reason}")
        stop_started(d.reporter, started)
        d.ledger.set_active(None)
        return RestoreOutcome(None, reason)


def rollback_target(ledger: Ledger) -> DeploymentRecord:
    """The newest known-good deployment other than the active one; ConfigError (exit 2: the command needs
    `--to`, nothing was changed) when there is none."""
    target = ledger.known_good(exclude=ledger.index().get("active"))
    if target is None:
        raise ConfigError("nothing to roll back to: no earlier known-good deployment is recorded; nothing was "
                          "changed", where=str(ledger.root),
                          hint="name the profile to go to: sparkctl rollback --to PROFILE (e.g. dflash-off; "
                               "`sparkctl profiles` lists them)")
    return target
