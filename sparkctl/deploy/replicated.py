"""Replicated deployments (`replicas: K` in the profile): K replicas behind SGLang's router, rolled one at a time.

Each replica is a cluster of its own, `<cluster>.r<i>` (its `server.tp_size` nodes, its own ledger, lock and
journal; a '.' is never in a cluster name the inventory accepts, so a replica's state and containers cannot be
another cluster's), deployed by the ordinary `up`: its steps, its gates, its restore when it fails. A replicated
`up` is more steps around those: typed steps (`deploy.plan.ReplicatedStep`) in a `ReplicatedPlan`, run by the
lifecycle's own `deploy.apply.run_step` (this module adds their runners to `apply.RUNNERS`), journaled with the
lifecycle's `JournalEntry` in the parent cluster's `replicated.json` (mode 0600), each with the lifecycle's crash
boundaries (`deploy.steps.REPLICATED_STEPS`):

    settle          the parent's single-group deployment, if one is active, goes down first
    router-start    the router on rank 0's node (a local process on the embedded cluster, a container from the
                    engine image on Sparks), unless it runs; started just before the first replica-attach (on a
                    first `up` rank 0 has the engine image only after a replica's image stage), or after the
                    replicas if none changed
    for each replica i, in order (on a first `up`, when no replica is in the router yet, every replica's
    `up` runs at once: there is no traffic to keep serving; attach follows in order):
      replica-detach  out of the router, its in-flight requests drained (bounded: router.drain_timeout_s)
      replica-up      its own `up` (a no-op when it already runs this profile and is healthy: then no detach)
      replica-attach  back into the router once its gates passed (a replica whose `up` failed was restored
                      alone by that `up`; it goes back into the router and the roll stops with the error)
    router-gates    the router ready with every replica healthy, one generation through it
    hand-off        the router's endpoint is the one handed off

A controller killed anywhere in between leaves every step re-runnable: detach and attach are idempotent, a
replica's `up` settles its own journal, and the next `up` converges from what runs. What an `up` stopped mid-way
leaves (by a signal: it settles itself; killed: the next `up`'s settle step) is decided in one place,
`deploy.settle.settle_replicated`.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from pydantic import ValidationError

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.deploy.apply import RUNNERS, run_step
from sparkctl.deploy.commands import Deployer, UpOptions, follow_reader
from sparkctl.deploy.plan import (
    Plan,
    ReplicaAttach,
    ReplicaDetach,
    ReplicatedStep,
    ReplicaUp,
    RouterGates,
    RouterHandOff,
    RouterStart,
    SettleReplicated,
    Step,
)
from sparkctl.deploy.progress import Reporter
from sparkctl.deploy.results import (
    ReplicaStatus,
    ReplicatedDownResult,
    ReplicatedStatusResult,
    ReplicatedUpResult,
    RouterStatus,
    refusing,
    watcher_of,
)
from sparkctl.deploy.settle import open_steps, settle_replicated
from sparkctl.deploy.steps import REPLICATED_COMMAND as COMMAND
from sparkctl.errors import ConfigError, LedgerError, LockHeldError, SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.nodes.fanout import fan_out
from sparkctl.nodes.process import read_lines
from sparkctl.router import RouterError, strip_colour
from sparkctl.router import launch as router_launch
from sparkctl.router.client import RouterClient, Worker, attach, detach, drain, engine_in_flight
from sparkctl.router.replicas import Replica, render_replicas, replica_cluster, router_endpoint, router_spec
from sparkctl.router.spec import RouterSpec
from sparkctl.sglang.launch import redact
from sparkctl.state.controller import controller_alive, this_controller
from sparkctl.state.ledger import Ledger, now_iso
from sparkctl.state.records import CheckResult, JournalEntry, ReplicatedRecord
from sparkctl.statefiles import open_state_file, private_dir, state_dir_error, write_json_atomic

RECORD = "replicated.json"
MAX_LOG_READ = 64 * 1024 * 1024     # one read of the router's log file (a follow reads on from there)


def _progress(rec: Record) -> str | None:
    """"`sparkctl up` in progress (pid P on H, since T)" while the `up` that set status "updating" lives;
    "interrupted: ..." once its controller is gone; None when the record is settled."""
    ctl = rec.data.get("controller")
    if rec.data.get("status") != "updating" or not isinstance(ctl, dict):
        return None
    who = f"pid {ctl.get('pid')} on {ctl.get('host')}, since {ctl.get('since')}"
    if controller_alive(ctl):
        return f"`sparkctl up` in progress ({who})"
    return (f"interrupted: the `sparkctl up` that was updating it is gone ({who}); the next `sparkctl up` "
            f"converges, `sparkctl down` stops it")


def _dead_controller(rec: Record) -> str | None:
    """"controller pid P on H gone" when the `up` that set status "updating" died (None: settled, or alive)."""
    ctl = rec.data.get("controller")
    if rec.data.get("status") != "updating" or not isinstance(ctl, dict) or controller_alive(ctl):
        return None
    return f"controller pid {ctl.get('pid')} on {ctl.get('host')} gone"


def sub_inventory(rep: Replica, parent: str, name: str | None = None) -> Inventory:
    """The replica's own inventory: its nodes, named `name` (default `replica_cluster(parent, index)`)."""
    return _named(rep.inventory, name or replica_cluster(parent, rep.index), rep.nodes)


