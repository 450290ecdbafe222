"""The commands on one TP group: up, rollback, down, status, repair, the compare transaction. The CLI reaches
them through `deploy.door`, which decides between this and the replicated deployment (bench, tune and the
watcher still call `Deployer` directly).

Every command that changes the cluster takes the lock, checks the state directory has room, observes and
settles what a dead controller left (settle), and only then plans from what it observed: a no-op
("unchanged") is decided after settling, from health measured then, and the plan's deployment id is the one
`apply` creates. Results are typed (`deploy.results`). Example::

    Deployer(resolve_inventory(None), Reporter()).up(load_profile("d5"), UpOptions())
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile, load_profile
from sparkctl.deploy import compare
from sparkctl.deploy.apply import apply, own_ports, run_checks
from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.image_stage import survey
from sparkctl.deploy.plan import Plan, make_plan
from sparkctl.deploy.progress import Reporter
from sparkctl.deploy.results import Concurrency, DownPlanResult, DownResult, PlanView, StatusResult, UpResult
from sparkctl.deploy.rollback import no_target_error, rollback_target
from sparkctl.deploy.runtimes import Runtimes
from sparkctl.deploy.settle import Settled, settle
from sparkctl.deploy.status import down as down_cmd
from sparkctl.deploy.status import plan_down
from sparkctl.deploy.status import status as status_cmd
from sparkctl.deploy.steps import (
    ARM_COMMAND,
    COMPARE_ARM,
    COMPARE_COMMAND,
    COMPARE_RESTORE,
    RESTORE_COMMAND,
    SETTLE,
    TRANSACTION_COMMANDS,
    boundary,
)
from sparkctl.errors import CancelledError, ConfigError, SparkctlError
from sparkctl.sglang.render import RenderResult
from sparkctl.state.ledger import Ledger
from sparkctl.state.records import CheckResult, DeploymentRecord

if TYPE_CHECKING:
    from sparkctl.deploy.repair import RepairPlan

CAP_SETTING = ("server.mamba_full_memory_ratio or server.max_mamba_cache_size in the profile "
               "(--mamba-full-memory-ratio / --max-mamba-cache-size), or server.mamba_ssm_dtype: bfloat16")


@dataclass
class UpOptions:
    dry_run: bool = False
    no_rollback: bool = False
    boot_timeout_s: float | None = None
    confirm: Callable[[Plan], bool] | None = None   # None: proceed without asking
    base_of: str | None = None     # rollback: the engine tag the target ran; its base is planned on (image_stage)


def _contract_of(command: str) -> str:
    return command if command in ("up", "rollback") else "up"


class Deployer:
    """The commands on one cluster; `cluster` (deploy/cluster.py) is the context every layer below shares."""

    def __init__(self, inventory: Inventory, reporter: Reporter | None = None, ledger: Ledger | None = None) -> None:
        self.cluster = Cluster(inventory, reporter, ledger)

    # the context, for callers that read it (bench arms, the test rig)
    @property
    def inventory(self) -> Inventory:
        return self.cluster.inventory

    @property
    def ledger(self) -> Ledger:
        return self.cluster.ledger

    @property
    def reporter(self) -> Reporter:
        return self.cluster.reporter

    @property
    def embedded_notice(self) -> str | None:
        return self.cluster.embedded_notice

    def runtimes(self, dep_id: str) -> Runtimes:
        return self.cluster.runtimes(dep_id)

    # -- plan (read-only) --------------------------------------------------------------------------------------
    def plan(self, profile: Profile, *, base_of: str | None = None, command: str = "up") -> tuple[RenderResult, Plan]:
        """What `up` would do against what runs now: the rendered launch and the steps (or a no-op; never onto a
        comparison or tune arm, unless `command` is another arm)."""
        c = self.cluster
        result = c.render(profile)
        active = c.ledger.active()
        healthy, detail = (c.health_of(active)[:2] if active else (False, ""))
        dep_id = c.ledger.new_id(profile.name)
        rts = c.runtimes(dep_id)
        images = survey(profile, c.inventory, result, base_of=base_of)
        if images.launch is not None:
            rts.bind_launch(images.launch)       # the boot preview shows the launch image's docker run
        known_good = c.ledger.known_good()
        plan = make_plan(result, active, healthy, detail, deployment_id=dep_id, images=images,
                         own_ports=frozenset(own_ports(active)),
                         prior_known_good=known_good.id if known_good else None,
                         start_preview=lambda spec: rts.for_node(spec.node).launch_argv(spec, dep_id),
                         arm_is_ours=command == ARM_COMMAND)
        return result, plan

    def preflight(self, profile: Profile) -> list[CheckResult]:
        """Read-only checks on every node for this profile (what `up` runs first); raises PreflightError."""
        c = self.cluster
        result = c.render(profile)
        c.reporter.stage("preflight", f"profile {profile.name}: {len(result.specs)} nodes in parallel")
        return run_checks(c, result, c.runtimes("preflight"), own_ports(c.ledger.active()))

    # -- up / rollback -----------------------------------------------------------------------------------------
    def up(self, profile: Profile, opts: UpOptions, *, command: str = "up") -> UpResult:
        """Deploy `profile` (module docstring for the order). Raises PreflightError (nothing changed),
        DeployError, LedgerError (exit 6: state directory full or damaged), LockHeldError, CancelledError."""
        c, r = self.cluster, self.cluster.reporter
        contract = _contract_of(command)      # whose step list and crash points (deploy/steps.py)
        r.stage("plan", f"profile {profile.name} on cluster {c.name}"
                        + (" (embedded, emulated engine)" if c.inventory.embedded else ""))
        base = dict(profile=profile.name, emulated=c.inventory.emulated, cluster=c.name)
        if opts.dry_run:
            result, plan = self.plan(profile, base_of=opts.base_of)
            self._say_plan(result, plan, commands=True)
            return UpResult(**base, changed=False, outcome="dry-run", plan=_view(plan),
                            reason=plan.noop_reason, endpoint=c.endpoint(result.specs[0]))
        with c.ledger.lock(command):
            c.check_room()
            boundary(contract, SETTLE, "before")
            settled = settle(c, command)
            boundary(contract, SETTLE, "after")
            if command not in TRANSACTION_COMMANDS:
                self._settle_compare()
            result, plan = self.plan(profile, base_of=opts.base_of, command=command)   # from what runs now
            self._say_plan(result, plan, commands=False)
            endpoint = c.endpoint(result.specs[0])
            if plan.noop:
                if command == RESTORE_COMMAND:
                    compare.end(c)
                return UpResult(**base, changed=False, outcome="unchanged", reason=plan.noop_reason,
                                plan=_view(plan), deployment=plan.active_id, endpoint=endpoint, settled=settled,
                                next_commands=_next(endpoint))
            if opts.confirm is not None and not opts.confirm(plan):
                raise CancelledError("cancelled at the confirmation prompt; nothing was changed")
            if command == ARM_COMMAND:
                compare.begin(c, plan.deployment_id)
            step = {ARM_COMMAND: COMPARE_ARM, RESTORE_COMMAND: COMPARE_RESTORE}.get(command)
            if step:
                boundary(COMPARE_COMMAND, step, "before")
            applied = apply(c, profile, result, plan, command=command, contract=contract, no_rollback=opts.no_rollback,
                            boot_timeout_s=opts.boot_timeout_s)
            if step:
                boundary(COMPARE_COMMAND, step, "after")
            if command == RESTORE_COMMAND:
                compare.end(c)
        rec = applied.record
        cap = _concurrency(rec, applied.cap_line)
        if cap is not None:
            r.event(f"note: the engine serves at most {cap.max_running_requests} request(s) at once: "
                    f"{cap.reason} (raise it with {cap.setting})")
        return UpResult(**{**base, "emulated": rec.emulated}, changed=True, outcome="deployed", plan=_view(plan),
                        deployment=rec.id, endpoint=rec.endpoint, capacity=rec.capacity, concurrency=cap,
                        gates=rec.gates, steps=[s.model_dump(mode="json") for s in rec.steps], warmup=rec.warmup,
                        elapsed_s=rec.elapsed_s, settled=settled, next_commands=_next(rec.endpoint))

    def _say_plan(self, result: RenderResult, plan: Plan, *, commands: bool) -> None:
        for w in result.warnings:
            self.reporter.event(f"warning: {w}")
        for line in plan.lines(commands=commands):
            self.reporter.event(line)

    def _settle_compare(self) -> None:
        """A comparison whose controller died: its arm is never a rollback target; this command decides what
        runs next, so the marker is cleared with a line saying so."""
        left = compare.unfinished(self.cluster)
        if left is not None:
            self.reporter.event(f"{left.describe()}; `sparkctl` settles it now (the arm is never a rollback "
                                f"target; `sparkctl rollback` returns to {left.original or 'nothing'})")
            compare.end(self.cluster)

    def rollback_target(self, avoid_identity: str | None = None) -> DeploymentRecord | None:
        return rollback_target(self.ledger, avoid_identity)

    def rollback(self, to: Profile | None, opts: UpOptions, *, failing: DeploymentRecord | None = None) -> UpResult:
        """Deploy `to`, or the profile of the previous known-good deployment (never a bench arm), or, with no
        known-good history, the active profile's `rollback_profile`. Same steps and guarantees as `up`.
        `failing` (the watcher's crash loop): the deployment that keeps failing, never the target, nor any of its
        launch identity; its `rollback_profile` when nothing else is known-good."""
        if to is None:
            target = self.rollback_target(failing.identity if failing else None)
            if target is not None:
                self.reporter.stage("rollback", f"rolling back to {target.id} ({target.profile})")
                to = target.deployed_profile()
                engine = {v.engine_tag for v in target.images.values()} - {None}
                if len(engine) == 1:       # the images it ran, even when its base tag names another image now
                    opts = replace(opts, base_of=engine.pop())
            else:
                active = self.ledger.active() or failing
                name = (active.profile_data.get("rollback_profile") if active else None)
                if not name:
                    raise no_target_error(self.ledger)
                self.reporter.stage("rollback", f"no earlier known-good deployment: going to {name}, the "
                                                f"rollback_profile of {active.profile if active else '?'}")
                to = load_profile(name)
        return self.up(to, opts, command="rollback")

    # -- down / status / repair --------------------------------------------------------------------------------
    def settle(self, command: str) -> Settled:
        return settle(self.cluster, command)

    def down(self) -> DownResult:
        with self.ledger.lock("down"):
            result = down_cmd(self.cluster)
            compare.end(self.cluster)
            return result

    def plan_down(self) -> DownPlanResult:
        """What `down` would do, read without the lock (as `status`): nothing is changed."""
        return plan_down(self.cluster)

    def status(self) -> StatusResult:
        left = compare.unfinished(self.cluster)
        return status_cmd(self.cluster, unfinished_compare=left.describe() if left else None)

    def plan_repair(self) -> RepairPlan:
        from sparkctl.deploy.repair import plan_repair
        return plan_repair(self.cluster)

    def apply_repair(self, plan: RepairPlan) -> None:
        from sparkctl.deploy.repair import apply_repair
        apply_repair(self.cluster, plan)

    # -- logs (read-only) --------------------------------------------------------------------------------------
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
        yield from follow_reader(lambda offset: rt.read_log(handle, offset), tail=tail, follow=follow, poll_s=poll_s)


def follow_reader(read: Callable[[int], tuple[str, int]], *, tail: int, follow: bool,
                  poll_s: float) -> Iterator[str]:
    """`sparkctl logs` over a log reader (offset -> (complete new lines, next offset)): the last `tail` lines (0: all),
    then with `follow` each new piece as it comes, until the caller stops."""
    text, offset = read(0)
    lines = text.splitlines()
    yield "\n".join(lines[-tail:] if tail else lines) + ("\n" if lines else "")
    while follow:
        time.sleep(poll_s)
        text, offset = read(offset)
        if text:
            yield text


def _view(plan: Plan) -> PlanView:
    return PlanView.model_validate(plan.as_dict())


def _next(endpoint: str) -> list[str]:
    return [f"curl {endpoint}/v1/models", "sparkctl status", "sparkctl bench", "sparkctl logs --rank 0 --follow",
            "sparkctl down"]


def _concurrency(rec: DeploymentRecord, cap_line: str | None) -> Concurrency | None:
    cap = rec.capacity.max_running_requests if rec.capacity else None
    if cap_line is None or cap is None:
        return None
    return Concurrency(max_running_requests=int(cap), reason=cap_line, setting=CAP_SETTING)
