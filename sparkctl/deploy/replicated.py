"""Replicated deployments (`replicas: K` in the profile): K replicas behind SGLang's router, rolled one at a time.

Each replica is a cluster of its own, `<cluster>.r<i>` (its `server.tp_size` nodes, its own ledger, lock and
journal; a '.' is never in a cluster name the inventory accepts, so a replica's state and containers cannot be
another cluster's), deployed by the ordinary `up`: its steps, its gates, its restore when it fails. A replicated
`up` is more steps around those: typed steps (`deploy.plan.ReplicatedStep`) in a `ReplicatedPlan`, run by the
lifecycle's own `deploy.apply.run_step` (`deploy.replica_steps` holds the plan and adds the steps' runners to
`apply.RUNNERS`), journaled with the lifecycle's `JournalEntry` in the parent cluster's `replicated.json`
(`state.replicated.Record`, mode 0600), each with the lifecycle's crash boundaries (`deploy.steps.REPLICATED_STEPS`):

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

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.deploy.apply import run_step
from sparkctl.deploy.commands import Deployer, UpOptions, follow_reader
from sparkctl.deploy.plan import (
    ReplicaAttach,
    ReplicaUp,
    RouterStart,
    SettleReplicated,
)
from sparkctl.deploy.progress import Reporter
from sparkctl.deploy.replica_steps import (
    RUNNERS,
    ReplicaMove,
    ReplicatedPlan,
    ReplicatedRun,
    replica_index,
    replicated_steps,
)
from sparkctl.deploy.results import (
    DownPlanResult,
    ReplicaStatus,
    ReplicatedDownResult,
    ReplicatedStatusResult,
    ReplicatedUpResult,
    RouterStatus,
    refusing,
    watcher_of,
)
from sparkctl.deploy.steps import REPLICATED_COMMAND as COMMAND
from sparkctl.errors import ConfigError, LedgerError, LockHeldError, SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.nodes.docker_runtime import DockerRuntime
from sparkctl.nodes.fanout import fan_out
from sparkctl.nodes.handles import DockerHandle
from sparkctl.nodes.process import read_lines
from sparkctl.redaction import redact
from sparkctl.router import RouterError, strip_colour
from sparkctl.router import launch as router_launch
from sparkctl.router.client import RouterClient
from sparkctl.router.replicas import Replica, render_replicas, replica_cluster, router_endpoint, router_spec
from sparkctl.router.spec import RouterSpec
from sparkctl.state.controller import this_controller
from sparkctl.state.ledger import Ledger, now_iso
from sparkctl.state.records import CheckResult, ReplicaEntry
from sparkctl.state.replicated import RECORD, Record

MAX_LOG_READ = 64 * 1024 * 1024     # one read of the router's log file (a follow reads on from there)


def sub_inventory(rep: Replica, parent: str, name: str | None = None) -> Inventory:
    """The replica's own inventory: its nodes, named `name` (default `replica_cluster(parent, index)`)."""
    return _named(rep.inventory, name or replica_cluster(parent, rep.index), rep.nodes)