def _recorded_name(rec: Record, index: int) -> str | None:
    """The name a replica was deployed under (kept: its ledger and engines are there)."""
    return next((r.get("cluster") for r in rec.data.get("replicas", []) if r.get("index") == index), None)


@dataclass
class Record:
    """What the parent cluster's state directory holds for a replicated deployment."""
    path: Path
    data: JSONObject = field(default_factory=dict)

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def load(cls, root: Path) -> Record:
        """The record, checked against `ReplicatedRecord` (a wrong shape is a LedgerError naming the file)."""
        path = root / RECORD
        hint = "run `sparkctl repair`, or move the file aside if no replica runs"
        try:
            with os.fdopen(open_state_file(path, os.O_RDONLY), "rb") as fh:   # never through a planted symlink
                data = json.loads(fh.read())
        except FileNotFoundError:
            return cls(path, {})
        except RecursionError:
            raise LedgerError("the replicated deployment's record is corrupt: nested too deep", where=str(path),
                              hint=hint) from None
        except OSError as exc:           # not a directory, unreadable: the state directory's error (exit 6)
            raise state_dir_error(root, exc) from None
        except ValueError as exc:
            raise LedgerError(f"the replicated deployment's record is corrupt: {exc}", where=str(path),
                              hint=hint) from None
        if not isinstance(data, dict):
            raise LedgerError("the replicated deployment's record is not a JSON object", where=str(path), hint=hint)
        try:
            model = ReplicatedRecord.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "(top)"
            raise LedgerError(f"the replicated deployment's record has the wrong shape at {where}: {first['msg']}",
                              where=str(path), hint=hint) from None
        return cls(path, model.model_dump(mode="json"))

    def save(self) -> None:
        """Written only as a valid `ReplicatedRecord` (atomic, mode 0600); one writer at a time (parallel replicas)."""
        with self._lock:
            doc = ReplicatedRecord.model_validate(self.data).model_dump(mode="json")
            if doc.get("profile_data") is None:      # a record from before it was kept stays as it was written
                doc.pop("profile_data", None)
            private_dir(self.path.parent)
            write_json_atomic(self.path, doc)

    def journal(self, step: str, phase: str, what: str, replica: int | None = None, detail: str | None = None) -> None:
        with self._lock:
            entry = JournalEntry(step=step, phase=phase, at=now_iso(), what=what, replica=replica, detail=detail)
            self.data.setdefault("journal", []).append(entry.model_dump(mode="json"))
        self.save()

    @property
    def active(self) -> bool:
        return self.data.get("status") in ("active", "updating", "failed")   # failed: its replicas still run


@dataclass(frozen=True)
class ReplicaMove:
    """One replica in a replicated `up`: its own plan, and the router's entry for it (None: not listed)."""

    replica: Replica
    sub: Deployer
    plan: Plan
    listed: Worker | None

    @property
    def unchanged(self) -> bool:
        """Already runs this profile, healthy, and healthy in the router: nothing to do, not even a drain."""
        return self.plan.noop and self.listed is not None and self.listed.healthy


@dataclass(frozen=True)
class ReplicatedPlan:
    """A replicated `up` as data: the router and each replica's move, made once from what runs now, and the
    typed steps (`deploy.plan.ReplicatedStep`) that `deploy.apply.run_step` runs, in order."""

    profile: Profile
    replicas: list[Replica]
    spec: RouterSpec
    router: router_launch.Router | None          # ours, running (None: it starts before the first attach)
    client: RouterClient
    moves: list[ReplicaMove]
    parallel: bool                               # a first `up`: every replica's own `up` at once
    endpoint: str
    steps: tuple[ReplicatedStep, ...] = ()

    def move(self, index: int) -> ReplicaMove:
        return next(m for m in self.moves if m.replica.index == index)

    def lines(self) -> list[str]:
        spec, drain_s = self.spec, self.profile.router.drain_timeout_s
        lines = [f"router {spec.url} ({spec.policy}): " + (f"running ({self.router.where})" if self.router
                                                           else "start")]
        for m in self.moves:
            rep = m.replica
            head = f"replica {rep.index} ({', '.join(rep.nodes)}, {rep.url})"
            if m.unchanged:
                lines.append(f"{head}: unchanged ({m.plan.noop_reason})")
                continue
            if m.listed is not None:
                lines.append(f"{head}: out of the router, drain (at most {drain_s:g}s)")
            lines += [f"{head}: {line}" for line in m.plan.lines()]
            lines.append(f"{head}: back into the router once its gates pass")
        lines.append(f"router gates, then hand off {self.endpoint}")
        return lines


