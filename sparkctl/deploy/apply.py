"""Apply a plan: run exactly its steps in order under the lock, journal each (intent, then outcome), undo on failure.

Each step is typed (`deploy.plan`) and carries its inputs; `RUNNERS` maps its class to the module-level function
that does it, over the `Run` the steps share (the record, its journal, the runtimes, what started). Nothing here
re-reads the ledger to decide: the prior deployment is the one the plan observed.

Each step is recorded in the deployment's record before its effect (a `steps` entry and a journal `intent`
saying what and where) and after it (`ok` or `failed`); `deploy.steps.boundary` marks both sides. A failure
after the old deployment was stopped stops the new engines and restores the old one. When the state directory
itself fails mid-way (full, read-only), the same undo runs without the disk: the journal tail is in memory and
its last line goes to stderr; the error (exit 6) says what was restored.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from sparkctl.config.profile import Profile
from sparkctl.deploy.boot import BootResult, doctor_lines
from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.engines import mark_superseded, stop_engines, stop_started
from sparkctl.deploy.host_checks import CrossNodeChecks
from sparkctl.deploy.image_stage import ImageStage, ImageSurvey
from sparkctl.deploy.inputs import fingerprint, present
from sparkctl.deploy.observe import leftovers
from sparkctl.deploy.plan import (
    Boot,
    HandOff,
    ImageBuild,
    ImageDistribute,
    ImageStep,
    ImageVerify,
    Plan,
    Preflight,
    Step,
    StopOld,
    Verify,
    WarmUp,
)
from sparkctl.deploy.preflight import ports_of, run_preflight
from sparkctl.deploy.preflight_rules import evaluate
from sparkctl.deploy.progress import Reporter
from sparkctl.deploy.rank_steps import boot_ranks, gate_ranks
from sparkctl.deploy.rollback import restore
from sparkctl.deploy.runtimes import Runtimes
from sparkctl.deploy.steps import STOP_NEW, boundary
from sparkctl.deploy.warmup import warm_up
from sparkctl.errors import DeployError, ImageError, LedgerError, PreflightError, SparkctlError, interrupt_name
from sparkctl.nodes.fanout import beside
from sparkctl.nodes.runtime import Handle, Runtime
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.sglang.render import RenderResult
from sparkctl.state.controller import this_controller
from sparkctl.state.ledger import Stopwatch, now_iso
from sparkctl.state.records import (
    Capacity,
    CheckResult,
    DeploymentRecord,
    Failure,
    GateResult,
    Intent,
    JournalEntry,
    NodeImages,
    NodePath,
    Status,
    StepEntry,
    Warmup,
)


@dataclass
class Applied:
    record: DeploymentRecord
    cap_line: str | None = None          # the engine's line saying it caps concurrency, when it printed one


@dataclass
class ApplyJournal:
    """The record's writer during apply. A failed write (state directory full or read-only) is remembered,
    never raised from the undo path: the journal stays in memory and its last line goes to stderr."""

    c: Cluster
    record: DeploymentRecord
    disk_error: LedgerError | None = None
    said: set[int] = field(default_factory=set)

    def save(self) -> None:
        if self.disk_error is not None:
            return
        try:
            self.c.ledger.save(self.record)
        except LedgerError as exc:           # statefiles.py names every OS error (StateDirFullError, StateDirError)
            self.disk_error = exc
            last = self.record.journal[-1].line() if self.record.journal else "(journal empty)"
            print(f"sparkctl: the state directory failed mid-way ({exc.message}); journal tail, kept in memory: "
                  f"{last}", file=sys.stderr)

    def entry(self, step: str, phase: str, what: str = "", nodes: list[str] | None = None,
              detail: str | None = None) -> None:
        self.record.journal.append(JournalEntry(step=step, phase=phase, at=now_iso(), what=what,
                                                nodes=nodes or [], detail=detail))


def own_ports(active: DeploymentRecord | None) -> set[tuple[str, int]]:
    if not active:
        return set()
    out: set[tuple[str, int]] = set()
    for s in active.specs:
        spec = LaunchSpec(rank=s.rank, node=s.node, argv=s.argv, env=s.env,
                          sglang_version=s.sglang_version or "")
        out.update((a, p) for a, p, _ in ports_of(spec))
    return out


def run_checks(c: Cluster, result: RenderResult, rts: Runtimes, own: set[tuple[str, int]]) -> list[CheckResult]:
    """Every node's preflight checks (all nodes at once), then the cross-node ones; PreflightError on a failure."""
    cross = CrossNodeChecks(c.inventory)   # model parity, fabric MTU equal, fabric SSH (host preparation)
    ours = {m.pid: lo.whose for lo in leftovers(c) for m in lo.members}

    def node_checks(spec: LaunchSpec) -> list[CheckResult]:
        rt = rts.for_node(spec.node)
        # the cross-node facts ask nothing of the node's own answers: read at once beside them, one wave per node
        # (they followed it: +0.1-0.4 s, the model manifest and the fabric SSH probe being the slowest commands)
        nf = beside(lambda: rt.gather(spec), lambda: cross.collect(spec, rt))
        nf.leftover_pids = ours
        return evaluate(c.inventory, spec, nf, own)
    checks = run_preflight(result.specs, node_checks, then=cross.checks)
    for ch in checks:
        c.reporter.event(ch.line, ch.node)
    return checks


