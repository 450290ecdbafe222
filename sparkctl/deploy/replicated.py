"""Replicated deployments (`replicas: K` in the profile): K replicas behind SGLang's router, rolled one at a time.

Each replica is a cluster of its own, `<cluster>-r<i>` (its `server.tp_size` nodes, its own ledger, lock and
journal), deployed by the ordinary `up`: its steps, its gates, its restore when it fails. A replicated `up` is more
steps around those, journaled in the parent cluster's `replicated.json` (mode 0600), each with the lifecycle's
crash boundaries (`deploy.steps.REPLICATED_STEPS`):

    reconcile       the parent's single-group deployment, if one is active, goes down first
    router-start    the router on rank 0's node (a local process on the embedded cluster), unless it runs
    for each replica i, in order:
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.deploy.commands import Deployer, UpOptions
from sparkctl.deploy.progress import Reporter
from sparkctl.deploy.steps import REPLICATED_COMMAND as COMMAND
from sparkctl.deploy.steps import boundary
from sparkctl.errors import LedgerError, SparkctlError
from sparkctl.router import RouterError
from sparkctl.router.client import RouterClient, attach, detach
from sparkctl.router.process import RouterProcess
from sparkctl.router.spec import RouterSpec
from sparkctl.sglang.replicas import Replica, render_replicas, router_endpoint, router_spec
from sparkctl.state.files import private_dir, state_dir_error, write_json_atomic
from sparkctl.state.ledger import Ledger, now_iso

RECORD = "replicated.json"


def replica_cluster(parent: str, index: int) -> str:
    return f"{parent}-r{index}"


def sub_inventory(rep: Replica, parent: str) -> Inventory:
    inv = rep.inventory
    return inv.model_copy(update={"cluster": inv.cluster.model_copy(update={"name": replica_cluster(parent,
                                                                                                    rep.index)})})


@dataclass
class Record:
    """What the parent cluster's state directory holds for a replicated deployment."""
    path: Path
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, root: Path) -> "Record":
        path = root / RECORD
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path, {})
        except OSError as exc:           # not a directory, unreadable: the state directory's error (exit 6)
            raise state_dir_error(root, exc) from None
        except ValueError as exc:
            raise LedgerError(f"the replicated deployment's record is corrupt: {exc}", where=str(path),
                              hint="run `sparkctl repair`, or move the file aside if no replica runs") from None
        if not isinstance(data, dict):
            raise LedgerError("the replicated deployment's record is not a JSON object", where=str(path),
                              hint="run `sparkctl repair`, or move the file aside if no replica runs")
        return cls(path, data)

    def save(self) -> None:
        private_dir(self.path.parent)
        write_json_atomic(self.path, self.data)

    def journal(self, step: str, phase: str, what: str, replica: int | None = None, detail: str | None = None) -> None:
        self.data.setdefault("journal", []).append({"step": step, "phase": phase, "at": now_iso(), "what": what,
                                                    "replica": replica, "detail": detail})
        self.save()

    @property
    def active(self) -> bool:
        return self.data.get("status") in ("active", "updating", "failed")   # failed: its replicas still run


