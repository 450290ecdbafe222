"""The deployment lifecycle: up, rollback, down, status.

`up` = plan -> preflight -> image -> boot -> warm-up -> verify -> hand off, each stage
timed and recorded in the ledger. A failure in boot, warm-up or verify stops the new
engines and restores the previous deployment (restarted and verified) unless
no_rollback; Ctrl-C does the same, so nothing is left running that was not there.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.deploy.boot import BootResult, boot
from sparkctl.deploy.gates import Gate, run_gates
from sparkctl.deploy.image_stage import ImageStage, survey
from sparkctl.deploy.plan import Plan, make_plan
from sparkctl.deploy.preflight import Check, ports_of, run_preflight
from sparkctl.deploy.preflight_rules import evaluate
from sparkctl.deploy.progress import Reporter
from sparkctl.deploy.reconcile import interrupted
from sparkctl.deploy.rollback import (mark_superseded, restore, rollback_target, stop_engines, stop_started)
from sparkctl.deploy.runtimes import Runtimes, embedded_notice
from sparkctl.deploy.warmup import warm_up
from sparkctl.errors import CancelledError, ConfigError, DeployError, ImageError, PreflightError, SparkctlError, \
    interrupt_name
from sparkctl.nodes.runtime import Handle, Runtime
from sparkctl.sglang.client import SGLangAPIError, SGLangClient
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.sglang.render import RenderResult, render
from sparkctl.state.ledger import Ledger, Stopwatch, now_iso
from sparkctl.state.controller import this_controller
from sparkctl.state.records import DeploymentRecord, Failure, Intent, StageEntry, Status

log = logging.getLogger("sparkctl.deploy")


@dataclass
class UpOptions:
    dry_run: bool = False
    no_rollback: bool = False
    boot_timeout_s: float | None = None
    confirm: Callable[[Plan], bool] | None = None   # None: proceed without asking
    base_of: str | None = None     # rollback: the engine tag the target ran; its base is planned on (image_stage)


class Deployer:
    """Lifecycle operations on one cluster. Example::

        Deployer(resolve_inventory(None), Reporter()).up(load_profile("d5"), UpOptions())
    """

    def __init__(self, inventory: Inventory, reporter: Reporter | None = None, ledger: Ledger | None = None) -> None:
        self.inventory = inventory
        self.reporter = reporter or Reporter(quiet=True)
        self.ledger = ledger or Ledger.for_cluster(inventory.cluster.name)

    # -- helpers ---------------------------------------------------------------------------------------------------
    def runtimes(self, dep_id: str) -> Runtimes:
        """The runtime of each node, for the engines of deployment `dep_id` (logs, liveness, stop)."""
        return Runtimes(self.inventory, self.ledger, dep_id)

    @staticmethod
    def client(spec0: LaunchSpec | dict[str, Any], key_env: str | None, timeout: float = 60.0) -> SGLangClient:
        """Client for rank 0's API; the API key comes from the environment variable the profile names."""
        host = spec0.api_host if isinstance(spec0, LaunchSpec) else spec0["api_host"]
        port = spec0.api_port if isinstance(spec0, LaunchSpec) else spec0["api_port"]
        key = os.environ.get(key_env) if key_env else None
        return SGLangClient(f"http://{host}:{port}", api_key=key or None, timeout=timeout)

    def health_probe(self, spec0: LaunchSpec, key_env: str | None) -> Callable[[], bool]:
        """True once rank 0's /health answers 200 (connection refused or 503 = not yet)."""
        client = self.client(spec0, key_env, timeout=5)

        def probe() -> bool:
            try:
                return client.health() == 200
            except SGLangAPIError:
                return False
        return probe

    def health_of(self, record: DeploymentRecord) -> tuple[bool, str, list[dict[str, Any]]]:
        """Live health of a recorded deployment: every rank alive, rank 0 /health 200."""
        rts = self.runtimes(record.id)
        ranks, healthy = [], True
        for handle in record.handles:
            live = rts.for_node(handle.node).liveness(handle)
            entry = {"rank": handle.rank, "node": handle.node, "alive": live.alive, "state": live.detail}
            if handle.rank == 0 and live.alive:
                try:
                    with self.client(record.specs[0], record.api_key_env, timeout=5) as c:
                        code = c.health()
                    entry["health"] = code
                    live_ok = code == 200
                except SGLangAPIError as exc:
                    entry["health"] = None
                    entry["state"] += f"; /health: {exc.message}"
                    live_ok = False
                healthy &= live_ok
            healthy &= live.alive
            ranks.append(entry)
        if not ranks:
            healthy = False
        detail = "; ".join(f"rank {r['rank']} {r['state']}" + (f", /health {r.get('health')}" if r["rank"] == 0 else "")
                           for r in ranks) or "no ranks recorded"
        return healthy, detail, ranks

    def render(self, profile: Profile) -> RenderResult:
        """Every rank's launch for this profile on this cluster (ConfigError when the profile cannot run here)."""
        return render(profile, self.inventory)

    @property
    def embedded_notice(self) -> str | None:
        """One line telling the user the cluster is the embedded one (emulated engine), or None."""
        return embedded_notice(self.inventory)

    def plan(self, profile: Profile, *, base_of: str | None = None) -> tuple[RenderResult, Plan]:
        """What `up` would do: the rendered launch and the steps against what runs now (or a no-op).

        ``base_of``: see `UpOptions.base_of`."""
        result = self.render(profile)
        active = self.ledger.active()
        healthy, detail = (self.health_of(active)[:2] if active else (False, ""))
        dep_id = self.ledger.new_id(profile.name)
        rts = self.runtimes(dep_id)
        images = survey(profile, self.inventory, result, base_of=base_of)
        if images.launch is not None:
            rts.bind_launch(images.launch)       # the boot preview shows the launch image's docker run
        plan = make_plan(result, active, healthy, detail, deployment_id=dep_id,
                         start_preview=lambda spec: rts.for_node(spec.node).launch_argv(spec, dep_id),
                         image_steps=images.steps(), launch_image=images.identity_key)
        plan.images = images
        return result, plan

    # -- up --------------------------------------------------------------------------------------------------------
    def up(self, profile: Profile, opts: UpOptions, *, kind: str = "up") -> dict[str, Any]:
        """Deploy `profile`: plan, preflight, image, stop the old one, boot, warm-up, verify, hand off.

        A no-op (outcome "unchanged") when the same launch already runs healthy. On failure after the old
        deployment was stopped, the new engines are stopped and the old one restored (unless
        opts.no_rollback); the error says what was restored. Raises PreflightError (nothing changed),
        DeployError, LockHeldError, CancelledError.
        """
        r = self.reporter
        r.stage("plan", f"profile {profile.name} on cluster {self.inventory.cluster.name}"
                        + (" (embedded, emulated engine)" if self.inventory.embedded else ""))
        result, plan = self.plan(profile, base_of=opts.base_of)
        for w in result.warnings:
            r.event(f"warning: {w}")
        for line in plan.lines(commands=opts.dry_run):
            r.event(line)
        base = {"profile": profile.name, "plan": plan.as_dict(), "emulated": self.inventory.emulated,
                "cluster": self.inventory.cluster.name}
        if plan.noop:
            settled = None
            if interrupted(self.ledger, locked=False):   # what a dead controller left is settled even so
                with self.ledger.lock(kind):
                    settled = self.reconcile(kind)
            return {**base, "changed": False, "outcome": "unchanged", "reason": plan.noop_reason,
                    "deployment": plan.active_id, "endpoint": self._endpoint(result.specs[0]), "reconciled": settled}
        if opts.dry_run:
            return {**base, "changed": False, "outcome": "dry-run"}
        if opts.confirm is not None and not opts.confirm(plan):
            raise CancelledError("cancelled at the confirmation prompt; nothing was changed")
        with self.ledger.lock(kind):
            settled = self.reconcile(kind)
            # Re-plan under the lock: another command may have changed the cluster meanwhile.
            result, plan = self.plan(profile, base_of=opts.base_of)
            if plan.noop:
                return {**base, "changed": False, "outcome": "unchanged", "reason": plan.noop_reason,
                        "deployment": plan.active_id, "reconciled": settled}
            return {**base, **self._apply(profile, result, plan, opts, kind), "reconciled": settled}

    def _endpoint(self, spec0: LaunchSpec) -> str:
        return f"http://{spec0.api_host}:{spec0.api_port}"

    def _new_record(self, profile: Profile, result: RenderResult, plan: Plan, kind: str) -> DeploymentRecord:
        active = self.ledger.active()
        prev_good = self.ledger.known_good()
        return DeploymentRecord(
            id=plan.deployment_id, kind=kind, profile=profile.name,
            profile_data=profile.model_dump(mode="json"), inventory=self.inventory.path,
            cluster=self.inventory.cluster.name, emulated=self.inventory.emulated,
            identity=plan.identity, sglang_version=profile.image.sglang_version,
            specs=[s.redacted() for s in result.specs], warnings=result.warnings, created=now_iso(),
            previous=active.id if active else None, previous_known_good=prev_good.id if prev_good else None,
            endpoint=self._endpoint(result.specs[0]),
            speculative_algorithm=profile.speculative.algorithm if profile.speculative else None,
            controller=this_controller(kind, now_iso()),
        )

    def _stage(self, record: DeploymentRecord, name: str, fn: Callable[[], Any], message: str = "") -> Any:
        sw = Stopwatch()
        entry = StageEntry(name=name, started=now_iso())
        record.stages.append(entry)
        self.ledger.save(record)          # the ledger first, then the screen: what was said is on disk
        self.reporter.stage(name, message)
        try:
            value = fn()
        except BaseException as exc:
            entry.status, entry.elapsed_s = "failed", sw.elapsed()
            entry.error = exc.render() if isinstance(exc, SparkctlError) else f"{type(exc).__name__}: {exc}"
            self.ledger.save(record)
            raise
        entry.status, entry.elapsed_s = "ok", sw.elapsed()
        self.reporter.event(f"done in {entry.elapsed_s:.2f}s")
        self.ledger.save(record)
        return value

    def _apply(self, profile: Profile, result: RenderResult, plan: Plan, opts: UpOptions,
               kind: str) -> dict[str, Any]:
        """Run `plan.steps` in order, each as a recorded stage; on failure stop what started, restore the old."""
        record = self._new_record(profile, result, plan, kind)
        dep_id = record.id
        self.ledger.save(record)
        self.ledger.add_to_history(dep_id)
        active = self.ledger.active()
        rts = self.runtimes(dep_id)
        started: list[tuple[Runtime, Handle]] = []
        stopped_previous = False
        total = Stopwatch()
        timeout = opts.boot_timeout_s or profile.lifecycle.boot_timeout_s
        spec0 = result.specs[0]
        booted: list[BootResult] = []

        def preflight() -> None:
            record.preflight = [c.as_dict() for c in self._preflight(result, rts, self._own_ports(active))]

        stage = ImageStage(profile, self.inventory, result, plan.images, runtimes=rts,
                           log_dir=self.ledger.root / "builds",
                           report=lambda msg, node: self.reporter.event(msg, node))

        def image_verify() -> None:
            record.image_ids, record.images = stage.verify()
            if rts.launch is not None:
                record.launch_doc = rts.launch.doc

        def stop_old() -> None:
            nonlocal stopped_previous
            assert active is not None
            stopped_previous = True
            stop_engines(self, active, keep=True)

        def intent(spec: LaunchSpec, handle: Handle | None) -> None:
            if handle is None:   # before the start: which engine is about to run where
                record.intents.append(Intent(node=spec.node, rank=spec.rank, deployment=dep_id, at=now_iso(),
                                             engine=f"label sparkctl.deployment={dep_id}"))
            else:                # right after: how to find it (pid + start time, or the container)
                record.intents[-1] = record.intents[-1].model_copy(update={"engine": handle.where})
                record.handles = [*record.handles, handle]
            self.ledger.save(record)

        def start_and_wait() -> None:
            b = boot(result.specs, rts.for_node, dep_id, self.reporter, timeout_s=timeout, started=started,
                     ready_probe=self.health_probe(spec0, profile.api.api_key_env), on_start=intent)
            booted.append(b)
            record.handles, record.capacity = b.handles, b.capacity()

        def warm() -> None:
            with self.client(spec0, profile.api.api_key_env, timeout=profile.warmup.timeout_s) as client:
                record.warmup = warm_up(profile, client, self.reporter, spec0.node)

        def verify() -> None:
            with self.client(spec0, profile.api.api_key_env, timeout=profile.warmup.timeout_s) as client:
                self._verify(profile, client, booted[0], record)

        def hand_off() -> None:
            record.status, record.finished = Status.SUCCESSFUL, now_iso()
            record.elapsed_s, record.handed_off = total.elapsed(), now_iso()
            self.ledger.save(record)
            if active and active.id != dep_id:
                mark_superseded(self, active, dep_id)
            self.ledger.set_active(dep_id)
            self.reporter.event(f"{record.endpoint} serves {profile.model.served_name} ({profile.name}, "
                                f"deployment {dep_id})")

        actions: dict[str, Callable[[], None]] = {
            "preflight": preflight, "image-build": stage.build, "image-distribute": stage.distribute,
            "image-verify": image_verify, "stop-old": stop_old, "boot": start_and_wait,
            "warm-up": warm, "verify": verify, "hand-off": hand_off}
        try:
            for step in plan.steps:
                self._stage(record, step.name, actions[step.name], step.what)
            return {"changed": True, "outcome": "deployed", "deployment": dep_id, "endpoint": record.endpoint,
                    "emulated": record.emulated, "capacity": record.capacity, "gates": record.gates,
                    "stages": [s.model_dump(mode="json") for s in record.stages],
                    "warmup": record.warmup, "elapsed_s": record.elapsed_s}
        except (PreflightError, ImageError) as exc:   # preflight or image steps: nothing was changed yet
            record.status, record.finished, record.elapsed_s = Status.FAILED, now_iso(), total.elapsed()
            record.failure = Failure(stage=self._failed_stage(record), message=exc.render())
            if getattr(exc, "checks", None):
                record.preflight = [c.as_dict() for c in exc.checks]
            self.ledger.save(record)
            raise
        except (Exception, KeyboardInterrupt) as exc:
            interrupted = isinstance(exc, KeyboardInterrupt)
            stage = self._failed_stage(record)
            message = f"interrupted ({interrupt_name(exc)})" if interrupted else (
                exc.render() if isinstance(exc, SparkctlError) else f"internal error: {type(exc).__name__}: {exc}")
            record.status = Status.CANCELED if interrupted else Status.FAILED
            record.finished, record.elapsed_s = now_iso(), total.elapsed()
            record.failure = Failure(stage=stage, message=message, node=getattr(exc, "node", None))
            record.handles = record.handles or [h for _, h in started]
            self.ledger.save(record)
            if opts.no_rollback and not interrupted:
                self.reporter.event("--no-rollback: leaving the failed engines as they are for inspection")
                record.rollback = "skipped (--no-rollback)"
                self.ledger.save(record)
                raise
            stop_started(self.reporter, started)
            record.rollback = "new engines stopped"
            try:
                if stopped_previous and active:
                    record.restoring = active.id     # a SIGKILL from here on: the next command settles it
                    self.ledger.save(record)
                    outcome = restore(self, active, record)
                    record.restored, record.restore_error = outcome.restored, outcome.error
                    record.restoring = None
            finally:
                self.ledger.save(record)
            if interrupted or not isinstance(exc, SparkctlError):
                raise   # Ctrl-C, or a bug in sparkctl: its traceback goes to the CLI's debug log
            if record.restored:
                said = f"; restored {record.restored}"
            elif record.restore_error:
                said = f"; restoring {active.id if active else '?'} FAILED: {record.restore_error}"
            else:
                said = "; nothing to restore (no previous deployment)" if not active else ""
            raise exc.amended(message=exc.message + said) from exc

    @staticmethod
    def _failed_stage(record: DeploymentRecord) -> str:
        return next((s.name for s in reversed(record.stages) if s.status != "ok"), "unknown")

    # -- stages ------------------------------------------------------------------------------------------------------
    def _own_ports(self, active: DeploymentRecord | None) -> set[tuple[str, int]]:
        if not active:
            return set()
        out: set[tuple[str, int]] = set()
        for s in active.specs:
            spec = LaunchSpec(rank=s["rank"], node=s["node"], argv=s["argv"], env=s["env"],
                              sglang_version=s["sglang_version"])
            out.update((a, p) for a, p, _ in ports_of(spec))
        return out

    def _preflight(self, result: RenderResult, rts: Runtimes, own: set[tuple[str, int]]) -> list[Check]:
        from sparkctl.deploy.host_checks import CrossNodeChecks
        cross = CrossNodeChecks(self.inventory)   # model parity, fabric MTU equal, fabric SSH (host preparation)

        def node_checks(spec: LaunchSpec) -> list[Check]:
            rt = rts.for_node(spec.node)
            checks = evaluate(self.inventory, spec, rt.gather(spec), own)
            cross.collect(spec, rt)
            return checks
        checks = run_preflight(result.specs, node_checks, then=cross.checks)
        for c in checks:
            self.reporter.event(c.line, c.node)
        return checks

    def _verify(self, profile: Profile, client: SGLangClient, booted: BootResult,
                record: DeploymentRecord) -> list[Gate]:
        gates = run_gates(profile, client, booted.watches)
        record.gates = [g.as_dict() for g in gates]
        try:  # the engine says whether it is the emulator (sparkctl.sim sets "emulated": true)
            record.emulated = bool(record.emulated or client.server_info().get("emulated"))
        except SGLangAPIError:
            pass
        for g in gates:
            self.reporter.event(f"{'PASS' if g.ok else 'FAIL'} {g.name}: {g.evidence}")
        failed = [g for g in gates if not g.ok]
        if failed:
            raise DeployError(f"verify gate(s) failed: {', '.join(g.name for g in failed)}",
                              where="verify", hint="read each gate's evidence below",
                              evidence="\n".join(f"{g.name}: {g.evidence}" for g in failed))
        return gates

    def preflight(self, profile: Profile) -> list[Check]:
        """Read-only checks on every node for this profile (what `up` runs first); raises PreflightError."""
        result = self.render(profile)
        self.reporter.stage("preflight", f"profile {profile.name}: {len(result.specs)} nodes in parallel")
        return self._preflight(result, self.runtimes("preflight"), self._own_ports(self.ledger.active()))

    # -- rollback / down / status ------------------------------------------------------------------------------------
    def rollback_target(self) -> DeploymentRecord:
        """The deployment `rollback` without --to returns to: the newest known-good one other than the active."""
        return rollback_target(self.ledger)

    def rollback(self, to: Profile | None, opts: UpOptions) -> dict[str, Any]:
        """Deploy `to` (a profile), or the profile of the previous known-good deployment when None.

        Same stages and guarantees as `up` (kind "rollback"); a stopped deployment of the same launch restarts
        its kept containers (the fast path).
        """
        if to is None:
            target = self.rollback_target()
            self.reporter.stage("rollback", f"rolling back to {target.id} ({target.profile})")
            to = Profile.model_validate(target.profile_data)
            engine = {v.get("engine_tag") for v in target.images.values()} - {None}
            if len(engine) == 1:           # the images it ran, even when its base tag names another image now
                opts = replace(opts, base_of=engine.pop())
        return self.up(to, opts, kind="rollback")

    def follow_log(self, rank: int, *, tail: int = 50, follow: bool = False,
                   poll_s: float = 0.5) -> Iterator[str]:
        """Rank `rank`'s engine log of the active deployment (else the newest known-good one): the last `tail`
        lines (0: all), then with `follow` each new piece of complete lines as it comes, until the caller stops."""
        record = self.ledger.active() or self.ledger.known_good()
        if record is None:
            raise SparkctlError("no deployment recorded yet", hint="run sparkctl up --profile NAME")
        handle = record.handle_of(rank)
        if handle is None:
            ranks = sorted(h.rank for h in record.handles)
            raise ConfigError(f"--rank {rank}: deployment {record.id} has no rank {rank}",
                              hint=f"use one of its ranks: {', '.join(map(str, ranks))} (e.g. --rank {ranks[0]})")
        rt = self.runtimes(record.id).for_node(handle.node)
        text, offset = rt.read_log(handle, 0)
        lines = text.splitlines()
        yield "\n".join(lines[-tail:] if tail else lines) + ("\n" if lines else "")
        while follow:
            time.sleep(poll_s)
            text, offset = rt.read_log(handle, offset)
            if text:
                yield text

    def reconcile(self, command: str) -> dict[str, Any]:
        """Under the lock: settle what a dead controller left (deploy/reconcile.py); what it did, as data."""
        from sparkctl.deploy.reconcile import reconcile
        return reconcile(self, command).as_dict()

    def down(self) -> dict[str, Any]:
        """Stop the active deployment, then every other engine sparkctl started here (deploy/status.py)."""
        from sparkctl.deploy.status import down
        return down(self)

    def status(self) -> dict[str, Any]:
        """The active deployment's live health, an `up` in progress, interrupted deployments (deploy/status.py)."""
        from sparkctl.deploy.status import status
        return status(self)