def verify(c: Cluster, profile: Profile, result: RenderResult, booted: BootResult,
           record: DeploymentRecord) -> list[GateResult]:
    gates, emulated = gate_ranks(c, profile, result, booted)
    record.gates = gates
    record.emulated = bool(record.emulated or emulated)
    for g in gates:
        c.reporter.event(f"{'PASS' if g.ok else 'FAIL'} {g.name}: {g.evidence}")
    failed = [g for g in gates if not g.ok]
    if failed:
        raise gates_failed(failed)
    return gates


def gates_failed(failed: list[GateResult]) -> DeployError:
    """The error of a verify whose gates `failed`: their names typed (``failed_gates``), their evidence shown."""
    return DeployError(f"verify gate(s) failed: {', '.join(g.name for g in failed)}",
                       where="verify", hint="read each gate's evidence below",
                       failed_gates=tuple(g.name for g in failed),
                       evidence="\n".join(f"{g.name}: {g.evidence}" for g in failed))


def new_record(c: Cluster, profile: Profile, result: RenderResult, plan: Plan, command: str) -> DeploymentRecord:
    """The new deployment's record, from the plan (its prior and known-good deployments as observed then)."""
    return DeploymentRecord(
        id=plan.deployment_id, command=command, profile=profile.name,
        profile_data=profile.model_dump(mode="json"), inventory=c.inventory.path,
        cluster=c.name, emulated=c.inventory.emulated,
        identity=plan.identity, sglang_version=profile.engine_version(), engine=profile.engine,
        specs=[s.redacted() for s in result.specs], warnings=result.warnings, created=now_iso(),
        previous=plan.active_id, previous_known_good=plan.prior_known_good,
        endpoint=c.endpoint(result.specs[0]),
        speculative_algorithm=profile.speculative.algorithm if profile.speculative else None,
        controller=this_controller(command, now_iso()), secrets=fingerprint(profile.api),
    )