class ReplicatedDeployer:
    parallel_first_up = True      # False: a first up goes one replica at a time too (the benchmark's baseline)

    def __init__(self, inventory: Inventory, reporter: Reporter | None = None) -> None:
        self.inventory = inventory
        self.reporter = reporter or Reporter(quiet=True)
        self.ledger = Ledger.for_cluster(inventory.cluster.name)

    def _sub(self, rep: Replica, rec: Record) -> Deployer:
        return Deployer(sub_inventory(rep, self.inventory.cluster.name, rec.recorded_name(rep.index)),
                        self.reporter)

    def _router(self, rec: Record, spec: RouterSpec) -> router_launch.Router | None:
        return router_launch.recorded_router(self.inventory, spec, rec.router_entry())

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
        run = ReplicatedRun(self.inventory, self.ledger, self.reporter, Record(self.ledger.root / RECORD), profile,
                            opts or UpOptions(), reps, spec)
        try:
            return self._up(run)
        except KeyboardInterrupt:
            rec = Record.load(self.ledger.root)
            if rec.doc.status == "updating":
                run.rec = rec
                run.settle(list(rec.doc.journal), [(r.index, r.url) for r in reps], died=False)
                rec.doc.status = "failed"
                rec.save()
            raise

    def _up(self, run: ReplicatedRun) -> ReplicatedUpResult:
        t0 = time.monotonic()
        profile, reps, spec = run.profile, run.reps, run.spec
        with self.ledger.lock(COMMAND):
            rec = run.rec = Record.load(self.ledger.root)
            settle = SettleReplicated(what="settle what runs on the cluster's nodes", left=rec.dead_controller(),
                                      replicas=tuple((r.index, r.url) for r in rec.doc.replicas))
            if self._router(rec, spec) is None:     # none of ours runs: its ports must be free before anything boots
                router_launch.check_ports(self.inventory, spec)
            doc, endpoint = rec.doc, router_endpoint(profile, self.inventory)
            doc.profile, doc.profile_data, doc.endpoint = profile.name, profile.model_dump(mode="json"), endpoint
            doc.replicas = [ReplicaEntry(index=r.index, url=r.url, nodes=r.nodes,
                                         cluster=rec.recorded_name(r.index)
                                         or replica_cluster(self.inventory.cluster.name, r.index)) for r in reps]
            doc.status, doc.started, doc.controller = "updating", now_iso(), this_controller(COMMAND, now_iso())
            rec.save()
            run_step(run, settle, COMMAND, RUNNERS)
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
                                  endpoint=endpoint, replicas=len(reps), updated=sorted(run.deployed),
                                  parallel=planned.parallel, profile=profile.name,
                                  cluster=self.inventory.cluster.name, emulated=self.inventory.emulated,
                                  elapsed_s=round(time.monotonic() - t0, 2),
                                  next_commands=next_commands(endpoint))

    def _apply(self, run: ReplicatedRun, planned: ReplicatedPlan) -> None:
        """Run exactly `planned.steps`, each through `run_step`. The replicas of a first `up` boot at once (their
        `up` steps together, one thread each); each that serves is attached after, and the first error is
        raised once every one has finished and been attached. In a rolling update a replica whose `up` failed
        (restored alone by that `up`) goes back into the router and the roll stops with the error."""
        together = [s for s in planned.steps if isinstance(s, ReplicaUp) and s.together]
        errors: list[tuple[int, BaseException]] = []
        if together:
            self.reporter.event(f"no replica in the router yet: {len(together)} replicas boot at once")
            # a signal: every one stopped first
            outcomes = fan_out(together, lambda s: run_step(run, s, COMMAND, RUNNERS))
            errors = [(replica_index(o.item), o.error) for o in outcomes if o.error is not None]
        for step in planned.steps:
            if isinstance(step, ReplicaUp) and step.together:
                continue
            if errors and not isinstance(step, (RouterStart, ReplicaAttach)):
                self._failed_together(run, planned, errors)     # those that serve are in the router: the error
            if isinstance(step, ReplicaUp):
                self._rolling_up(run, planned, step)
            else:
                run_step(run, step, COMMAND, RUNNERS)

    def _rolling_up(self, run: ReplicatedRun, planned: ReplicatedPlan, step: ReplicaUp) -> None:
        try:
            run_step(run, step, COMMAND, RUNNERS)
        except SparkctlError as exc:
            if isinstance(exc, (LedgerError, LockHeldError)):
                raise                # the state directory or a lock, not the replica: nothing to amend
            rep = planned.move(replica_index(step)).replica
            for then in step.on_failure:     # planned: the router (if needed), then the replica, back if it serves
                run_step(run, then, COMMAND, RUNNERS)
            serving = run.router is not None and run.client.find(rep.url) is not None
            run.rec.doc.status = "failed"
            run.rec.save()
            changed = [m.replica.index for m in planned.moves if not m.unchanged]
            done = changed[:changed.index(rep.index)]
            raise exc.amended(message=(
                f"replica {rep.index}: {exc.message} (the rolling update stopped there; replica "
                f"{rep.index} serves as before{' and is back in the router' if serving else ''}; "
                + (f"replica(s) {', '.join(map(str, done))} run {run.profile.name}" if done else
                   f"no replica runs {run.profile.name} yet") + ")")) from exc

    def _failed_together(self, run: ReplicatedRun, planned: ReplicatedPlan,
                         errors: list[tuple[int, BaseException]]) -> None:
        """A first `up`'s replicas have all finished and those that serve are in the router: the first error."""
        run.rec.doc.status = "failed"
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
        r = rec.router_entry()
        client = RouterClient(r["url"], metrics_url=r.get("metrics_url")) if r else None
        router: RouterStatus | None = None
        listed = {}
        if client is not None and r is not None:
            h = client.health()
            router = RouterStatus(url=r["url"], runtime=router_launch.recorded_runtime(r), live=h.live, ready=h.ready,
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
        for rep in rec.doc.replicas:
            st = Deployer(_named(self.inventory, rep.cluster, rep.nodes), self.reporter).status()
            w = listed.get(rep.url)
            views.append(ReplicaStatus(index=rep.index, nodes=rep.nodes, url=rep.url, cluster=rep.cluster,
                                       healthy=bool(st.healthy), in_router=w is not None,
                                       router_healthy=bool(w and w.healthy), deployment=st.active, ranks=st.ranks,
                                       profile=st.profile if st.active else None))
            healthy &= bool(st.healthy) and w is not None
        progress = rec.progress()
        if progress is not None:     # an `up` in progress, or one whose controller died: not ok, whatever serves
            healthy = False
        watcher = watcher_of(self.ledger.root)
        return ReplicatedStatusResult(cluster=self.inventory.cluster.name, emulated=self.inventory.emulated,
                                      ok=healthy and not refusing(watcher), healthy=healthy,
                                      profile=rec.doc.profile, endpoint=rec.doc.endpoint,
                                      status=rec.doc.status, router=router, replicas=views,
                                      progress=progress, watcher=watcher)

    def follow_log(self, *, replica: int | None = None, rank: int = 0, router: bool = False, tail: int = 50,
                   follow: bool = False, poll_s: float = 0.5) -> Iterator[str]:
        """`sparkctl logs` of a replicated deployment: rank `rank` of replica `replica` (0 when not given), through
        that replica's own ledger, or with `router` the router's log (its file on the embedded cluster, its
        container's Docker log on rank 0's node; colour codes stripped). The last `tail` lines (0: all), then with
        `follow` each new piece of complete lines as it comes."""
        rec = Record.load(self.ledger.root)
        if router:
            d = rec.router_entry()
            if not d:
                raise SparkctlError(f"cluster {self.inventory.cluster.name}: the replicated deployment records no "
                                    f"router (status {rec.doc.status or 'unknown'})",
                                    hint="sparkctl up --profile NAME starts it again")
            yield from follow_reader(self._router_log(d), tail=tail, follow=follow, poll_s=poll_s)
            return
        reps = rec.doc.replicas
        index = 0 if replica is None else replica
        entry = next((r for r in reps if r.index == index), None)
        if entry is None:
            have = sorted(r.index for r in reps)
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
        if r.runtime == "container":
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

    def plan_down(self) -> DownPlanResult:
        """What `down` would do (`down --dry-run`): the router, then each replica's own `down` plan; nothing
        changed."""
        rec = Record.load(self.ledger.root)
        doc = None if rec.empty else rec.doc
        router = doc.router if doc else None
        lines = [f"stop-router: stop the router ({router.runs_as} at {router.url})" if router else
                 "stop-router: stop a router of this cluster if one runs (none is recorded)"]
        engines: list[str] = []
        for rep in doc.replicas if doc else []:
            plan = Deployer(_named(self.inventory, rep.cluster, rep.nodes), self.reporter).plan_down()
            lines += [f"replica {rep.index}: {line}" for line in plan.plan]
            engines += plan.engines
        return DownPlanResult(active=doc.profile if doc else None, plan=lines, engines=engines)

    def down(self) -> ReplicatedDownResult:
        rec = Record.load(self.ledger.root)
        stopped = []
        # The parent's lock for the whole of it: nothing (a watcher) sees the router gone while the record still
        # says active, and starts it again in the middle of a `down`.
        with self.ledger.lock("down"):
            if router_launch.stop_router(self.inventory, rec.router_entry(),
                                         log=self.ledger.root / "logs" / "router.log",
                                         timeout_s=10):    # recorded, or left unrecorded
                stopped.append("router")
                rec.doc.router = None
                rec.journal("stop-router", "ok", "router stopped")
            for rep in rec.doc.replicas:
                res = Deployer(_named(self.inventory, rep.cluster, rep.nodes), self.reporter).down()
                if res.changed:
                    stopped.append(f"replica {rep.index}")
            if not rec.empty:
                rec.doc.status = "down"
                rec.save()
        return ReplicatedDownResult(changed=bool(stopped), stopped=stopped)


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


def _named(inv: Inventory, cluster: str, nodes: list[str]) -> Inventory:
    """`inv` narrowed to `nodes` (re-ranked 0..) under the cluster name `cluster`: a replica's own inventory."""
    picked = [n.model_copy(update={"rank": i}) for i, n in enumerate(inv.node(x) for x in nodes)]
    return inv.model_copy(update={"nodes": picked, "cluster": inv.cluster.model_copy(update={"name": cluster})})


def replica_inventory(inventory: Inventory, entry: ReplicaEntry) -> Inventory:
    """The sub-inventory of one ``replicas`` entry of the record (its cluster name, its nodes re-ranked); read-only,
    for readers of a replicated deployment (the bench reaches each replica's ledger and runtimes through it)."""
    return _named(inventory, entry.cluster, entry.nodes)
