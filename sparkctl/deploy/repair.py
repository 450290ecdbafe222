"""`sparkctl repair`: the one way out of a damaged ledger (Terraform's `state` surgery, done for you).

What it does, shown first and done only once confirmed:

* every record that does not load (not JSON, JSON of the wrong shape such as ``[]`` or ``{}``, a missing
  field) and a damaged ``cluster.json`` are **moved aside** to ``damaged/<name>.<timestamp>`` in the state
  directory: kept for inspection, never deleted, never overwritten;
* the index (``cluster.json``) is rebuilt from the records that load: history in creation order, entries
  whose record is gone dropped;
* the active deployment is rebuilt from **what actually runs** (docker containers labelled
  ``sparkctl.cluster=<name>``; processes writing to this ledger's rank logs): a deployment whose record
  loads becomes active again; one whose record was damaged gets a new record rebuilt from its engines and
  its profile (the profile name is part of the deployment id), with status ``recovered`` (it serves, but no
  gate verified it: not a rollback target). Engines whose profile cannot be loaded are left running and
  named (`sparkctl down` stops them: it finds engines on the nodes, not in the ledger);
* processes that outlived their engine (deploy/observe.py `leftovers`: a scheduler whose launcher died) are
  stopped: nothing of them serves, and they hold the rank's ports and memory.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from sparkctl.config.profile import load_profile
from sparkctl.deploy import compare
from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.observe import ObservedEngine, leftovers, observe, stop_leftovers
from sparkctl.deploy.plan import launch_identity
from sparkctl.deploy.steps import boundary
from sparkctl.errors import SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.nodes.enginegroup import Leftover
from sparkctl.nodes.ssh import connector_for
from sparkctl.router.container import labelled_routers, router_container_name
from sparkctl.router.launch import _container_side, logged_routers
from sparkctl.router.replicas import render_replicas, replica_cluster, router_spec
from sparkctl.state.cards import SCHEMA as CARDS_SCHEMA
from sparkctl.state.cards import card_entry, read_card
from sparkctl.state.ledger import Ledger, now_iso, read_json
from sparkctl.state.records import DeploymentRecord, ReplicatedRecord, Status
from sparkctl.state.tunejournal import MARKER, parse_journal, read_marker
from sparkctl.statefiles import write_json_atomic

_ID = re.compile(r"^\d{8}T\d{6}Z-(?P<profile>.+)-[0-9a-f]{4}$")


@dataclass
class RepairPlan:
    damaged: list[tuple[Path, str]] = field(default_factory=list)     # file, why
    history: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)                  # history entries without a record
    active_before: str | None = None
    active: str | None = None
    rebuilt: DeploymentRecord | None = None
    notes: list[str] = field(default_factory=list)
    index_changed: bool = False
    leftovers: list[Leftover] = field(default_factory=list)          # processes that outlived their engine
    replicated: ReplicatedRecord | None = None    # replicated.json rebuilt from the replicas and router that run

    @property
    def changes(self) -> bool:
        return bool(self.damaged or self.dropped or self.rebuilt or self.index_changed or self.leftovers
                    or self.replicated or self.active != self.active_before)

    def lines(self) -> list[str]:
        out = [f"move aside {p.name if p.parent.name in ('deployments', '') else p}: {why}" for p, why in self.damaged]
        out += [f"drop {i} from the history: its record is missing" for i in self.dropped]
        if self.rebuilt is not None:
            r = self.rebuilt
            out.append(f"rebuild {r.id} ({r.profile}) from its running engines: "
                       + ", ".join(f"rank {h.rank} {h.where} on {h.node}" for h in r.handles)
                       + " (status recovered: serving, not verified by gates)")
        if self.replicated is not None:
            rep = self.replicated
            router = rep.router
            out.append(f"rebuild replicated.json ({rep.profile}) from what runs: "
                       + (f"the router ({router.runs_as} at {router.url}) and " if router else "no router, ")
                       + ", ".join(f"replica {e.index} ({e.cluster}: {e.url})" for e in rep.replicas))
        if self.active != self.active_before:
            out.append(f"active deployment: {self.active_before or 'none'} -> {self.active or 'none'}")
        elif self.index_changed:
            out.append(f"rewrite cluster.json (history of {len(self.history)}, active {self.active or 'none'})")
        out += [f"stop leftover processes of {lo.describe()} (they outlived their engine)" for lo in self.leftovers]
        return out + [f"note: {n}" for n in self.notes]

    def as_dict(self) -> JSONObject:
        return {"changes": self.lines() if self.changes else [], "active": self.active,
                "damaged": [str(p) for p, _ in self.damaged], "notes": self.notes}


def _ledger_state(ledger: Ledger, plan: RepairPlan) -> tuple[dict[str, DeploymentRecord], JSONObject | None]:
    good: dict[str, DeploymentRecord] = {}
    for path in sorted((ledger.root / "deployments").glob("*.json")):
        try:
            rec = ledger.load(path.stem)
        except SparkctlError as exc:
            plan.damaged.append((path, exc.message))
            continue
        good[rec.id] = rec
    index = None
    try:
        index = ledger.read_index_file()
    except SparkctlError as exc:
        plan.damaged.append((ledger.index_path, exc.message))
    plan.damaged += damaged_files(ledger)
    return good, index


def damaged_files(ledger: Ledger) -> list[tuple[Path, str]]:
    """Every other file sparkctl writes in a cluster's state directory that does not read back as what sparkctl
    wrote, with why: the cards (``runs/<id>/report.json``), the tune journals (``runs/<id>/tune.json``), the tune
    and comparison markers (``tune.json``, ``compare.json``), the replicated deployment's record
    (``replicated.json``) and the card index (``cards.json``, derived: rebuilt from the cards once moved aside).
    The deployment records and ``cluster.json`` are `_ledger_state`'s; the lock and its holder, the logs and the
    secrets are not records (the lock frees itself; logs are text; secrets go with their engine)."""

    out: list[tuple[Path, str]] = []
    runs = ledger.root / "runs"
    for path in sorted(runs.glob("*/report.json")) if runs.is_dir() else []:
        try:
            card_entry(read_card(path), path)
        except SparkctlError as exc:
            out.append((path, exc.message))
    for path in sorted(runs.glob("*/tune.json")) if runs.is_dir() else []:
        try:
            parse_journal(read_json(path), path, path.parent.name)
        except SparkctlError as exc:
            out.append((path, exc.message))
    marker = ledger.root / MARKER
    if marker.exists():
        try:
            read_json(marker)
            read_marker(ledger)
        except SparkctlError as exc:
            out.append((marker, exc.message))
    cmp = ledger.root / compare.NAME
    if cmp.exists():
        try:
            compare.read_marker(cmp)
        except SparkctlError as exc:
            out.append((cmp, exc.message))
        except ValueError as exc:                     # pydantic's ValidationError
            first = exc.errors()[0] if hasattr(exc, "errors") else {"loc": (), "msg": str(exc)}
            where = ".".join(map(str, first["loc"])) or "(top)"
            out.append((cmp, f"the comparison marker is not what sparkctl writes at {where}: {first['msg']}"))
    replicated = ledger.root / "replicated.json"      # state.replicated.RECORD (read here without that layer)
    if replicated.exists():
        try:
            ReplicatedRecord.model_validate(read_json(replicated))
        except SparkctlError as exc:
            out.append((replicated, exc.message))
        except ValueError as exc:                     # pydantic's ValidationError
            first = exc.errors()[0] if hasattr(exc, "errors") else {"loc": (), "msg": str(exc)}
            out.append((replicated, f"the replicated deployment's record has the wrong shape at "
                                    f"{'.'.join(map(str, first['loc'])) or '(top)'}: {first['msg']}"))
    index = ledger.root / "cards.json"
    if index.exists():
        try:
            data = read_json(index)
            if not (isinstance(data, dict) and data.get("schema") == CARDS_SCHEMA
                    and isinstance(data.get("cards"), dict)):
                out.append((index, "the card index has an unexpected shape (it is rebuilt from the cards)"))
        except SparkctlError as exc:
            out.append((index, exc.message + " (it is rebuilt from the cards)"))
    return out


def aside_name(ledger: Ledger, path: Path) -> str:
    """The name a damaged file gets under ``damaged/`` (before its timestamp): a record or the index keeps its own
    name; a file deeper down is named by its place (``runs__<id>__report.json``), so two never collide."""
    try:
        rel = path.relative_to(ledger.root)
    except ValueError:
        return path.name
    if len(rel.parts) == 1 or rel.parts[0] == "deployments":
        return path.name
    return "__".join(rel.parts)


def _rebuild(d: Cluster, dep_id: str, engines: list[ObservedEngine]) -> DeploymentRecord | str:
    """A record for running engines whose own record is damaged, or why it cannot be rebuilt."""
    m = _ID.match(dep_id)
    if not m:
        return f"deployment id {dep_id!r} does not name a profile"
    try:
        profile = load_profile(m.group("profile"))
        result = d.render(profile)
    except SparkctlError as exc:
        return f"profile {m.group('profile')!r}: {exc.message}"
    spec0 = result.specs[0]
    return DeploymentRecord(
        id=dep_id, command="repair", profile=profile.name, profile_data=profile.model_dump(mode="json"),
        inventory=d.inventory.path, cluster=d.inventory.cluster.name, emulated=d.inventory.emulated,
        identity=launch_identity(result), sglang_version=profile.engine_version(), engine=profile.engine,
        specs=[s.redacted() for s in result.specs], created=now_iso(), status=Status.RECOVERED,
        handles=[e.handle for e in sorted(engines, key=lambda e: -e.handle.rank)],
        endpoint=f"http://{spec0.api_host}:{spec0.api_port}",
        speculative_algorithm=profile.speculative.algorithm if profile.speculative else None,
        settled=f"rebuilt by `sparkctl repair` at {now_iso()} from its running engines")


def plan_repair(d: Cluster) -> RepairPlan:
    """What `repair` would change (nothing is changed here)."""
    ledger = d.ledger
    plan = RepairPlan()
    good, index = _ledger_state(ledger, plan)
    old_history = list(index["history"]) if index else []
    plan.active_before = index.get("active") if index else None
    plan.history = [i for i in old_history if i in good]
    plan.dropped = [i for i in old_history if i not in good and i not in {p.stem for p, _ in plan.damaged}]
    plan.history += sorted((i for i in good if i not in plan.history), key=lambda i: good[i].created)
    running: dict[str, list[ObservedEngine]] = {}
    for e in observe(d):
        if e.running:
            running.setdefault(e.deployment, []).append(e)
    active = plan.active_before if plan.active_before in good else None
    if active is None or active not in running:
        candidates = [i for i in running if i in good] or [i for i in running if i not in good]
        if candidates:
            dep_id = max(candidates)            # ids start with their UTC time: the newest
            if dep_id in good:
                active = dep_id
            else:
                rebuilt = _rebuild(d, dep_id, running[dep_id])
                if isinstance(rebuilt, DeploymentRecord):
                    plan.rebuilt, active = rebuilt, dep_id
                    plan.history.append(dep_id)
                else:
                    plan.notes.append(f"engines of {dep_id} run but cannot be rebuilt ({rebuilt}); "
                                      f"`sparkctl down` stops them")
    for dep_id, engines in running.items():
        if dep_id != active and (dep_id in good or plan.rebuilt is None or dep_id != plan.rebuilt.id):
            plan.notes.append(f"{len(engines)} engine(s) of {dep_id} run besides the active deployment; "
                              f"`sparkctl down` or the next `up` stops them")
    if plan.rebuilt is not None and plan.rebuilt.id in plan.dropped:
        plan.dropped.remove(plan.rebuilt.id)           # its record comes back
    order = {i: n for n, i in enumerate(old_history)}
    plan.history.sort(key=lambda i: (order.get(i, len(order)), i))   # ids start with their UTC time
    plan.active = active
    plan.leftovers = leftovers(d)
    plan.index_changed = index is None or plan.history != old_history or active != plan.active_before
    if index is None and not plan.history and not plan.damaged:
        plan.index_changed = False
    replicated = d.ledger.root / "replicated.json"
    if any(p == replicated for p, _ in plan.damaged):
        plan.replicated = _rebuild_replicated(d, plan.notes)
    return plan


def _rebuild_replicated(d: Cluster, notes: list[str]) -> ReplicatedRecord | None:
    """The replicated deployment's record, rebuilt from what runs (as one group's record is from its engines):
    each replica's own ledger (``<cluster>.r<i>`` beside this one: its active deployment) and the router that runs
    for this cluster (a process writing this ledger's router log; a container labelled with the cluster). None,
    with a note, when no replica runs: then there is nothing to record."""
    name = d.inventory.cluster.name
    actives = []
    for index in range(256):
        ledger = Ledger.for_cluster(replica_cluster(name, index))
        if not ledger.root.is_dir():
            break
        try:
            rec = ledger.active()
        except SparkctlError as exc:
            notes.append(f"replica {index}'s own ledger ({ledger.root}) is damaged ({exc.message}): it is left out "
                         f"of the rebuilt record and this command does not repair it")
            rec = None
        if rec is not None:
            actives.append((index, ledger.root.name, rec))
    if not actives:
        notes.append("no replica runs: the replicated record is not rebuilt (nothing to record)")
        return None
    try:
        profile = actives[0][2].deployed_profile()
        if profile.replicas <= 1:
            raise SparkctlError(f"replica 0 runs profile {profile.name}, which has no replicas")
        spec = router_spec(profile, d.inventory, render_replicas(profile, d.inventory))
    except (SparkctlError, ValueError) as exc:
        notes.append(f"the replicas' profile cannot be laid out again ({exc}); `sparkctl down` stops them")
        return None
    router = _running_router(d, spec.url, spec.metrics_url)
    if router is None:
        notes.append("no router of this cluster runs: the rebuilt record names none (`sparkctl up` starts one)")
    data: JSONObject = {
        "profile": profile.name, "endpoint": spec.url, "status": "active", "started": actives[0][2].created,
        "handed_off": now_iso(), "router": router, "journal": [],
        "replicas": [{"index": i, "url": rec.endpoint, "nodes": [h.node for h in sorted(rec.handles, key=lambda
                     h: h.rank)], "cluster": cluster} for i, cluster, rec in actives]}
    return ReplicatedRecord.model_validate(data)


def _running_router(d: Cluster, url: str, metrics_url: str | None) -> JSONObject | None:
    """The router that runs for this cluster, as a record entry: on the process runtime the process whose output
    is this ledger's router log (its PID and start time), on docker the container labelled with the cluster."""
    base: JSONObject = {"url": url, "metrics_url": metrics_url}
    if _container_side(d.inventory):
        node = d.inventory.rank0
        found = labelled_routers(connector_for(d.inventory, node), d.inventory.cluster.name)
        return {**base, "runtime": "container", "node": node.name, "container_id": found[0], "image": None,
                "container": router_container_name(d.inventory.cluster.name)} if found else None
    log = d.ledger.root / "logs" / "router.log"
    for pid, ticks in logged_routers(log):
        return {**base, "runtime": "process", "pid": pid, "ticks": ticks, "log": str(log)}
    return None


def apply_repair(d: Cluster, plan: RepairPlan) -> None:
    ledger = d.ledger
    stamp = now_iso().replace(":", "")
    aside = ledger.root / "damaged"
    aside.mkdir(parents=True, exist_ok=True, mode=0o700)
    boundary("repair", "move-aside", "before")
    for path, _ in plan.damaged:
        if path.exists() or path.is_symlink():
            path.rename(aside / f"{aside_name(ledger, path)}.{stamp}")   # each a rename: again after a crash, a no-op
    boundary("repair", "move-aside", "after")
    boundary("repair", "rebuild", "before")
    if plan.rebuilt is not None:
        ledger.save(plan.rebuilt)
    if plan.replicated is not None:
        write_json_atomic(ledger.root / "replicated.json", plan.replicated.model_dump(mode="json", by_alias=True))
    boundary("repair", "rebuild", "after")
    boundary("repair", "index", "before")
    if plan.index_changed or plan.damaged or plan.dropped:
        write_json_atomic(ledger.index_path, {"active": ledger.active_id(), "history": plan.history})
    boundary("repair", "index", "after")
    if plan.leftovers:
        stop_leftovers(d, plan.leftovers)
