"""The steps of a replicated `up`, planned and run: a `ReplicatedPlan` (per replica a `ReplicaMove` holding that
replica's own `Plan` and the router's entry for it) whose typed steps (`deploy.plan.ReplicatedStep`) are made by
`replicated_steps`, and what each step does (`run_*`, in this module's `RUNNERS`, which `deploy.replicated` hands
to the lifecycle's own `run_step`, so it journals and runs them) over the `ReplicatedRun` they share.
`deploy.replicated` makes the plan from what runs and drives it; rank_steps.py is the same for one group's ranks.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import httpx

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.deploy.apply import Runner
from sparkctl.deploy.commands import Deployer, UpOptions
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
from sparkctl.deploy.router_image import router_image
from sparkctl.deploy.settle import open_steps, settle_replicated
from sparkctl.errors import SparkctlError
from sparkctl.router import RouterError
from sparkctl.router import launch as router_launch
from sparkctl.router.client import RouterClient, Worker, attach, detach, drain, engine_in_flight
from sparkctl.router.replicas import Replica
from sparkctl.router.spec import RouterSpec
from sparkctl.state.ledger import Ledger, now_iso
from sparkctl.state.records import JournalEntry, RouterEntry
from sparkctl.state.replicated import Record
from sparkctl.tls import tls_context


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
        """What `up` runs, from the steps themselves (a replica's own `up` with its own plan's steps under it, and
        what runs if it fails), after the router and the replicas left as they are."""
        spec = self.spec
        lines = [f"router {spec.url} ({spec.policy}): " + (f"running ({self.router.where})" if self.router
                                                           else "start")]
        for m in self.moves:
            if m.unchanged:
                rep = m.replica
                lines.append(f"replica {rep.index} ({', '.join(rep.nodes)}, {rep.url}): unchanged "
                             f"({m.plan.noop_reason})")
        for i, step in enumerate(self.steps, 1):
            lines.append(f"{i}. {step.what}")
            if isinstance(step, ReplicaUp):
                lines += [f"     {line}" for line in self.move(replica_index(step)).plan.lines()]
                lines += [f"     on failure: {s.what}" for s in step.on_failure]
        return lines


def replicated_steps(profile: Profile, spec: RouterSpec, moves: list[ReplicaMove], *, router_runs: bool,
                     parallel: bool, endpoint: str) -> tuple[ReplicatedStep, ...]:
    """The steps of a replicated `up` after its settle: per changed replica detach (when rolling), its own `up`,
    attach; the router started just before the first attach (or before the gates, when no replica changed);
    the router's gates; the hand-off. On a first `up` (`parallel`) every replica's `up` comes first, together;
    in a rolling update each replica's `up` carries what runs if it fails (the router, then the replica, back).
    Starting the router and each attach are conditional (a planned condition, journaled `noop` with its reason
    when false): the router starts if none of ours runs and a replica serves; a replica goes in if it serves."""
    drain_s = profile.router.drain_timeout_s
    out: list[ReplicatedStep] = []
    pending = [not router_runs]

    def start() -> RouterStart:
        return RouterStart(what=f"start the router on {spec.url} ({spec.policy}) if none of ours runs and a replica "
                                f"serves")

    def attach_(rep: Replica) -> ReplicaAttach:
        return ReplicaAttach(what=f"replica {rep.index}: back into the router if it serves", replica=rep.index,
                             url=rep.url)

    def up(rep: Replica) -> ReplicaUp:
        return ReplicaUp(what=f"replica {rep.index}: up {profile.name} on {', '.join(rep.nodes)}",
                         replica=rep.index, together=parallel,
                         on_failure=() if parallel else (start(), attach_(rep)))

    def router_first() -> None:
        if pending[0]:
            out.append(start())
            pending[0] = False
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

    inventory: Inventory                            # the parent cluster's
    ledger: Ledger
    reporter: Reporter
    rec: Record
    profile: Profile
    opts: UpOptions
    reps: list[Replica]
    spec: RouterSpec
    plan: ReplicatedPlan | None = None
    router: router_launch.Router | None = None       # ours, running
    deployed: list[int] = field(default_factory=list)  # replicas whose own `up` deployed

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

    def closed(self, step: Step, error: BaseException | None, skipped: str | None = None) -> None:
        if error is None:
            self.rec.journal(step.name, "noop" if step.noop or skipped else "ok", step.what, _replica_of(step),
                             skipped)
        else:
            self.rec.journal(step.name, "failed", step.what, _replica_of(step),
                             error.render() if isinstance(error, SparkctlError) else repr(error))

    def settle(self, journal: list[JournalEntry], replicas: list[tuple[int, str]], *, died: bool) -> list[int]:
        """`settle.settle_replicated` against the router of ours that runs now (none: nothing to put back)."""
        if router_launch.recorded_router(self.inventory, self.spec, self.rec.router_entry()) is None:
            return settle_replicated(journal, replicas, died=died, serves=serves, out_of_router=None, attach=str,
                                     write=self.rec.journal)
        client = RouterClient(self.spec.url, metrics_url=self.spec.metrics_url)
        return settle_replicated(journal, replicas, died=died, serves=serves,
                                 out_of_router=lambda url: client.find(url) is None,
                                 attach=lambda url: attach(client, url), write=self.rec.journal)


def _replica_of(step: Step) -> int | None:
    return step.replica if isinstance(step, ReplicatedStep) else None


# ---- what each replicated step does (`RUNNERS` below: run_step dispatches on the step's class) ---------------
def run_settle_replicated(run: ReplicatedRun, step: SettleReplicated) -> str | None:
    if step.left is not None:
        journal = list(run.rec.doc.journal)
        cut = ", ".join(f"{e.step}" + (f" of replica {e.replica}" if e.replica is not None else "")
                        for e in open_steps(journal)) or "between steps"
        run.reporter.event(f"the last `sparkctl up` of this replicated deployment was interrupted ({step.left}) "
                           f"during {cut}: settling it")
        back = run.settle(journal, list(step.replicas), died=True)
        if back:
            run.reporter.event(f"replica(s) {', '.join(map(str, back))} back into the router")
    if Ledger.for_cluster(run.inventory.cluster.name).active() is not None:   # a single group here
        run.reporter.event("the cluster runs a single-group deployment: it goes down first")
    return None


def run_router_start(run: ReplicatedRun, step: RouterStart) -> str | None:
    if run.router is not None:
        return f"the router runs ({run.router.where})"
    if not any(serves(r.url) for r in run.reps):
        return "no replica serves: nothing to route to (the error that ends the run says why)"
    inv, spec = run.inventory, run.spec
    log = run.ledger.root / "logs" / "router.log"
    try:
        proc = router_launch.start_router(inv, spec, image=router_image(run.profile, inv, run.reps[0].result),
                                          log_path=log)
        run.rec.doc.router = RouterEntry.model_validate({**proc.to_dict(), "url": spec.url,
                                                         "metrics_url": spec.metrics_url})
        run.rec.save()
    except BaseException:
        # Whatever failed or interrupted (Ctrl-C can land between the router's start and its record), no router of
        # this cluster outlives the step unrecorded: what runs is found by its log or label and stopped.
        router_launch.stop_router(inv, None, log=log, timeout_s=10)
        run.rec.doc.router = None
        raise
    run.router = proc
    return None


def run_replica_detach(run: ReplicatedRun, step: ReplicaDetach) -> str | None:
    if step.listed:
        detach(run.client, step.url, drain_s=step.drain_s)
    else:       # already out of the router (a controller killed mid-drain): its requests still finish first
        drain(lambda: engine_in_flight(step.url), timeout_s=step.drain_s, what=f"replica {step.url}")
    return None


def run_replica_up(run: ReplicatedRun, step: ReplicaUp) -> str | None:
    move = run.planned.move(replica_index(step))
    res = move.sub.up(move.replica.result.profile, UpOptions(boot_timeout_s=run.opts.boot_timeout_s))
    if res.changed:
        run.deployed.append(move.replica.index)
    return None


def run_replica_attach(run: ReplicatedRun, step: ReplicaAttach) -> str | None:
    if not serves(step.url):
        return f"replica {step.replica} does not serve: it stays out of the router"
    attach(run.client, step.url)
    return None


def run_router_gates(run: ReplicatedRun, step: RouterGates) -> str | None:
    try:
        router_gates(run.client, run.spec, run.reps, run.profile.lifecycle.health_timeout_s)
        return None
    except RouterError as exc:         # the router's own words go with it
        try:
            tail = run.router.log_tail() if run.router is not None else ""
        except SparkctlError:
            tail = ""
        if not tail:
            raise
        raise RouterError(exc.message, where=exc.where, hint=exc.hint, evidence="\n".join(
            x for x in (exc.evidence, "router log (last lines):\n" + tail) if x)) from exc


def run_router_hand_off(run: ReplicatedRun, step: RouterHandOff) -> str | None:
    run.rec.doc.status, run.rec.doc.handed_off = "active", now_iso()
    run.rec.save()
    return None


def replica_index(step: ReplicatedStep) -> int:
    if step.replica is None:
        raise TypeError(f"{step.name}: a replica's step without its replica")
    return step.replica


# What a replicated `up` runs with: its own steps' runners, made here once (read-only, apply's table untouched)
RUNNERS: Mapping[type[Step], Runner] = MappingProxyType({
    SettleReplicated: run_settle_replicated, RouterStart: run_router_start, ReplicaDetach: run_replica_detach,
    ReplicaUp: run_replica_up, ReplicaAttach: run_replica_attach, RouterGates: run_router_gates,
    RouterHandOff: run_router_hand_off})



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
                       timeout=timeout_s, trust_env=False, verify=tls_context())
    except httpx.HTTPError as exc:
        raise RouterError(f"router: a generation through it failed: {type(exc).__name__}: {exc}",
                          where=spec.url) from None
    if r.status_code != 200:
        raise RouterError(f"router: a generation through it answered {r.status_code}", evidence=r.text[:500])


def serves(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5, trust_env=False, verify=tls_context()).status_code == 200
    except httpx.HTTPError:
        return False