def replicated_steps(profile: Profile, spec: RouterSpec, moves: list[ReplicaMove], *, router_runs: bool,
                     parallel: bool, endpoint: str) -> tuple[ReplicatedStep, ...]:
    """The steps of a replicated `up` after its settle: per changed replica detach (when rolling), its own `up`,
    attach; the router started just before the first attach (or before the gates, when no replica changed);
    the router's gates; the hand-off. On a first `up` (`parallel`) every replica's `up` comes first, together."""
    drain_s = profile.router.drain_timeout_s
    out: list[ReplicatedStep] = []
    pending = [not router_runs]

    def router_first() -> None:
        if pending[0]:
            out.append(RouterStart(what=f"start the router on {spec.url} ({spec.policy})"))
            pending[0] = False

    def up(rep: Replica) -> ReplicaUp:
        return ReplicaUp(what=f"replica {rep.index}: up {profile.name} on {', '.join(rep.nodes)}",
                         replica=rep.index, together=parallel)

    def attach_(rep: Replica) -> ReplicaAttach:
        return ReplicaAttach(what=f"replica {rep.index}: back into the router", replica=rep.index, url=rep.url)
    todo = [m.replica for m in moves if not m.unchanged]
    if parallel:
        out += [up(rep) for rep in todo]
    for m in moves:
        rep = m.replica
        if m.unchanged:
            continue
        if not parallel:
            already = "" if m.listed is not None else " already"
            out += [ReplicaDetach(what=f"replica {rep.index}: out of the router{already}, drain (at most "
                                       f"{drain_s:g}s)", replica=rep.index, url=rep.url, drain_s=drain_s,
                                  listed=m.listed is not None), up(rep)]
        router_first()
        out.append(attach_(rep))
    router_first()           # every replica unchanged but the router gone: it comes back with all of them
    out += [RouterGates(what=f"router ready with {len(moves)} healthy replicas; a generation through it"),
            RouterHandOff(what=f"hand off {endpoint}")]
    return tuple(out)


@dataclass
class ReplicatedRun:
    """One replicated `up` in progress: what its steps share. `deploy.apply.run_step` runs each step, journaling
    intent and outcome in the record's journal (`opened`/`closed`)."""

    deployer: ReplicatedDeployer
    rec: Record
    profile: Profile
    opts: UpOptions
    reps: list[Replica]
    spec: RouterSpec
    plan: ReplicatedPlan | None = None
    router: router_launch.Router | None = None       # ours, running
    deployed: list[int] = field(default_factory=list)  # replicas whose own `up` deployed

    @property
    def reporter(self) -> Reporter:
        return self.deployer.reporter

    @property
    def client(self) -> RouterClient:
        return self.planned.client

    @property
    def planned(self) -> ReplicatedPlan:
        if self.plan is None:
            raise TypeError("a replicated step that needs the plan ran before it was made")
        return self.plan

    def opened(self, step: Step) -> None:
        self.rec.journal(step.name, "intent", step.what, _replica_of(step))

    def closed(self, step: Step, error: BaseException | None) -> None:
        if error is None:
            self.rec.journal(step.name, "ok", step.what, _replica_of(step))
        else:
            self.rec.journal(step.name, "failed", step.what, _replica_of(step),
                             error.render() if isinstance(error, SparkctlError) else repr(error))

    def settle(self, journal: list[JournalEntry], replicas: list[tuple[int, str]], *, died: bool) -> list[int]:
        """`settle.settle_replicated` against the router of ours that runs now (none: nothing to put back)."""
        if router_launch.recorded_router(self.deployer.inventory, self.spec, self.rec.data.get("router")) is None:
            return settle_replicated(journal, replicas, died=died, serves=_serves, out_of_router=None, attach=str,
                                     write=self.rec.journal)
        client = RouterClient(self.spec.url, metrics_url=self.spec.metrics_url)
        return settle_replicated(journal, replicas, died=died, serves=_serves,
                                 out_of_router=lambda url: client.find(url) is None,
                                 attach=lambda url: attach(client, url), write=self.rec.journal)