@dataclass
class Run:
    """One `apply` in progress: what the steps share (the record and its journal, the runtimes, what started)."""

    c: Cluster
    profile: Profile
    result: RenderResult
    plan: Plan
    record: DeploymentRecord
    journal: ApplyJournal
    rts: Runtimes
    boot_timeout_s: float
    started: list[tuple[Runtime, Handle]] = field(default_factory=list)
    booted: BootResult | None = None
    stopped_prior: bool = False
    total: Stopwatch = field(default_factory=Stopwatch)
    _images: ImageStage | None = None
    _step_clock: Stopwatch = field(default_factory=Stopwatch)

    @property
    def reporter(self) -> Reporter:
        return self.c.reporter

    def opened(self, step: Step) -> None:
        """The step's stage and journal intent, on disk before anything is said or done."""
        self._step_clock = Stopwatch()
        self.record.steps.append(StepEntry(name=step.name, started=now_iso()))
        self.journal.entry(step.name, "intent", step.what, self.nodes)
        self.journal.save()
        if self.journal.disk_error is not None:
            raise self.journal.disk_error

    def closed(self, step: Step, error: BaseException | None, skipped: str | None = None) -> None:
        """The step's outcome: `ok` (or `noop`, the plan's or a planned condition's: `skipped`) with its time, or
        `failed` with the error's first line."""
        entry, j = self.record.steps[-1], self.journal
        entry.elapsed_s = self._step_clock.elapsed()
        if error is not None:
            entry.status = "failed"
            entry.error = error.render() if isinstance(error, SparkctlError) else f"{type(error).__name__}: {error}"
            j.entry(step.name, "failed", step.what, detail=entry.error.splitlines()[0])
            j.save()
            return
        entry.status = "ok"
        j.entry(step.name, "noop" if step.noop or skipped else "ok", step.what, detail=skipped)
        self.c.reporter.event(f"done in {entry.elapsed_s:.2f}s")
        j.save()
        if j.disk_error is not None:
            raise j.disk_error

    @property
    def nodes(self) -> list[str]:
        return [n.name for n in self.c.inventory.nodes]

    def images(self, survey: ImageSurvey) -> ImageStage:
        """The image stage of this run (build, distribute and verify share it), made from the steps' survey."""
        if self._images is None:
            self._images = ImageStage(self.profile, self.c.inventory, self.result, survey, runtimes=self.rts,
                                      log_dir=self.c.ledger.root / "builds",
                                      report=lambda msg, node: self.c.reporter.event(msg, node))
        return self._images

    @contextlib.contextmanager
    def doctor_cites(self) -> Iterator[None]:
        """A DeployError raised inside comes out with the doctor's findings in the ranks' logs (`with_doctor`)."""
        try:
            yield
        except DeployError as exc:
            cited = self.with_doctor(exc)
            if cited is exc:
                raise
            raise cited from exc

    def with_doctor(self, exc: DeployError) -> DeployError:
        """The failure with what the doctor recognises in the ranks' logs appended (the engine may have died
        during warm-up or verify: its log says why), or itself when nothing matches."""
        if self.booted is None:
            return exc
        try:
            watches = self.booted.watches
            lines = doctor_lines([(f"rank {w.spec.rank} [{w.spec.node}]", w.full_log()) for w in watches],
                                 watches[0].spec.engine if watches else "sglang")
        except (SparkctlError, OSError):
            return exc
        if not lines:
            return exc
        return exc.amended(evidence="\n".join(filter(None, [exc.evidence, *lines])))


# ---- what each kind of step does (apply dispatches on the step's class) ----------------------------------------
def run_preflight_step(run: Run, step: Preflight) -> None:
    needed: list[NodePath] = []       # what a restart must find there again: read beside the checks (one wave)
    run.record.preflight = list(beside(lambda: run_checks(run.c, run.result, run.rts, set(step.own_ports)),
                                       lambda: needed.extend(present(run.c.inventory, run.result.specs))))
    run.record.needed = needed


def run_image_build(run: Run, step: ImageStep) -> None:
    run.images(step.survey).build()


def run_image_distribute(run: Run, step: ImageStep) -> None:
    run.images(step.survey).distribute()


def run_image_verify(run: Run, step: ImageStep) -> None:
    record = run.record
    record.image_ids, images = run.images(step.survey).verify()
    record.images = {node: NodeImages.model_validate(per_node) for node, per_node in images.items()}
    if run.rts.launch is not None:
        record.launch_doc = run.rts.launch.doc


def run_stop_old(run: Run, step: StopOld) -> None:
    run.stopped_prior = True
    stop_engines(run.c, step.prior, keep=True)


def run_boot(run: Run, step: Boot) -> None:
    record, j, dep_id = run.record, run.journal, run.record.id

    def intent(spec: LaunchSpec, handle: Handle | None) -> None:
        if handle is None:   # before the start: which engine is about to run where
            record.intents.append(Intent(node=spec.node, rank=spec.rank, deployment=dep_id, at=now_iso(),
                                         engine=f"label sparkctl.deployment={dep_id}"))
            j.entry(step.name, "intent", f"start rank {spec.rank}", [spec.node])
        else:                # right after: how to find it (pid + start time, or the container)
            record.intents[-1] = record.intents[-1].model_copy(update={"engine": handle.where})
            record.handles = [*record.handles, handle]
            j.entry(step.name, "ok", f"rank {spec.rank} started", [spec.node], detail=handle.where)
        j.save()
        if j.disk_error is not None:
            raise j.disk_error
    b = boot_ranks(run.c, run.profile, run.result, run.rts, dep_id, timeout_s=run.boot_timeout_s,
                   started=run.started, on_start=intent)
    run.booted = b
    capacity = b.capacity()
    record.handles = b.handles
    record.capacity = None if capacity is None else Capacity.model_validate(capacity)


