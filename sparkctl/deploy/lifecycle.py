"""The deployment lifecycle: up, rollback, down, status.

`up` = plan -> preflight -> image -> boot -> warm-up -> verify -> hand off, each stage
timed and recorded in the ledger. A failure in boot, warm-up or verify stops the new
engines and restores the previous deployment (restarted and verified) unless
no_rollback; Ctrl-C does the same, so nothing is left running that was not there.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.deploy.boot import BootResult, boot
from sparkctl.deploy.gates import Gate, run_gates
from sparkctl.deploy.plan import Plan, launch_identity, make_plan
from sparkctl.deploy.preflight import Check, ports_of, run_preflight
from sparkctl.deploy.progress import Reporter
from sparkctl.deploy.runtimes import Runtimes
from sparkctl.deploy.warmup import warm_up
from sparkctl.errors import CancelledError, DeployError, PreflightError, SparkctlError
from sparkctl.nodes.runtime import Handle, Runtime
from sparkctl.sglang.client import SGLangAPIError, SGLangClient
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.sglang.render import RenderResult, render
from sparkctl.state.ledger import Ledger, Stopwatch, now_iso

log = logging.getLogger("sparkctl.deploy")


@dataclass
class UpOptions:
    dry_run: bool = False
    no_rollback: bool = False
    boot_timeout_s: float | None = None
    confirm: Callable[[Plan], bool] | None = None   # None: proceed without asking


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
    def _client(spec0: LaunchSpec | dict[str, Any], key_env: str | None, timeout: float = 60.0) -> SGLangClient:
        """Client for rank 0's API; the API key comes from the environment variable the profile names."""
        host = spec0.api_host if isinstance(spec0, LaunchSpec) else spec0["api_host"]
        port = spec0.api_port if isinstance(spec0, LaunchSpec) else spec0["api_port"]
        key = os.environ.get(key_env) if key_env else None
        return SGLangClient(f"http://{host}:{port}", api_key=key or None, timeout=timeout)

    def _health_probe(self, spec0: LaunchSpec, key_env: str | None) -> Callable[[], bool]:
        """True once rank 0's /health answers 200 (connection refused or 503 = not yet)."""
        client = self._client(spec0, key_env, timeout=5)

        def probe() -> bool:
            try:
                return client.health() == 200
            except SGLangAPIError:
                return False
        return probe

    def health_of(self, record: dict[str, Any]) -> tuple[bool, str, list[dict[str, Any]]]:
        """Live health of a recorded deployment: every rank alive, rank 0 /health 200."""
        rts = self.runtimes(record["id"])
        ranks, healthy = [], True
        for handle in record.get("handles") or []:
            live = rts.for_node(handle["node"]).liveness(handle)
            entry = {"rank": handle["rank"], "node": handle["node"], "alive": live.alive, "state": live.detail}
            if handle["rank"] == 0 and live.alive:
                try:
                    key_env = ((record.get("profile_data") or {}).get("api") or {}).get("api_key_env")
                    with self._client(record["specs"][0], key_env, timeout=5) as c:
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

    def _render(self, profile: Profile) -> RenderResult:
        return render(profile, self.inventory)

    def plan(self, profile: Profile) -> tuple[RenderResult, Plan]:
        result = self._render(profile)
        active = self.ledger.active()
        healthy, detail = (self.health_of(active)[:2] if active else (False, ""))
        return result, make_plan(result, active, healthy, detail)

    # -- up --------------------------------------------------------------------------------------------------------
    def up(self, profile: Profile, opts: UpOptions, *, kind: str = "up") -> dict[str, Any]:
        r = self.reporter
        r.stage("plan", f"profile {profile.name} on cluster {self.inventory.cluster.name}"
                        + (" (embedded, emulated engine)" if self.inventory.embedded else ""))
        result, plan = self.plan(profile)
        for w in result.warnings:
            r.event(f"warning: {w}")
        for line in plan.lines():
            r.event(line)
        base = {"profile": profile.name, "plan": plan.as_dict(), "emulated": self.inventory.emulated,
                "cluster": self.inventory.cluster.name}
        if plan.noop:
            return {**base, "changed": False, "outcome": "unchanged", "reason": plan.noop_reason,
                    "deployment": plan.active_id, "endpoint": self._endpoint(result.specs[0])}
        if opts.dry_run:
            return {**base, "changed": False, "outcome": "dry-run"}
        if opts.confirm is not None and not opts.confirm(plan):
            raise CancelledError("cancelled at the confirmation prompt; nothing was changed")
        with self.ledger.lock(kind):
            # Re-plan under the lock: another command may have changed the cluster meanwhile.
            result, plan = self.plan(profile)
            if plan.noop:
                return {**base, "changed": False, "outcome": "unchanged", "reason": plan.noop_reason,
                        "deployment": plan.active_id}
            return {**base, **self._apply(profile, result, plan, opts, kind)}

    def _endpoint(self, spec0: LaunchSpec) -> str:
        return f"http://{spec0.api_host}:{spec0.api_port}"

    def _new_record(self, profile: Profile, result: RenderResult, plan: Plan, kind: str) -> dict[str, Any]:
        active = self.ledger.active()
        prev_good = self.ledger.known_good()
        return {
            "id": self.ledger.new_id(profile.name), "kind": kind, "profile": profile.name,
            "profile_data": profile.model_dump(mode="json"), "inventory": self.inventory.path,
            "cluster": self.inventory.cluster.name,
            "emulated": self.inventory.emulated,
            "identity": plan.identity, "sglang_version": profile.image.sglang_version,
            "specs": [s.redacted() for s in result.specs], "warnings": result.warnings,
            "status": "running", "known_good": False, "created": now_iso(), "stages": [], "gates": [],
            "previous": active["id"] if active else None,
            "previous_known_good": prev_good["id"] if prev_good else None,
            "handles": [], "capacity": None, "warmup": None, "failure": None, "restored": None,
            "endpoint": self._endpoint(result.specs[0]),
            "speculative_algorithm": profile.speculative.algorithm if profile.speculative else None,
        }

    def _stage(self, record: dict[str, Any], name: str, fn: Callable[[], Any], message: str = "") -> Any:
        self.reporter.stage(name, message)
        sw = Stopwatch()
        entry = {"name": name, "started": now_iso(), "status": "running"}
        record["stages"].append(entry)
        self.ledger.save(record)
        try:
            value = fn()
        except BaseException as exc:
            entry.update(status="failed", elapsed_s=sw.elapsed(),
                         error=exc.render() if isinstance(exc, SparkctlError) else f"{type(exc).__name__}: {exc}")
            self.ledger.save(record)
            raise
        entry.update(status="ok", elapsed_s=sw.elapsed())
        self.reporter.event(f"done in {entry['elapsed_s']:.2f}s")
        self.ledger.save(record)
        return value

    def _apply(self, profile: Profile, result: RenderResult, plan: Plan, opts: UpOptions,
               kind: str) -> dict[str, Any]:
        record = self._new_record(profile, result, plan, kind)
        dep_id = record["id"]
        self.ledger.save(record)
        self.ledger.add_to_history(dep_id)
        active = self.ledger.active()
        rts = self.runtimes(dep_id)
        started: list[tuple[Runtime, Handle]] = []
        stopped_previous = False
        total = Stopwatch()
        try:
            own = self._own_ports(active)
            checks = self._stage(record, "preflight", lambda: self._preflight(result, rts, own),
                                 f"{len(result.specs)} nodes in parallel")
            record["preflight"] = [c.as_dict() for c in checks]
            record["image_ids"] = self._stage(record, "image", lambda: self._image(result, rts))
            if active:
                self._stage(record, "stop-old", lambda: self._stop_record(active, keep=True),
                            f"stopping {active['id']} (kept restartable)")
                stopped_previous = True
            timeout = opts.boot_timeout_s or profile.lifecycle.boot_timeout_s
            booted: BootResult = self._stage(
                record, "boot", lambda: boot(result.specs, rts.for_node, dep_id, self.reporter, timeout_s=timeout,
                                             started=started,
                                             ready_probe=self._health_probe(result.specs[0], profile.api.api_key_env)),
                f"rank {len(result.specs) - 1} first, rank 0 last (timeout {timeout:.0f}s)")
            record["handles"] = booted.handles
            record["capacity"] = booted.capacity()
            client = self._client(result.specs[0], profile.api.api_key_env, timeout=profile.warmup.timeout_s)
            with client:
                record["warmup"] = self._stage(record, "warm-up",
                                               lambda: warm_up(profile, client, self.reporter, result.specs[0].node))
                self._stage(record, "verify", lambda: self._verify(profile, client, booted, record))
            record.update(status="successful", known_good=True, finished=now_iso(),
                          elapsed_s=total.elapsed(), handed_off=now_iso())
            self.ledger.save(record)
            if active and active["id"] != dep_id:
                self._mark_superseded(active, dep_id)
            self.ledger.set_active(dep_id)
            self.reporter.stage("hand-off", f"{record['endpoint']} serves {profile.model.served_name} "
                                            f"({profile.name}, deployment {dep_id})")
            return {"changed": True, "outcome": "deployed", "deployment": dep_id, "endpoint": record["endpoint"],
                    "emulated": record["emulated"],
                    "capacity": record["capacity"], "gates": record["gates"], "stages": record["stages"],
                    "warmup": record["warmup"], "elapsed_s": record["elapsed_s"]}
        except PreflightError as exc:
            record.update(status="failed", finished=now_iso(), elapsed_s=total.elapsed(),
                          failure={"stage": "preflight", "message": exc.render()},
                          preflight=[c.as_dict() for c in exc.checks])
            self.ledger.save(record)
            raise
        except (Exception, KeyboardInterrupt) as exc:
            interrupted = isinstance(exc, KeyboardInterrupt)
            stage = next((s["name"] for s in reversed(record["stages"]) if s.get("status") != "ok"), "unknown")
            message = "interrupted (SIGINT)" if interrupted else (
                exc.render() if isinstance(exc, SparkctlError) else f"{type(exc).__name__}: {exc}")
            record.update(status="canceled" if interrupted else "failed", finished=now_iso(),
                          elapsed_s=total.elapsed(), failure={"stage": stage, "message": message,
                                                              "node": getattr(exc, "node", None)})
            record["handles"] = record["handles"] or [h for _, h in started]
            self.ledger.save(record)
            if opts.no_rollback and not interrupted:
                self.reporter.event("--no-rollback: leaving the failed engines as they are for inspection")
                record["rollback"] = "skipped (--no-rollback)"
                self.ledger.save(record)
                raise
            self._cleanup(started)
            record["rollback"] = "new engines stopped"
            if stopped_previous and active:
                record["restored"] = self._restore(active, record)
            self.ledger.save(record)
            if interrupted:
                raise
            if isinstance(exc, SparkctlError):
                restored = f"; restored {record['restored']}" if record.get("restored") else (
                    "; nothing to restore (no previous deployment)" if not active else "")
                exc.message += restored
                raise
            raise DeployError(f"{stage} failed: {message}", where=f"deployment {dep_id}") from exc

    # -- stages ------------------------------------------------------------------------------------------------------
    def _own_ports(self, active: dict[str, Any] | None) -> set[tuple[str, int]]:
        if not active:
            return set()
        out: set[tuple[str, int]] = set()
        for s in active.get("specs") or []:
            spec = LaunchSpec(rank=s["rank"], node=s["node"], argv=s["argv"], env=s["env"],
                              sglang_version=s["sglang_version"])
            out.update((a, p) for a, p, _ in ports_of(spec))
        return out

    def _preflight(self, result: RenderResult, rts: Runtimes, own: set[tuple[str, int]]) -> list[Check]:
        from sparkctl.deploy.host_checks import CrossNodeChecks
        cross = CrossNodeChecks(self.inventory)   # model parity, fabric MTU equal, fabric SSH (host preparation)

        def node_checks(spec: LaunchSpec) -> list[Check]:
            checks = rts.for_node(spec.node).preflight(spec, own)
            cross.collect(spec, rts.for_node(spec.node))
            return checks
        checks = run_preflight(result.specs, node_checks, then=cross.checks)
        for c in checks:
            self.reporter.event(f"{c.name}: {c.seen}", c.node)
        return checks

    def _image(self, result: RenderResult, rts: Runtimes) -> dict[str, str]:
        """The same engine image (by ID) on every docker node: copied where missing, refused when they differ."""
        from sparkctl.images.distribute import ensure_same_image

        docker: dict[str, Any] = {}
        for spec in result.specs:
            rt = rts.for_node(spec.node)
            if rt.kind == "docker":
                docker[spec.node] = rt
            else:
                self.reporter.event("no image: the process runtime runs the emulator in place", spec.node)
        if not docker:
            return {}
        image = result.specs[0].image or ""
        return ensure_same_image(image, docker, lambda msg, node: self.reporter.event(msg, node))

    def _verify(self, profile: Profile, client: SGLangClient, booted: BootResult,
                record: dict[str, Any]) -> list[Gate]:
        gates = run_gates(profile, client, booted.watches)
        record["gates"] = [g.as_dict() for g in gates]
        try:  # the engine says whether it is the emulator (sparkctl.sim sets "emulated": true)
            record["emulated"] = bool(record["emulated"] or client.server_info().get("emulated"))
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

    def _stop_record(self, record: dict[str, Any], *, keep: bool) -> None:
        """Stop every rank of a deployment, all nodes in parallel."""
        from concurrent.futures import ThreadPoolExecutor

        rts = self.runtimes(record["id"])
        handles = sorted(record.get("handles") or [], key=lambda h: h["rank"])

        def stop(handle: Handle) -> None:
            rt = rts.for_node(handle["node"])
            rt.stop(handle)
            if not keep:
                rt.remove(handle)
            self.reporter.event(f"rank {handle['rank']} stopped", handle["node"])
        with ThreadPoolExecutor(max_workers=max(1, len(handles))) as pool:
            list(pool.map(stop, handles))

    def _cleanup(self, started: list[tuple[Runtime, Handle]]) -> None:
        for rt, handle in sorted(started, key=lambda x: x[1]["rank"]):
            try:
                rt.stop(handle)
                rt.remove(handle)
                self.reporter.event(f"rank {handle['rank']} of the failed deployment stopped", handle["node"])
            except Exception as exc:  # noqa: BLE001 - keep cleaning the other ranks
                self.reporter.event(f"could not stop rank {handle['rank']}: {exc}", handle["node"])

    def _mark_superseded(self, old: dict[str, Any], new_id: str) -> None:
        """The old deployment stays stopped-but-restartable; the ones superseded before it are removed."""
        old = self.ledger.load(old["id"])
        old.update(status="superseded", superseded_by=new_id, stopped=now_iso())
        self.ledger.save(old)
        # Every hand-off prunes all older superseded engines, so walking back from the newest record can stop at
        # the first one already pruned: the scan stays a few records long however long the history grows.
        for dep_id in reversed(self.ledger.index()["history"]):
            if dep_id in (old["id"], new_id):
                continue
            try:
                rec = self.ledger.load(dep_id)
            except SparkctlError:
                continue  # a damaged record is reported by the commands that read it; never rewritten here
            if rec.get("engines_removed"):
                break
            if rec.get("status") == "superseded" and rec.get("handles"):
                try:
                    self._stop_record(rec, keep=False)
                    rec["engines_removed"] = now_iso()
                    self.ledger.save(rec)
                except SparkctlError as exc:
                    self.reporter.event(f"could not remove the engines of {dep_id}: {exc.message}")

    def _restore(self, previous: dict[str, Any], failed: dict[str, Any]) -> str | None:
        """Bring a stopped known deployment back: restart its ranks, wait ready, verify. Returns its id."""
        self.reporter.stage("rollback", f"restoring {previous['id']} ({previous['profile']})")
        try:
            profile = Profile.model_validate(previous["profile_data"])
            result = self._render(profile)
            if launch_identity(result) != previous.get("identity"):
                self.reporter.event("note: re-rendered launch identity differs from the record "
                                    "(inventory or secrets changed); restoring the re-rendered launch")
            rts = self.runtimes(previous["id"])
            started: list[tuple[Runtime, Handle]] = []
            booted = boot(result.specs, rts.for_node, previous["id"], self.reporter,
                          timeout_s=profile.lifecycle.boot_timeout_s, started=started,
                          ready_probe=self._health_probe(result.specs[0], profile.api.api_key_env))
            with self._client(result.specs[0], profile.api.api_key_env) as client:
                gates = run_gates(profile, client, booted.watches)
            bad = [g.name for g in gates if not g.ok]
            for g in gates:
                if not g.ok:
                    self.reporter.event(f"FAIL {g.name}: {g.evidence}")
            prev = self.ledger.load(previous["id"])
            prev.update(handles=booted.handles, status="successful" if not bad else "failed",
                        restored_at=now_iso(), restored_after=failed["id"])
            prev.setdefault("restores", []).append({"at": now_iso(), "after": failed["id"],
                                                    "gates": [g.as_dict() for g in gates]})
            self.ledger.save(prev)
            if bad:
                self.reporter.event(f"restored deployment failed gates: {', '.join(bad)}")
                self._cleanup(started)
                self.ledger.set_active(None)
                return None
            self.ledger.set_active(previous["id"])
            self.reporter.event(f"restored {previous['id']}: serving again at {prev['endpoint']}")
            return previous["id"]
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - report, keep the ledger consistent
            self.reporter.event(f"restore of {previous['id']} failed: {exc}")
            self.ledger.set_active(None)
            return None

    def preflight(self, profile: Profile) -> list[Check]:
        """Read-only checks on every node for this profile (what `up` runs first); raises PreflightError."""
        result = self._render(profile)
        self.reporter.stage("preflight", f"profile {profile.name}: {len(result.specs)} nodes in parallel")
        return self._preflight(result, self.runtimes("preflight"), self._own_ports(self.ledger.active()))

    # -- rollback / down / status ------------------------------------------------------------------------------------
    def rollback_target(self) -> dict[str, Any]:
        active_id = self.ledger.index().get("active")
        target = self.ledger.known_good(exclude=active_id)
        if target is None:
            raise DeployError("no earlier known-good deployment to roll back to", where=str(self.ledger.root),
                              hint="use `sparkctl rollback --to PROFILE` (e.g. dflash-off)")
        return target

    def down(self) -> dict[str, Any]:
        with self.ledger.lock("down"):
            active = self.ledger.active()
            if not active:
                return {"changed": False, "reason": "no active deployment"}
            self.reporter.stage("down", f"stopping {active['id']} ({active['profile']})")
            self._stop_record(active, keep=False)
            rec = self.ledger.load(active["id"])
            rec.update(status="stopped", stopped=now_iso())
            self.ledger.save(rec)
            self.ledger.set_active(None)
            return {"changed": True, "stopped": active["id"]}

    def status(self) -> dict[str, Any]:
        active = self.ledger.active()
        if not active:
            idx = self.ledger.index()
            return {"cluster": self.inventory.cluster.name, "active": None, "history": len(idx["history"]),
                    "emulated": self.inventory.emulated}
        healthy, detail, ranks = self.health_of(active)
        return {"cluster": self.inventory.cluster.name, "active": active["id"], "profile": active["profile"],
                "healthy": healthy, "ranks": ranks, "endpoint": active["endpoint"],
                "speculative_algorithm": active.get("speculative_algorithm"), "identity": active["identity"],
                "sglang_version": active.get("sglang_version"),
                "images": sorted({s.get("image") for s in active["specs"] if s.get("image")}),
                "image_ids": active.get("image_ids") or {},
                "since": active.get("handed_off") or active.get("restored_at") or active.get("created"),
                "capacity": active.get("capacity"), "emulated": active.get("emulated", False), "detail": detail}