class ReplicatedDeployer:
    def __init__(self, inventory: Inventory, reporter: Reporter | None = None) -> None:
        self.inventory = inventory
        self.reporter = reporter or Reporter(quiet=True)
        self.ledger = Ledger.for_cluster(inventory.cluster.name)

    def _sub(self, rep: Replica) -> Deployer:
        return Deployer(sub_inventory(rep, self.inventory.cluster.name), self.reporter)

    def _router(self, rec: Record, spec: RouterSpec) -> RouterProcess | None:
        r = rec.data.get("router")
        if not r:
            return None
        proc = RouterProcess.from_dict(spec, r)
        return proc if proc.alive() else None

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
    def plan_lines(self, profile: Profile) -> list[str]:
        """What `up` would do, replica by replica (each replica's own plan under its steps); nothing is changed."""
        reps = render_replicas(profile, self.inventory)
        spec = router_spec(profile, self.inventory, reps)
        rec = Record.load(self.ledger.root)
        router = self._router(rec, spec)
        lines = [f"router {spec.url} ({spec.policy}): " + ("running (pid %d)" % router.pid if router else "start")]
        client = RouterClient(spec.url, metrics_url=spec.metrics_url) if router else None
        for rep in reps:
            _, plan = self._sub(rep).plan(profile)
            listed = client.find(rep.url) if client else None
            head = f"replica {rep.index} ({', '.join(rep.nodes)}, {rep.url})"
            if plan.noop and listed is not None and listed.healthy:
                lines.append(f"{head}: unchanged ({plan.noop_reason})")
                continue
            if listed is not None:
                lines.append(f"{head}: out of the router, drain (at most {profile.router.drain_timeout_s:g}s)")
            lines += [f"{head}: {line}" for line in plan.lines()]
            lines.append(f"{head}: back into the router once its gates pass")
        lines.append(f"router gates, then hand off {router_endpoint(profile, self.inventory)}")
        return lines

    # ---- up --------------------------------------------------------------------------------------------------
    def up(self, profile: Profile, opts: UpOptions | None = None) -> dict[str, Any]:
        opts = opts or UpOptions()
        reps = render_replicas(profile, self.inventory)
        spec = router_spec(profile, self.inventory, reps)
        parent = Deployer(self.inventory, self.reporter)
        with self.ledger.lock(COMMAND):
            rec = Record.load(self.ledger.root)
            rec.data.update(profile=profile.name, endpoint=router_endpoint(profile, self.inventory),
                            replicas=[{"index": r.index, "url": r.url, "nodes": r.nodes,
                                       "cluster": replica_cluster(self.inventory.cluster.name, r.index)} for r in reps],
                            status="updating", started=now_iso())
            rec.save()

            def settle_parent() -> None:
                if parent.ledger.active() is not None:      # a single-group deployment on these nodes
                    self.reporter.event("the cluster runs a single-group deployment: it goes down first")
            self._step(rec, "reconcile", "settle what runs on the cluster's nodes", settle_parent)
        if parent.ledger.active() is not None:
            parent.down()          # its own lock and steps
        with self.ledger.lock(COMMAND):
            router = self._router(rec, spec)

            def start_router() -> RouterProcess:
                proc = RouterProcess.start(spec, self.ledger.root / "logs" / "router.log")
                rec.data["router"] = {**proc.to_dict(), "url": spec.url, "metrics_url": spec.metrics_url}
                rec.save()
                return proc
            if router is None:
                router = self._step(rec, "router-start", f"start the router on {spec.url} ({spec.policy})",
                                    start_router)
            client = RouterClient(spec.url, metrics_url=spec.metrics_url)
            changed: list[int] = []
            for rep in reps:
                sub = self._sub(rep)
                _, plan = sub.plan(profile)
                listed = client.find(rep.url)
                if plan.noop and listed is not None and listed.healthy:
                    self.reporter.event(f"replica {rep.index} ({', '.join(rep.nodes)}): unchanged, in the router")
                    continue
                changed.append(rep.index)
                if listed is not None:
                    self._step(rec, "replica-detach", f"replica {rep.index}: out of the router, drain (at most "
                               f"{profile.router.drain_timeout_s:g}s)",
                               lambda: detach(client, rep.url, drain_s=profile.router.drain_timeout_s),
                               rep.index)
                failure: list[SparkctlError] = []

                def replica_up() -> None:
                    try:
                        sub.up(profile, UpOptions(boot_timeout_s=opts.boot_timeout_s))
                    except SparkctlError as exc:
                        failure.append(exc)     # its own up restored (or never stopped) the old one: back in below
                        raise
                try:
                    self._step(rec, "replica-up", f"replica {rep.index}: up {profile.name} on "
                               f"{', '.join(rep.nodes)}", replica_up, rep.index)
                except SparkctlError:
                    if not failure:
                        raise
                if _serves(rep.url):
                    self._step(rec, "replica-attach", f"replica {rep.index}: back into the router",
                               lambda: attach(client, rep.url), rep.index)
                if failure:
                    rec.data["status"] = "failed"
                    rec.save()
                    done = [i for i in changed[:-1]]
                    raise failure[0].amended(message=(
                        f"replica {rep.index}: {failure[0].message} (the rolling update stopped there; replica "
                        f"{rep.index} serves as before{' and is back in the router' if _serves(rep.url) else ''}; "
                        + (f"replica(s) {', '.join(map(str, done))} run {profile.name}" if done else
                           f"no replica runs {profile.name} yet") + ")"))

            def gates() -> None:
                h = client.health()
                if not h.ready or h.healthy_workers != len(reps):
                    raise RouterError(f"router: {h.healthy_workers} of {len(reps)} replicas healthy ({h.detail})")
                m = client.metrics()               # its Prometheus view agrees: every replica's health gauge 1
                sick = [r.url for r in reps if not (m.workers.get(r.url) and m.workers[r.url].healthy)]
                if sick:
                    raise RouterError(f"router metrics: smg_worker_health is not 1 for {', '.join(sick)}",
                                      hint=f"see {spec.metrics_url}")
                r = httpx.post(spec.url + "/generate", json={"text": "gate", "sampling_params":
                               {"max_new_tokens": 4}}, timeout=profile.lifecycle.health_timeout_s, trust_env=False)
                if r.status_code != 200:
                    raise RouterError(f"router: a generation through it answered {r.status_code}",
                                      evidence=r.text[:500])
            self._step(rec, "router-gates", f"router ready with {len(reps)} healthy replicas; a generation "
                       f"through it", gates)

            def hand_off() -> None:
                rec.data.update(status="active", handed_off=now_iso())
                rec.save()
            self._step(rec, "hand-off", f"hand off {rec.data['endpoint']}", hand_off)
        return {"outcome": "deployed" if changed else "unchanged", "changed": bool(changed),
                "endpoint": rec.data["endpoint"], "replicas": len(reps), "updated": changed,
                "profile": profile.name, "cluster": self.inventory.cluster.name}

    # ---- status / down ---------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        rec = Record.load(self.ledger.root)
        out: dict[str, Any] = {"cluster": self.inventory.cluster.name, "replicated": True,
                               "profile": rec.data.get("profile"), "endpoint": rec.data.get("endpoint"),
                               "status": rec.data.get("status"), "replicas": []}
        r = rec.data.get("router") or {}
        client = RouterClient(r["url"], metrics_url=r.get("metrics_url")) if r else None
        listed = {}
        if client is not None:
            h = client.health()
            out["router"] = {"url": r["url"], "live": h.live, "ready": h.ready,
                             "healthy_workers": h.healthy_workers, "total_workers": h.total_workers}
            if h.live:
                listed = {w.url: w for w in client.list_workers()}
                try:
                    m = client.metrics()
                    out["router"]["requests_per_replica"] = {u: w.requests for u, w in m.workers.items()}
                except RouterError:
                    pass
        healthy = bool(client) and out.get("router", {}).get("ready", False)
        for rep in rec.data.get("replicas", []):
            inv = self.inventory
            sub_inv = _named(inv, rep["cluster"], rep["nodes"])
            st = Deployer(sub_inv, self.reporter).status()
            w = listed.get(rep["url"])
            out["replicas"].append({"index": rep["index"], "nodes": rep["nodes"], "url": rep["url"],
                                    "healthy": bool(st.get("healthy")), "in_router": w is not None,
                                    "router_healthy": bool(w and w.healthy), "deployment": st.get("active"),
                                    "ranks": [x.model_dump() if hasattr(x, "model_dump") else x
                                              for x in (st.get("ranks") or [])]})
            healthy &= bool(st.get("healthy")) and w is not None
        out["healthy"] = bool(healthy)
        return out

    def down(self) -> dict[str, Any]:
        rec = Record.load(self.ledger.root)
        stopped = []
        with self.ledger.lock("down"):
            r = rec.data.get("router")
            if r:
                proc = RouterProcess.from_dict(RouterSpec("127.0.0.1", 1), r)   # stop by PID + start time only
                proc.stop(timeout_s=10)
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
        return {"changed": bool(stopped), "stopped": stopped}


def _serves(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def _named(inv: Inventory, cluster: str, nodes: list[str]) -> Inventory:
    picked = [n.model_copy(update={"rank": i}) for i, n in enumerate(inv.node(x) for x in nodes)]
    return inv.model_copy(update={"nodes": picked, "cluster": inv.cluster.model_copy(update={"name": cluster})})


def replica_inventory(inventory: Inventory, entry: dict[str, Any]) -> Inventory:
    """The sub-inventory of one ``replicas`` entry of the record (its cluster name, its nodes re-ranked); read-only,
    for readers of a replicated deployment (the bench reaches each replica's ledger and runtimes through it)."""
    return _named(inventory, entry["cluster"], entry["nodes"])


def is_replicated(inventory: Inventory) -> bool:
    """The cluster's state directory holds an active replicated deployment (status and down go through it)."""
    return Record.load(Ledger.for_cluster(inventory.cluster.name).root).active
