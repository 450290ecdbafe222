"""Replicated deployments (`replicas: K` in the profile): K replicas behind SGLang's router, rolled one at a time.

Each replica is a cluster of its own, `<cluster>.r<i>` (its `server.tp_size` nodes, its own ledger, lock and
journal; a '.' is never in a cluster name the inventory accepts, so a replica's state and containers cannot be
another cluster's), deployed by the ordinary `up`: its steps, its gates, its restore when it fails. A replicated
`up` is more steps around those, journaled in the parent cluster's `replicated.json` (mode 0600), each with the
lifecycle's
crash boundaries (`deploy.steps.REPLICATED_STEPS`):

    reconcile       the parent's single-group deployment, if one is active, goes down first
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
replica's `up` settles its own journal, and the next `up` converges from what runs.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.deploy.commands import Deployer, UpOptions, follow_reader
from sparkctl.deploy.plan import Plan
from sparkctl.deploy.progress import Reporter
from sparkctl.deploy.results import (
    ReplicaStatus,
    ReplicatedDownResult,
    ReplicatedStatusResult,
    ReplicatedUpResult,
    RouterStatus,
    watcher_of,
)
from sparkctl.deploy.steps import (
    HAND_OFF,
    RECONCILE,
    REPLICA_ATTACH,
    REPLICA_DETACH,
    REPLICA_UP,
    ROUTER_GATES,
    ROUTER_START,
    boundary,
)
from sparkctl.deploy.steps import REPLICATED_COMMAND as COMMAND
from sparkctl.errors import ConfigError, LedgerError, LockHeldError, SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.nodes.fanout import fan_out
from sparkctl.nodes.process import read_lines
from sparkctl.router import RouterError, strip_colour
from sparkctl.router import launch as router_launch
from sparkctl.router.client import RouterClient, Worker, attach, detach, drain, engine_in_flight
from sparkctl.router.replicas import Replica, render_replicas, router_endpoint, router_spec
from sparkctl.router.spec import RouterSpec
from sparkctl.sglang.launch import redact
from sparkctl.state.controller import controller_alive, this_controller
from sparkctl.state.ledger import Ledger, now_iso
from sparkctl.state.records import JournalEntry, ReplicatedRecord
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


def replica_cluster(parent: str, index: int) -> str:
    """`<parent>.r<i>`: the inventory refuses '.' in cluster names, so no user's cluster is ever named so."""
    return f"{parent}.r{index}"


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
            private_dir(self.path.parent)
            write_json_atomic(self.path, doc)

    def journal(self, step: str, phase: str, what: str, replica: int | None = None, detail: str | None = None) -> None:
        with self._lock:
            self.data.setdefault("journal", []).append(JournalEntry(
                step=step, phase=phase, at=now_iso(), what=what, replica=replica, detail=detail).model_dump(mode="json"))
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
    """A replicated `up` as data: the router and each replica's move, made once from what runs now."""

    profile: Profile
    replicas: list[Replica]
    spec: RouterSpec
    router: router_launch.Router | None          # ours, running (None: it starts before the first attach)
    client: RouterClient
    moves: list[ReplicaMove]
    parallel: bool                               # a first `up`: every replica's own `up` at once
    endpoint: str

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

    def _step(self, rec: Record, name: str, what: str, fn, replica: int | None = None) -> Any:
        rec.journal(name, "intent", what, replica)
        self.reporter.stage(name, what)
        boundary(COMMAND, name, "before")
        try:
            out = fn()
        except BaseException as exc:
            rec.journal(name, "failed", what, replica, exc.render() if isinstance(exc, SparkctlError) else repr(exc))
            raise
        rec.journal(name, "ok", what, replica)
        boundary(COMMAND, name, "after")
        return out

    # ---- plan (read-only) ------------------------------------------------------------------------------------
    def make_plan(self, profile: Profile, rec: Record) -> ReplicatedPlan:
        """What a replicated `up` of `profile` does from what runs now: the router (ours, running, or to start)
        and, per replica, its own plan (`deploy.plan.Plan`) and whether the router lists it. `up` runs this plan;
        `up --dry-run` prints it (`ReplicatedPlan.lines`)."""
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
        return ReplicatedPlan(profile, reps, spec, router, client, moves, parallel,
                              router_endpoint(profile, self.inventory))

    def plan_lines(self, profile: Profile) -> list[str]:
        """What `up` would do, replica by replica (each replica's own plan under its steps); nothing is changed."""
        return self.make_plan(profile, Record.load(self.ledger.root)).lines()

    # ---- up --------------------------------------------------------------------------------------------------
    def up(self, profile: Profile, opts: UpOptions | None = None) -> ReplicatedUpResult:
        reps = render_replicas(profile, self.inventory)
        spec = router_spec(profile, self.inventory, reps)
        try:
            return self._up(profile, opts or UpOptions(), reps, spec)
        except KeyboardInterrupt:
            self._settle_interrupted(reps, spec)
            raise

    def _settle_interrupted(self, reps: list[Replica], spec: RouterSpec) -> None:
        """Ctrl-C, SIGTERM or SIGHUP at any step of a replicated `up` (each replica's own `up` already stopped or
        restored what it started): every replica that serves goes back into the router when ours runs (none is
        left out: a detach or an attach the signal cut), and the record is not left "updating". A second signal
        exits at once; the next `up` converges from what runs."""
        rec = Record.load(self.ledger.root)
        if rec.data.get("status") != "updating":
            return
        if self._router(rec, spec) is not None:
            client = RouterClient(spec.url, metrics_url=spec.metrics_url)
            for rep in reps:
                try:
                    if _serves(rep.url) and client.find(rep.url) is None:
                        what = f"replica {rep.index}: back into the router (the `up` was interrupted)"
                        rec.journal(REPLICA_ATTACH, "intent", what, rep.index)
                        attach(client, rep.url)
                        rec.journal(REPLICA_ATTACH, "ok", what, rep.index)
                except SparkctlError as exc:     # the next `up` attaches it; the record says so
                    rec.journal(REPLICA_ATTACH, "failed", f"replica {rep.index}", rep.index, exc.render())
        rec.data["status"] = "failed"
        rec.save()

    def _up(self, profile: Profile, opts: UpOptions, reps: list[Replica], spec: RouterSpec) -> ReplicatedUpResult:
        t0 = time.monotonic()
        parent = Deployer(self.inventory, self.reporter)
        with self.ledger.lock(COMMAND):
            rec = Record.load(self.ledger.root)
            if self._router(rec, spec) is None:     # none of ours runs: its ports must be free before anything boots
                router_launch.check_ports(self.inventory, spec)
            rec.data.update(profile=profile.name, endpoint=router_endpoint(profile, self.inventory),
                            replicas=[{"index": r.index, "url": r.url, "nodes": r.nodes,
                                       "cluster": _recorded_name(rec, r.index)
                                       or replica_cluster(self.inventory.cluster.name, r.index)} for r in reps],
                            status="updating", started=now_iso(),
                            controller=this_controller(COMMAND, now_iso()).model_dump(mode="json"))
            rec.save()

            def settle_parent() -> None:
                if parent.ledger.active() is not None:      # a single-group deployment on these nodes
                    self.reporter.event("the cluster runs a single-group deployment: it goes down first")
            self._step(rec, RECONCILE, "settle what runs on the cluster's nodes", settle_parent)
        if parent.ledger.active() is not None:
            parent.down()          # its own lock and steps
        with self.ledger.lock(COMMAND):
            planned = self.make_plan(profile, rec)       # under the lock, from what runs now
            router = planned.router

            def start_router() -> router_launch.Router:
                from sparkctl.deploy.router_image import router_image
                proc = router_launch.start_router(self.inventory, spec, image=router_image(profile, self.inventory,
                                                                                           reps[0].result),
                                                  log_path=self.ledger.root / "logs" / "router.log")
                rec.data["router"] = {**proc.to_dict(), "url": spec.url, "metrics_url": spec.metrics_url}
                rec.save()
                return proc
            running = [router]

            def ensure_router() -> None:
                """Started once a replica serves (before its attach): on a first `up` rank 0 has the engine image
                the router runs from only after a replica's image stage."""
                if running[0] is None:
                    running[0] = self._step(rec, ROUTER_START, f"start the router on {spec.url} ({spec.policy})",
                                            start_router)
            client = planned.client
            for move in planned.moves:
                if move.unchanged:
                    self.reporter.event(f"replica {move.replica.index} ({', '.join(move.replica.nodes)}): "
                                        f"unchanged, in the router")
            todo = [(m.replica, m.sub, m.listed) for m in planned.moves if not m.unchanged]
            changed = [rep.index for rep, _, _ in todo]          # to go through (some may find nothing to do)
            deployed: list[int] = []                               # those whose own `up` deployed
            parallel = planned.parallel
            if parallel:
                deployed += self._all_at_once(rec, profile, opts, client, todo, ensure_router)
            else:
                for rep, sub, listed in todo:
                    if self._one_at_a_time(rec, profile, opts, client, rep, sub, listed, changed, ensure_router):
                        deployed.append(rep.index)
            ensure_router()          # every replica unchanged but the router gone: it comes back with all of them

            def gates() -> None:
                try:
                    router_gates(client, spec, reps, profile.lifecycle.health_timeout_s)
                except RouterError as exc:         # the router's own words go with it
                    try:
                        tail = running[0].log_tail() if running[0] is not None else ""
                    except SparkctlError:
                        tail = ""
                    if not tail:
                        raise
                    raise RouterError(exc.message, where=exc.where, hint=exc.hint, evidence="\n".join(
                        x for x in (exc.evidence, "router log (last lines):\n" + tail) if x)) from exc
            self._step(rec, ROUTER_GATES, f"router ready with {len(reps)} healthy replicas; a generation "
                       f"through it", gates)

            def hand_off() -> None:
                rec.data.update(status="active", handed_off=now_iso())
                rec.save()
            self._step(rec, HAND_OFF, f"hand off {rec.data['endpoint']}", hand_off)
        started = router is None and running[0] is not None and not running[0].kept
        moved = bool(deployed) or started
        return ReplicatedUpResult(outcome="deployed" if moved else "unchanged", changed=moved,
                                  endpoint=rec.data["endpoint"], replicas=len(reps), updated=sorted(deployed),
                                  parallel=parallel, profile=profile.name, cluster=self.inventory.cluster.name,
                                  emulated=self.inventory.emulated, elapsed_s=round(time.monotonic() - t0, 2),
                                  next_commands=next_commands(rec.data["endpoint"]))

    def _replica_up(self, rec: Record, profile: Profile, opts: UpOptions, rep: Replica, sub: Deployer) -> bool:
        """The replica's own `up`; True when it deployed (False: it already ran this profile, healthy)."""
        res = self._step(rec, REPLICA_UP, f"replica {rep.index}: up {profile.name} on {', '.join(rep.nodes)}",
                         lambda: sub.up(rep.result.profile, UpOptions(boot_timeout_s=opts.boot_timeout_s)), rep.index)
        return bool(res.changed)

    def _attach(self, rec: Record, client: RouterClient, rep: Replica, ensure_router: Callable[[], None]) -> None:
        ensure_router()
        self._step(rec, REPLICA_ATTACH, f"replica {rep.index}: back into the router",
                   lambda: attach(client, rep.url), rep.index)

    def _one_at_a_time(self, rec: Record, profile: Profile, opts: UpOptions, client: RouterClient, rep: Replica,
                       sub: Deployer, listed: object, changed: list[int], ensure_router: Callable[[], None]) -> bool:
        """The rolling step: out of the router (drained), its own `up`, back in. A replica whose `up` failed was
        restored alone by that `up`: it goes back into the router and the roll stops with the error."""
        if listed is not None:
            self._step(rec, REPLICA_DETACH, f"replica {rep.index}: out of the router, drain (at most "
                       f"{profile.router.drain_timeout_s:g}s)",
                       lambda: detach(client, rep.url, drain_s=profile.router.drain_timeout_s), rep.index)
        else:       # already out of the router (a controller killed mid-drain): its requests still finish first
            self._step(rec, REPLICA_DETACH, f"replica {rep.index}: out of the router already, drain (at most "
                       f"{profile.router.drain_timeout_s:g}s)",
                       lambda: drain(lambda: engine_in_flight(rep.url), timeout_s=profile.router.drain_timeout_s,
                                     what=f"replica {rep.url}"), rep.index)
        try:
            deployed = self._replica_up(rec, profile, opts, rep, sub)
        except (LedgerError, LockHeldError):
            raise                    # the state directory or a lock, not the replica: nothing to amend
        except KeyboardInterrupt:
            # Ctrl-C / SIGTERM / SIGHUP: the replica's own `up` restored what it ran; back into the router if it
            # serves, the roll stops there (a second signal exits at once: the next `up` converges)
            if _serves(rep.url):
                self._attach(rec, client, rep, ensure_router)
            rec.data["status"] = "failed"
            rec.save()
            raise
        except SparkctlError as exc:
            serves = _serves(rep.url)
            if serves:
                self._attach(rec, client, rep, ensure_router)
            rec.data["status"] = "failed"
            rec.save()
            done = changed[:changed.index(rep.index)]
            raise exc.amended(message=(
                f"replica {rep.index}: {exc.message} (the rolling update stopped there; replica "
                f"{rep.index} serves as before{' and is back in the router' if serves else ''}; "
                + (f"replica(s) {', '.join(map(str, done))} run {profile.name}" if done else
                   f"no replica runs {profile.name} yet") + ")")) from exc
        if _serves(rep.url):
            self._attach(rec, client, rep, ensure_router)
        return deployed

    def _all_at_once(self, rec: Record, profile: Profile, opts: UpOptions, client: RouterClient,
                     todo: list[tuple[Replica, Deployer, Any]], ensure_router: Callable[[], None]) -> list[int]:
        """A first `up` (the router lists no worker): every replica's own `up` at once, then each that serves goes
        into the router, in order. The first error is raised once every replica has finished and been attached.
        Returns the replicas whose own `up` deployed."""
        self.reporter.event(f"no replica in the router yet: {len(todo)} replicas boot at once")
        try:
            outcomes = fan_out(todo, lambda t: self._replica_up(rec, profile, opts, t[0], t[1]))
        except KeyboardInterrupt:
            # every replica's own `up` took the interrupt and stopped what it started (fan_out waited for them)
            rec.data["status"] = "failed"
            rec.save()
            raise
        for rep, _, _ in todo:
            if _serves(rep.url):
                self._attach(rec, client, rep, ensure_router)
        errors = [(t[0], o.error) for t, o in zip(todo, outcomes) if o.error is not None]
        if not errors:
            return [t[0].index for t, o in zip(todo, outcomes) if o.value]
        rec.data["status"] = "failed"
        rec.save()
        for _, err in errors:
            if not isinstance(err, SparkctlError) or isinstance(err, (LedgerError, LockHeldError)):
                raise err
        rep, err = errors[0]
        ok = [t[0].index for t, o in zip(todo, outcomes) if o.ok]
        assert isinstance(err, SparkctlError)
        raise err.amended(message=(
            f"replica {rep.index}: {err.message} (a first up of {len(todo)} replicas at once; "
            + (f"replica(s) {', '.join(map(str, ok))} run {profile.name} and are in the router" if ok else
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
        return ReplicatedStatusResult(cluster=self.inventory.cluster.name, emulated=self.inventory.emulated,
                                      ok=healthy, healthy=healthy, profile=rec.data.get("profile"),
                                      endpoint=rec.data.get("endpoint"), status=rec.data.get("status"),
                                      router=router, replicas=views, progress=progress,
                                      watcher=watcher_of(self.ledger.root))

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
            if router_launch.stop_router(self.inventory, r, timeout_s=10):    # recorded, or left unrecorded
                stopped.append("router")
                rec.data.pop("router", None)
                rec.journal("stop-router", "ok", "router stopped")
            for rep in rec.data.get("replicas", []):
                res = Deployer(_named(self.inventory, rep["cluster"], rep["nodes"]), self.reporter).down()
                if res.get("changed"):
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