def _replica_of(step: Step) -> int | None:
    return step.replica if isinstance(step, ReplicatedStep) else None


# ---- what each replicated step does (`deploy.apply.RUNNERS` dispatches on the step's class) --------------------
def run_settle_replicated(run: ReplicatedRun, step: SettleReplicated) -> None:
    if step.left is not None:
        journal = [JournalEntry.model_validate(e) for e in run.rec.data.get("journal", [])]
        cut = ", ".join(f"{e.step}" + (f" of replica {e.replica}" if e.replica is not None else "")
                        for e in open_steps(journal)) or "between steps"
        run.reporter.event(f"the last `sparkctl up` of this replicated deployment was interrupted ({step.left}) "
                           f"during {cut}: settling it")
        back = run.settle(journal, list(step.replicas), died=True)
        if back:
            run.reporter.event(f"replica(s) {', '.join(map(str, back))} back into the router")
    if Ledger.for_cluster(run.deployer.inventory.cluster.name).active() is not None:   # a single group here
        run.reporter.event("the cluster runs a single-group deployment: it goes down first")


def run_router_start(run: ReplicatedRun, step: RouterStart) -> None:
    if run.router is not None:
        return
    from sparkctl.deploy.router_image import router_image
    inv, spec = run.deployer.inventory, run.spec
    log = run.deployer.ledger.root / "logs" / "router.log"
    try:
        proc = router_launch.start_router(inv, spec, image=router_image(run.profile, inv, run.reps[0].result),
                                          log_path=log)
        run.rec.data["router"] = {**proc.to_dict(), "url": spec.url, "metrics_url": spec.metrics_url}
        run.rec.save()
    except BaseException:
        # Whatever failed or interrupted (Ctrl-C can land between the router's start and its record), no router of
        # this cluster outlives the step unrecorded: what runs is found by its log or label and stopped.
        router_launch.stop_router(inv, None, log=log, timeout_s=10)
        run.rec.data.pop("router", None)
        raise
    run.router = proc


def run_replica_detach(run: ReplicatedRun, step: ReplicaDetach) -> None:
    if step.listed:
        detach(run.client, step.url, drain_s=step.drain_s)
    else:       # already out of the router (a controller killed mid-drain): its requests still finish first
        drain(lambda: engine_in_flight(step.url), timeout_s=step.drain_s, what=f"replica {step.url}")


def run_replica_up(run: ReplicatedRun, step: ReplicaUp) -> None:
    move = run.planned.move(_index(step))
    res = move.sub.up(move.replica.result.profile, UpOptions(boot_timeout_s=run.opts.boot_timeout_s))
    if res.changed:
        run.deployed.append(move.replica.index)


def run_replica_attach(run: ReplicatedRun, step: ReplicaAttach) -> None:
    attach(run.client, step.url)


def run_router_gates(run: ReplicatedRun, step: RouterGates) -> None:
    try:
        router_gates(run.client, run.spec, run.reps, run.profile.lifecycle.health_timeout_s)
    except RouterError as exc:         # the router's own words go with it
        try:
            tail = run.router.log_tail() if run.router is not None else ""
        except SparkctlError:
            tail = ""
        if not tail:
            raise
        raise RouterError(exc.message, where=exc.where, hint=exc.hint, evidence="\n".join(
            x for x in (exc.evidence, "router log (last lines):\n" + tail) if x)) from exc


def run_router_hand_off(run: ReplicatedRun, step: RouterHandOff) -> None:
    run.rec.data.update(status="active", handed_off=now_iso())
    run.rec.save()


def _index(step: ReplicatedStep) -> int:
    if step.replica is None:
        raise TypeError(f"{step.name}: a replica's step without its replica")
    return step.replica


RUNNERS.update({SettleReplicated: run_settle_replicated, RouterStart: run_router_start,
                ReplicaDetach: run_replica_detach, ReplicaUp: run_replica_up, ReplicaAttach: run_replica_attach,
                RouterGates: run_router_gates, RouterHandOff: run_router_hand_off})