def run_warm_up(run: Run, step: WarmUp) -> None:
    c, profile, spec0 = run.c, run.profile, run.result.specs[0]
    with run.doctor_cites(), c.client(spec0, profile.api.api_key_env, timeout=profile.warmup.timeout_s) as client:
        run.record.warmup = Warmup.model_validate(warm_up(profile, client, c.reporter, spec0.node))


def run_verify(run: Run, step: Verify) -> None:
    if run.booted is None:
        raise TypeError(f"plan {run.plan.identity}: verify before boot")
    with run.doctor_cites():
        verify(run.c, run.profile, run.result, run.booted, run.record)


def run_hand_off(run: Run, step: HandOff) -> None:
    # One write makes it the active deployment (Ledger.active_id derives it from this record's status);
    # marking the old one superseded comes after, and a later command's settle step finishes it if we die between.
    c, record, prior = run.c, run.record, step.prior
    record.status, record.finished = Status.SUCCESSFUL, now_iso()
    record.elapsed_s, record.handed_off = run.total.elapsed(), now_iso()
    run.journal.entry(step.name, "intent", f"make {record.id} the active deployment", run.nodes)
    c.ledger.save(record)        # from here on it is handed off: what follows is tidying
    try:
        if prior and prior.id != record.id:
            mark_superseded(c, prior, record.id)
        c.ledger.sync_index()
    except (LedgerError, OSError) as exc:   # the next command's settle step finishes it (finish_hand_off)
        c.reporter.event(f"note: could not mark {prior.id if prior else '-'} superseded yet ({exc}); "
                         f"the next command finishes it")
    c.reporter.event(f"{record.endpoint} serves {run.profile.model.served_name} ({run.profile.name}, "
                     f"deployment {record.id})")


# (the run, the step) -> None when done, or why a condition the plan set was false (journaled `noop` with it). Each
# runner takes its own step class: the table is keyed by that class, which mypy cannot relate to the argument's type.
Runner = Callable[[Any, Any], "str | None"]
# step class -> the module-level function that does it, for a single group's `up`; a replicated `up` runs with
# `deploy.replica_steps.RUNNERS` (these and its own, one table made there). Read-only: nothing adds to it later.
RUNNERS: Mapping[type[Step], Runner] = MappingProxyType({
    Preflight: run_preflight_step, ImageBuild: run_image_build, ImageDistribute: run_image_distribute,
    ImageVerify: run_image_verify, StopOld: run_stop_old, Boot: run_boot, WarmUp: run_warm_up, Verify: run_verify,
    HandOff: run_hand_off})


class StepRun(Protocol):
    """What `run_step` needs of a run in progress: its reporter, and its journal written before a step's effect
    (`opened`: on disk first, raising what the disk said) and after it (`closed`: the outcome, or the error).
    `Run` (a single group's `up`) and `deploy.replica_steps.ReplicatedRun` (a replicated `up`) are the two."""

    @property
    def reporter(self) -> Reporter: ...

    def opened(self, step: Step) -> None: ...

    def closed(self, step: Step, error: BaseException | None, skipped: str | None = None) -> None: ...


def run_step(run: StepRun, step: Step, command: str, runners: Mapping[type[Step], Runner] = RUNNERS) -> None:
    """One step: its intent on disk first, then the screen, the boundary, the effect (`runners`, by the step's
    class; none for a step the plan made a no-op), the outcome (ok, noop or failed) on disk, the boundary after."""
    run.opened(step)              # the ledger first, then the screen: what was said is on disk
    run.reporter.stage(step.name, step.what)
    boundary(command, step.name, "before")
    try:
        skipped = None if step.noop else runners[type(step)](run, step)
    except BaseException as exc:
        run.closed(step, exc)
        raise
    run.closed(step, None, skipped)
    boundary(command, step.name, "after")


