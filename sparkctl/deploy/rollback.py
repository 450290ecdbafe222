"""Restore a stopped deployment, and pick a rollback target.

`apply` restores the previous deployment when `up` fails after stopping it (steps restore-boot, restore-verify,
restore-hand-off of `deploy.steps`; boot and gates are `up`'s own, from `deploy.rank_steps`); `sparkctl rollback`
without --to picks its target here. Every outcome is
written to the ledger: a restore that fails says why in the failed deployment's record (`restore_error`).
"""
from __future__ import annotations

from dataclasses import dataclass

from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.engines import stop_started
from sparkctl.deploy.image_stage import LaunchImage
from sparkctl.deploy.plan import launch_identity
from sparkctl.deploy.rank_steps import boot_ranks, gate_ranks
from sparkctl.deploy.steps import RESTORE_BOOT, RESTORE_HAND_OFF, RESTORE_VERIFY, boundary
from sparkctl.errors import ConfigError, LedgerError, SparkctlError, interrupt_name
from sparkctl.nodes.runtime import Handle, Runtime
from sparkctl.state.ledger import Ledger, now_iso
from sparkctl.state.records import DeploymentRecord, RestoreEntry, Status


def recorded_launch(record: DeploymentRecord) -> LaunchImage | None:
    """The launch image a deployment's ranks ran (recorded by its image-verify step), or None."""
    tags = {v.launch_tag for v in record.images.values()} - {None}
    if not tags or record.launch_doc is None:
        return None
    return LaunchImage(str(tags.pop()), record.launch_doc)


@dataclass(frozen=True)
class RestoreOutcome:
    restored: str | None      # the deployment serving again, or None
    error: str | None = None  # why not (recorded in the failed deployment's record)


def restore(c: Cluster, previous: DeploymentRecord, failed: DeploymentRecord, *, command: str = "up",
            save: bool = True) -> RestoreOutcome:
    """Bring a stopped known deployment back: restart its ranks, wait ready, verify.

    `save=False` (the state directory failed mid-way): the engines come back without a single write; the
    record says what it said before, and the next command's settle step adopts the serving engines. A write that
    fails during the restore (the disk filling now) turns `save` off for the rest: the restore goes on."""
    c.reporter.stage("rollback", f"restoring {previous.id} ({previous.profile})")
    started: list[tuple[Runtime, Handle]] = []
    saving = save

    def write(rec: DeploymentRecord) -> None:
        nonlocal saving
        if not saving:
            return
        try:
            c.ledger.save(rec)
        except LedgerError as exc:
            saving = False
            c.reporter.event(f"note: {exc.message}; restoring without the disk (the next command adopts the "
                             f"restored engines)")
    try:
        profile = previous.deployed_profile()
        result = c.render(profile)
        launch = recorded_launch(previous)
        if launch_identity(result, launch.tag if launch else None) != previous.identity:
            c.reporter.event("note: re-rendered launch identity differs from the record "
                             "(inventory or secrets changed); restoring the re-rendered launch")
        rts = c.runtimes(previous.id)
        if launch is not None:
            rts.bind_launch(launch)      # the ranks run the launch image they ran before

        def record_handle(spec: object, handle: Handle | None) -> None:
            # The restarted engine's handle goes to the record at once: after a SIGKILL here, the next command
            # finds it (docker also by label). The status is not touched: restored engines are unverified.
            if handle is not None and saving:
                rec = c.ledger.load(previous.id)
                rec.handles = [h for h in rec.handles if h.rank != handle.rank] + [handle]
                write(rec)
        boundary(command, RESTORE_BOOT, "before")
        booted = boot_ranks(c, profile, result, rts, previous.id, timeout_s=profile.lifecycle.boot_timeout_s,
                            started=started, on_start=record_handle)
        boundary(command, RESTORE_BOOT, "after")
        boundary(command, RESTORE_VERIFY, "before")
        gates, _ = gate_ranks(c, profile, result, booted)
        boundary(command, RESTORE_VERIFY, "after")
        bad = [g for g in gates if not g.ok]
        for g in bad:
            c.reporter.event(f"FAIL {g.name}: {g.evidence}")
        boundary(command, RESTORE_HAND_OFF, "before")
        if saving:   # one write: the restored record's status is what makes it active again (Ledger.active_id)
            prev = c.ledger.load(previous.id)
            prev.handles = booted.handles
            prev.status = Status.SUCCESSFUL if not bad else Status.FAILED
            prev.stopped = None
            prev.restored_at, prev.restored_after = now_iso(), failed.id
            prev.restores.append(RestoreEntry(at=now_iso(), after=failed.id, gates=gates))
            write(prev)
        boundary(command, RESTORE_HAND_OFF, "after")
        if bad:
            reason = "restored deployment failed gates: " + "; ".join(f"{g.name}: {g.evidence}" for g in bad)
            c.reporter.event(reason)
            stop_started(c, started, sweep=previous.id, running_only=True)
            return RestoreOutcome(None, reason)
        c.reporter.event(f"restored {previous.id}: serving again at {previous.endpoint}")
        return RestoreOutcome(previous.id)
    except (SparkctlError, KeyboardInterrupt) as exc:
        reason = exc.render() if isinstance(exc, SparkctlError) else f"interrupted ({interrupt_name(exc)})"
        c.reporter.event(f"restore of {previous.id} failed: {reason}")
        stop_started(c, started, sweep=previous.id, running_only=True)
        if saving:
            try:
                prev = c.ledger.load(previous.id)
                if prev.status == Status.SUCCESSFUL:   # it did not come back: not active, still known-good
                    prev.status, prev.stopped = Status.STOPPED, now_iso()
                    c.ledger.save(prev)
            except SparkctlError:
                pass
        return RestoreOutcome(None, reason)


def rollback_target(ledger: Ledger, avoid_identity: str | None = None) -> DeploymentRecord | None:
    """The newest known-good deployment other than the active one (and not of launch identity `avoid_identity`),
    never a bench comparison's arm; None when there is none (the caller then uses the active profile's
    `rollback_profile`, or refuses)."""
    return ledger.known_good(exclude=ledger.active_id(), rollback=True, avoid_identity=avoid_identity)


def no_target_error(ledger: Ledger) -> ConfigError:
    return ConfigError("nothing to roll back to: no earlier known-good deployment is recorded; nothing was changed "
                       "(and no active profile names a rollback_profile)", where=str(ledger.root),
                       hint="name the profile to go to: sparkctl rollback --to PROFILE (e.g. dflash-off; "
                            "`sparkctl profiles` lists them)")