class ReplicatedDeployer:
    parallel_first_up = True      # False: a first up goes one replica at a time too (the benchmark's baseline)

    def __init__(self, inventory: Inventory, reporter: Reporter | None = None) -> None:
        self.inventory = inventory
        self.reporter = reporter or Reporter(quiet=True)
        self.ledger = Ledger.for_cluster(inventory.cluster.name)

    def _sub(self, rep: Replica, rec: Record) -> Deployer:
        return Deployer(sub_inventory(rep, self.inventory.cluster.name, _recorded_name(rec, rep.index)),
                        self.reporter)

    def _router(self, rec: Record, spec: RouterSpec) -> router_launch.Router | None:
        return router_launch.recorded_router(self.inventory, spec, rec.data.get("router"))

    # ---- plan (read-only) ------------------------------------------------------------------------------------
    def make_plan(self, profile: Profile, rec: Record) -> ReplicatedPlan:
        """What a replicated `up` of `profile` does from what runs now: the router (ours, running, or to start)
        and, per replica, its own plan (`deploy.plan.Plan`) and whether the router lists it, as typed steps.
        `up` runs this plan; `up --dry-run` prints it (`ReplicatedPlan.lines`)."""
        reps = render_replicas(profile, self.inventory)
        spec = router_spec(profile, self.inventory, reps)
        router = self._router(rec, spec)
        client = RouterClient(spec.url, metrics_url=spec.metrics_url)
        moves = []
        for rep in reps:
            sub = self._sub(rep, rec)
            _, plan = sub.plan(rep.result.profile)
            moves.append(ReplicaMove(rep, sub, plan, client.find(rep.url) if router is not None else None))
        todo = [m for m in moves if not m.unchanged]
        # Nothing in the router: nothing serves through it, so there is no traffic to keep: all at once.
        parallel = self.parallel_first_up and len(todo) > 1 and (router is None or not client.list_workers())
        endpoint = router_endpoint(profile, self.inventory)
        return ReplicatedPlan(profile, reps, spec, router, client, moves, parallel, endpoint,
                              replicated_steps(profile, spec, moves, router_runs=router is not None,
                                               parallel=parallel, endpoint=endpoint))

    def preflight(self, profile: Profile) -> list[CheckResult]:
        """Read-only checks of every replica's ranks, each through its own cluster as its `up` runs them, after
        the layout (replicas and the router: no two listeners on one address and port); raises PreflightError."""
        reps = render_replicas(profile, self.inventory)
        router_spec(profile, self.inventory, reps)
        rec = Record.load(self.ledger.root)
        return [c for rep in reps for c in self._sub(rep, rec).preflight(rep.result.profile)]

    def plan_lines(self, profile: Profile) -> list[str]:
        """What `up` would do, replica by replica (each replica's own plan under its steps); nothing is changed."""
        return self.make_plan(profile, Record.load(self.ledger.root)).lines()

    # ---- up --------------------------------------------------------------------------------------------------
    def up(self, profile: Profile, opts: UpOptions | None = None) -> ReplicatedUpResult:
        """Settle, plan, then run the plan's steps through `deploy.apply.run_step`, journaled in `replicated.json`.
        Ctrl-C, SIGTERM or SIGHUP at any step (each replica's own `up` already stopped or restored what it
        started): `settle.settle_replicated` puts every replica that serves back into the router when ours
        runs, and the record is not left "updating". A second signal exits at once; the next `up` converges."""
        reps = render_replicas(profile, self.inventory)
        spec = router_spec(profile, self.inventory, reps)
        run = ReplicatedRun(self, Record(self.ledger.root / RECORD), profile, opts or UpOptions(), reps, spec)
        try:
            return self._up(run)
        except KeyboardInterrupt:
            rec = Record.load(self.ledger.root)
            if rec.data.get("status") == "updating":
                run.rec = rec
                run.settle([JournalEntry.model_validate(e) for e in rec.data.get("journal", [])],
                           [(r.index, r.url) for r in reps], died=False)
                rec.data["status"] = "failed"
                rec.save()
            raise

    def _up(self, run: ReplicatedRun) -> ReplicatedUpResult:
        t0 = time.monotonic()
        profile, reps, spec = run.profile, run.reps, run.spec
        with self.ledger.lock(COMMAND):
            rec = run.rec = Record.load(self.ledger.root)
            settle = SettleReplicated(what="settle what runs on the cluster's nodes", left=_dead_controller(rec),
                                      replicas=tuple((r["index"], r["url"]) for r in rec.data.get("replicas", [])))
            if self._router(rec, spec) is None:     # none of ours runs: its ports must be free before anything boots
                router_launch.check_ports(self.inventory, spec)
            rec.data.update(profile=profile.name, profile_data=profile.model_dump(mode="json"),
                            endpoint=router_endpoint(profile, self.inventory),
                            replicas=[{"index": r.index, "url": r.url, "nodes": r.nodes,
                                       "cluster": _recorded_name(rec, r.index)
                                       or replica_cluster(self.inventory.cluster.name, r.index)} for r in reps],
                            status="updating", started=now_iso(),
                            controller=this_controller(COMMAND, now_iso()).model_dump(mode="json"))
            rec.save()
            run_step(run, settle, COMMAND)
        parent = Deployer(self.inventory, self.reporter)
        if parent.ledger.active() is not None:
            parent.down()          # its own lock and steps
        with self.ledger.lock(COMMAND):
            planned = run.plan = self.make_plan(profile, rec)       # under the lock, from what runs now
            run.router = planned.router
            for move in planned.moves:
                if move.unchanged:
                    self.reporter.event(f"replica {move.replica.index} ({', '.join(move.replica.nodes)}): "
                                        f"unchanged, in the router")
            self._apply(run, planned)
        started = planned.router is None and run.router is not None and not run.router.kept
        moved = bool(run.deployed) or started
        return ReplicatedUpResult(outcome="deployed" if moved else "unchanged", changed=moved,
                                  endpoint=rec.data["endpoint"], replicas=len(reps), updated=sorted(run.deployed),
                                  parallel=planned.parallel, profile=profile.name,
                                  cluster=self.inventory.cluster.name, emulated=self.inventory.emulated,
                                  elapsed_s=round(time.monotonic() - t0, 2),
                                  next_commands=next_commands(rec.data["endpoint"]))

    def _apply(self, run: ReplicatedRun, planned: ReplicatedPlan) -> None:
        """Run exactly `planned.steps`, each through `run_step`. The replicas of a first `up` boot at once (their
        `up` steps together, one thread each); each that serves is attached after, and the first error is
        raised once every one has finished and been attached. In a rolling update a replica whose `up` failed
        (restored alone by that `up`) goes back into the router and the roll stops with the error."""
        together = [s for s in planned.steps if isinstance(s, ReplicaUp) and s.together]
        errors: list[tuple[int, BaseException]] = []
        if together:
            self.reporter.event(f"no replica in the router yet: {len(together)} replicas boot at once")
            outcomes = fan_out(together, lambda s: run_step(run, s, COMMAND))   # a signal: every one stopped first
            errors = [(_index(o.item), o.error) for o in outcomes if o.error is not None]
        due: RouterStart | None = None     # the router starts just before the first attach of a replica that serves
        for step in planned.steps:
            if isinstance(step, ReplicaUp) and step.together:
                continue
            if isinstance(step, RouterStart):
                due = step
                continue
            if isinstance(step, ReplicaAttach):
                if not _serves(step.url):      # stays out of the router (the gates then say so)
                    continue
            elif errors:
                self._failed_together(run, planned, errors)
            if due is not None and isinstance(step, (ReplicaAttach, RouterGates)):
                run_step(run, due, COMMAND)
                due = None
            if isinstance(step, ReplicaUp):
                self._rolling_up(run, planned, step)
            else:
                run_step(run, step, COMMAND)

    def _rolling_up(self, run: ReplicatedRun, planned: ReplicatedPlan, step: ReplicaUp) -> None:
        try:
            run_step(run, step, COMMAND)
        except SparkctlError as exc:
            if isinstance(exc, (LedgerError, LockHeldError)):
                raise                # the state directory or a lock, not the replica: nothing to amend
            rep = planned.move(_index(step)).replica
            serves = _serves(rep.url)
            if serves:
                run_step(run, RouterStart(what=f"start the router on {run.spec.url} ({run.spec.policy})"), COMMAND)
                run_step(run, ReplicaAttach(what=f"replica {rep.index}: back into the router", replica=rep.index,
                                            url=rep.url), COMMAND)
            run.rec.data["status"] = "failed"
            run.rec.save()
            changed = [m.replica.index for m in planned.moves if not m.unchanged]
            done = changed[:changed.index(rep.index)]
            raise exc.amended(message=(
                f"replica {rep.index}: {exc.message} (the rolling update stopped there; replica "
                f"{rep.index} serves as before{' and is back in the router' if serves else ''}; "
                + (f"replica(s) {', '.join(map(str, done))} run {run.profile.name}" if done else
                   f"no replica runs {run.profile.name} yet") + ")")) from exc

    def _failed_together(self, run: ReplicatedRun, planned: ReplicatedPlan,
                         errors: list[tuple[int, BaseException]]) -> None:
        """A first `up`'s replicas have all finished and those that serve are in the router: the first error."""
        run.rec.data["status"] = "failed"
        run.rec.save()
        for _, err in errors:
            if not isinstance(err, SparkctlError) or isinstance(err, (LedgerError, LockHeldError)):
                raise err
        index, err = errors[0]
        assert isinstance(err, SparkctlError)
        todo = [m.replica.index for m in planned.moves if not m.unchanged]
        ok = [i for i in todo if i not in {e[0] for e in errors}]
        raise err.amended(message=(
            f"replica {index}: {err.message} (a first up of {len(todo)} replicas at once; "
            + (f"replica(s) {', '.join(map(str, ok))} run {run.profile.name} and are in the router" if ok else
               "no replica runs it") + (f"; {len(errors) - 1} more failed" if len(errors) > 1 else "") + ")")
        ) from err

    # ---- status / down ---------------------------------------------------------------------------------------
    def status(self) -> ReplicatedStatusResult:
        rec = Record.load(self.ledger.root)
        r = rec.data.get("router") or {}
        client = RouterClient(r["url"], metrics_url=r.get("metrics_url")) if r else None
        router: RouterStatus | None = None
        listed = {}
        if client is not None:
            h = client.health()
            router = RouterStatus(url=r["url"], kind=r.get("kind", "process"), live=h.live, ready=h.ready,
                                  healthy_workers=h.healthy_workers, total_workers=h.total_workers)
            if h.live:
                listed = {w.url: w for w in client.list_workers()}
                try:
                    m = client.metrics()
                    router.requests_per_replica = {u: w.requests for u, w in m.workers.items()}
                except RouterError:
                    pass
        healthy = bool(router and router.ready)
        views = []
        for rep in rec.data.get("replicas", []):
            st = Deployer(_named(self.inventory, rep["cluster"], rep["nodes"]), self.reporter).status()
            w = listed.get(rep["url"])
            views.append(ReplicaStatus(index=rep["index"], nodes=rep["nodes"], url=rep["url"], cluster=rep["cluster"],
                                       healthy=bool(st.healthy), in_router=w is not None,
                                       router_healthy=bool(w and w.healthy), deployment=st.active, ranks=st.ranks,
                                       profile=st.profile if st.active else None))
            healthy &= bool(st.healthy) and w is not None
        progress = _progress(rec)
        if progress is not None:     # an `up` in progress, or one whose controller died: not ok, whatever serves
            healthy = False
        watcher = watcher_of(self.ledger.root)
        return ReplicatedStatusResult(cluster=self.inventory.cluster.name, emulated=self.inventory.emulated,
                                      ok=healthy and not refusing(watcher), healthy=healthy,
                                      profile=rec.data.get("profile"), endpoint=rec.data.get("endpoint"),
                                      status=rec.data.get("status"), router=router, replicas=views,
                                      progress=progress, watcher=watcher)

    def follow_log(self, *, replica: int | None = None, rank: int = 0, router: bool = False, tail: int = 50,
                   follow: bool = False, poll_s: float = 0.5) -> Iterator[str]:
        """`sparkctl logs` of a replicated deployment: rank `rank` of replica `replica` (0 when not given), through
        that replica's own ledger, or with `router` the router's log (its file on the embedded cluster, its
        container's Docker log on rank 0's node; colour codes stripped). The last `tail` lines (0: all), then with
        `follow` each new piece of complete lines as it comes."""
        rec = Record.load(self.ledger.root)
        if router:
            d = rec.data.get("router")
            if not d:
                raise SparkctlError(f"cluster {self.inventory.cluster.name}: the replicated deployment records no "
                                    f"router (status {rec.data.get('status') or 'unknown'})",
                                    hint="sparkctl up --profile NAME starts it again")
            yield from follow_reader(self._router_log(d), tail=tail, follow=follow, poll_s=poll_s)
            return
        reps = rec.data.get("replicas", [])
        index = 0 if replica is None else replica
        entry = next((r for r in reps if r.get("index") == index), None)
        if entry is None:
            have = sorted(r.get("index") for r in reps if isinstance(r.get("index"), int))
            raise ConfigError(f"--replica {index}: the replicated deployment of cluster {self.inventory.cluster.name} "
                              f"has {'replicas ' + ', '.join(map(str, have)) if have else 'no replicas recorded'}",
                              hint=f"use one of them (e.g. --replica {have[0]})" if have
                              else "sparkctl up --profile NAME")
        yield from Deployer(replica_inventory(self.inventory, entry), self.reporter).follow_log(
            rank, tail=tail, follow=follow, poll_s=poll_s)

    def _router_log(self, d: JSONObject) -> Callable[[int], tuple[str, int]]:
        """offset -> (complete new lines of the router's log, next offset), whichever kind the record names."""
        spec = RouterSpec("127.0.0.1", 1)
        r = router_launch.from_record(self.inventory, spec, d)          # a damaged entry is a RouterError
        if r.kind == "container":
            from sparkctl.nodes.docker_runtime import DockerRuntime
            from sparkctl.nodes.handles import DockerHandle
            node = self.inventory.node(d["node"])
            rt = DockerRuntime(self.inventory, node, cluster=self.inventory.cluster.name)
            handle = DockerHandle(node=node.name, rank=0, deployment="router", cluster=self.inventory.cluster.name,
                                  container=d["container"], container_id=d.get("container_id") or d["container"])

            def read(offset: int) -> tuple[str, int]:
                text, nxt = rt.read_log(handle, offset)
                return strip_colour(text), nxt
            return read
        # The router's log is always <ledger>/logs/router.log (where `up` starts it): the path in the record is
        # never followed elsewhere (a damaged or planted record cannot make `logs --router` print another file).
        own = self.ledger.root / "logs" / "router.log"
        return lambda offset: _read_file_lines(own, offset)

    def down(self) -> ReplicatedDownResult:
        rec = Record.load(self.ledger.root)
        stopped = []
        # The parent's lock for the whole of it: nothing (a watcher) sees the router gone while the record still
        # says active, and starts it again in the middle of a `down`.
        with self.ledger.lock("down"):
            r = rec.data.get("router")
            if router_launch.stop_router(self.inventory, r, log=self.ledger.root / "logs" / "router.log",
                                         timeout_s=10):    # recorded, or left unrecorded
                stopped.append("router")
                rec.data.pop("router", None)
                rec.journal("stop-router", "ok", "router stopped")
            for rep in rec.data.get("replicas", []):
                res = Deployer(_named(self.inventory, rep["cluster"], rep["nodes"]), self.reporter).down()
                if res.changed:
                    stopped.append(f"replica {rep['index']}")
            if rec.data:
                rec.data["status"] = "down"
                rec.save()
        return ReplicatedDownResult(changed=bool(stopped), stopped=stopped)