def _failed_step(record: DeploymentRecord) -> str:
    return next((s.name for s in reversed(record.steps) if s.status != "ok"),
                f"after {record.steps[-1].name}" if record.steps else "unknown")   # a write after a step's end


def apply(c: Cluster, profile: Profile, result: RenderResult, plan: Plan, *, command: str, contract: str,
          no_rollback: bool = False, boot_timeout_s: float | None = None) -> Applied:
    """Run exactly `plan.steps`, in order, each journaled (`run_step`); on failure stop what started and restore
    the prior deployment the plan names. Raises what failed (amended with what was restored); a state-directory
    failure as LedgerError (exit 6)."""
    record = new_record(c, profile, result, plan, command)
    j = ApplyJournal(c, record)
    prior = plan.prior
    c.ledger.save(record)      # the first write: a full disk here stops the command before any effect
    run = Run(c, profile, result, plan, record, j, c.runtimes(record.id),
              boot_timeout_s=boot_timeout_s or profile.lifecycle.boot_timeout_s)
    try:
        for step in plan.steps:
            run_step(run, step, contract)
        rank0 = next((w for w in run.booted.watches if w.spec.rank == 0), None) if run.booted else None
        return Applied(record, rank0.cap_line if rank0 else None)
    except (PreflightError, ImageError) as exc:   # preflight or image steps: nothing was changed yet
        record.status, record.finished, record.elapsed_s = Status.FAILED, now_iso(), run.total.elapsed()
        record.failure = Failure(step=_failed_step(record), message=exc.render())
        if isinstance(exc, PreflightError) and exc.checks:
            record.preflight = list(exc.checks)
        j.save()
        raise
    except (Exception, KeyboardInterrupt) as exc:
        interrupted = isinstance(exc, KeyboardInterrupt)
        disk = j.disk_error if j.disk_error is not None else (exc if isinstance(exc, LedgerError) else None)
        step_name = _failed_step(record)
        message = f"interrupted ({interrupt_name(exc)})" if interrupted else (
            exc.render() if isinstance(exc, SparkctlError) else f"internal error: {type(exc).__name__}: {exc}")
        record.status = Status.CANCELED if interrupted else Status.FAILED
        record.finished, record.elapsed_s = now_iso(), run.total.elapsed()
        record.failure = Failure(step=step_name, message=message, node=getattr(exc, "node", None))
        record.handles = record.handles or [h for _, h in run.started]
        j.save()
        if no_rollback and not interrupted and disk is None:
            c.reporter.event("--no-rollback: leaving the failed engines as they are for inspection")
            record.rollback = "skipped (--no-rollback)"
            j.save()
            raise
        boundary(contract, STOP_NEW, "before")
        stop_started(c, run.started, sweep=record.id)
        boundary(contract, STOP_NEW, "after")
        record.rollback = "new engines stopped"
        try:
            if run.stopped_prior and prior:
                record.restoring = prior.id     # a SIGKILL from here on: the next command settles it
                j.save()
                outcome = restore(c, prior, record, command=contract, save=disk is None and j.disk_error is None)
                record.restored, record.restore_error = outcome.restored, outcome.error
                record.restoring = None
        finally:
            j.save()
            with contextlib.suppress(SparkctlError, OSError):   # a cache: rebuilt by the next command that has room
                c.ledger.sync_index()
        disk = disk if disk is not None else j.disk_error     # the disk may have failed during the undo
        if record.restored:
            said = f"; restored {record.restored}"
        elif record.restore_error:
            said = f"; restoring {prior.id if prior else '?'} FAILED: {record.restore_error}"
        else:
            said = "; nothing to restore (no previous deployment)" if not prior else ""
        if disk is not None:
            raise disk.amended(message=f"{disk.message} (during {step_name}: the new engines were stopped"
                                       f"{said})") from exc
        if interrupted or not isinstance(exc, SparkctlError):
            raise   # Ctrl-C, or a bug in sparkctl: its traceback goes to the CLI's debug log
        raise exc.amended(message=exc.message + said) from exc