def router_gates(client: RouterClient, spec: RouterSpec, reps: list[Replica], timeout_s: float) -> None:
    """The router ready with every replica healthy, its Prometheus view agreeing, one generation through it."""
    h = client.health()
    if not h.ready or h.healthy_workers != len(reps):
        raise RouterError(f"router: {h.healthy_workers} of {len(reps)} replicas healthy ({h.detail})")
    m = client.metrics()               # its Prometheus view agrees: every replica's health gauge 1
    sick = [r.url for r in reps if not (m.workers.get(r.url) and m.workers[r.url].healthy)]
    if sick:
        raise RouterError(f"router metrics: smg_worker_health is not 1 for {', '.join(sick)}",
                          hint=f"see {spec.metrics_url}")
    try:
        r = httpx.post(spec.url + "/generate", json={"text": "gate", "sampling_params": {"max_new_tokens": 4}},
                       timeout=timeout_s, trust_env=False)
    except httpx.HTTPError as exc:
        raise RouterError(f"router: a generation through it failed: {type(exc).__name__}: {exc}",
                          where=spec.url) from None
    if r.status_code != 200:
        raise RouterError(f"router: a generation through it answered {r.status_code}", evidence=r.text[:500])


def next_commands(endpoint: str) -> list[str]:
    """What to run after a replicated `up` (the `next:` line)."""
    return [f"curl {endpoint}/v1/models", "sparkctl status", "sparkctl bench", "sparkctl logs --router",
            "sparkctl logs --replica 0 --rank 0 --follow", "sparkctl down"]


def _read_file_lines(path: Path, offset: int) -> tuple[str, int]:
    """Complete lines of the router's log file from byte `offset`, colour codes stripped, and the next offset."""
    try:
        text, used = read_lines(path, offset, MAX_LOG_READ)
    except OSError as exc:
        raise SparkctlError(f"cannot read the router's log {path}: {exc.strerror}", where=str(path)) from None
    return redact(strip_colour(text), ()), offset + used      # the one redaction rule, as the container's log read


def _serves(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _named(inv: Inventory, cluster: str, nodes: list[str]) -> Inventory:
    """`inv` narrowed to `nodes` (re-ranked 0..) under the cluster name `cluster`: a replica's own inventory."""
    picked = [n.model_copy(update={"rank": i}) for i, n in enumerate(inv.node(x) for x in nodes)]
    return inv.model_copy(update={"nodes": picked, "cluster": inv.cluster.model_copy(update={"name": cluster})})


def replica_inventory(inventory: Inventory, entry: JSONObject) -> Inventory:
    """The sub-inventory of one ``replicas`` entry of the record (its cluster name, its nodes re-ranked); read-only,
    for readers of a replicated deployment (the bench reaches each replica's ledger and runtimes through it)."""
    return _named(inventory, entry["cluster"], entry["nodes"])


def is_replicated(inventory: Inventory) -> bool:
    """The cluster's state directory holds an active replicated deployment (status and down go through it)."""
    return Record.load(Ledger.for_cluster(inventory.cluster.name).root).active
