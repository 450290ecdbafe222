"""Which router runs, by the inventory's runtime: a local process on the embedded cluster (`RouterProcess`), a
container from the engine image on rank 0's node on Sparks (`RouterContainer`). Both answer the same small
interface (`Router`), so the replicated deployment starts, finds, checks and stops either one the same way::

    router = start_router(inventory, spec, image=image, log_path=root / "logs" / "router.log")
    record["router"] = router.to_dict()
    router = recorded_router(inventory, spec, record["router"])     # a later command: None when it no longer runs
    router.stop()
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sparkctl.errors import ConfigError
from sparkctl.extras import require
from sparkctl.jsontypes import JSONObject
from sparkctl.nodes import procfs
from sparkctl.nodes.ssh import connector_for
from sparkctl.router import RouterError
from sparkctl.router.container import RouterContainer, labelled_routers, router_container_name
from sparkctl.router.process import RouterProcess, _runs_router, ports_free
from sparkctl.router.spec import RouterSpec

if TYPE_CHECKING:
    from sparkctl.config.inventory import Inventory


class Router(Protocol):
    runtime: str                   # "process" | "container" (kept in the record)
    kept: bool                     # start found it already running this launch (nothing was started)
    spec: RouterSpec

    @property
    def where(self) -> str: ...      # "pid 123", "container sparkctl-desk-router on spark-a"

    def alive(self) -> bool: ...

    def stop(self, timeout_s: float = 10.0) -> bool | None: ...   # container: False when nothing of ours was there

    def to_dict(self) -> JSONObject: ...

    def log_tail(self, lines: int = 20) -> str: ...


def _container_side(inventory: Inventory) -> bool:
    return inventory.rank0.runtime == "docker"


ROUTER_HERE = "the router in front of the replicas (run on this machine for the embedded cluster)"


def check_ports(inventory: Inventory, spec: RouterSpec) -> None:
    """The router can start where it will run, before anything boots: on the embedded cluster its ports are free
    (else RouterError naming who holds them) and the `router` extra is installed (else MissingExtraError); on
    Sparks the router container's own bind fails and its start says so."""
    if not _container_side(inventory):
        require("router", ROUTER_HERE)
        ports_free(spec)


def start_router(inventory: Inventory, spec: RouterSpec, *, image: str | None, log_path: Path,
                 ready_timeout_s: float = 60.0) -> Router:
    """Start the router where the inventory's rank 0 runs its engine and wait until it is live (RouterError
    otherwise, with its log tail). ``image``: the engine image the replicas run (docker runtime only)."""
    if _container_side(inventory):
        node = inventory.rank0
        if not image:
            raise ConfigError(f"no engine image to run the router from on {node.name}",
                              hint="set sparkctl_engine_image in the inventory or image.ref in the profile")
        return RouterContainer.start(spec, connector_for(inventory, node), node=node.name,
                                     cluster=inventory.cluster.name, image=image, ready_timeout_s=ready_timeout_s)
    require("router", ROUTER_HERE)
    return RouterProcess.start(spec, log_path, ready_timeout_s=ready_timeout_s)


def recorded_runtime(d: JSONObject) -> str:
    """How the router a record names runs: "process" or "container" (written as "kind" until 2026-12; a record from
    before either was kept is a process)."""
    return str(d.get("runtime") or d.get("kind") or "process")


def from_record(inventory: Inventory, spec: RouterSpec, d: JSONObject) -> Router:
    """The router a record names (its runtime from the record: `recorded_runtime`)."""
    if recorded_runtime(d) == "container":
        bad = [k for k in ("node", "container") if not isinstance(d.get(k), str) or not d[k]]
        bad += [k for k in ("container_id", "image") if d.get(k) is not None and not isinstance(d[k], str)]
        if not _container_side(inventory):
            raise RouterError(f"the record names a router container on {d.get('node')!r}, but this inventory runs "
                              f"its engines as local processes ({inventory.path})",
                              hint="use the inventory the replicated deployment was made with (--inventory), or "
                                   "move its record (replicated.json) aside")
        if bad or d.get("node") not in {n.name for n in inventory.nodes}:
            raise RouterError(f"the recorded router container entry is damaged or names a node the inventory lacks "
                              f"({', '.join(bad) or 'node ' + repr(d.get('node'))})",
                              hint="remove the router container by hand if it runs (`docker ps --filter "
                                   "label=sparkctl.role=router` on rank 0's node), then move the replicated "
                                   "deployment's record (replicated.json) aside")
        return RouterContainer.from_dict(spec, connector_for(inventory, str(d["node"])), d)
    return RouterProcess.from_dict(spec, d)


def recorded_router(inventory: Inventory, spec: RouterSpec, d: JSONObject | None) -> Router | None:
    """The recorded router if it still runs, else None (then `start_router` starts, or takes over, one)."""
    if not d:
        return None
    router = from_record(inventory, spec, d)
    return router if router.alive() else None


def stop_router(inventory: Inventory, d: JSONObject | None, *, log: Path | None = None,
                timeout_s: float = 10.0) -> bool:
    """Stop the router the record names and every router of this cluster the record does not name (one a
    controller killed, or an interrupt cut, between its start and its record left behind): on the docker runtime
    every router container of this cluster on rank 0's node (only containers labelled ``sparkctl.role=router``
    are removed); on the process runtime every router process whose output is `log` (this ledger's router log).
    True when something was stopped or the record named a router."""
    stopped = False
    spec = RouterSpec("127.0.0.1", 1)              # stop needs no arguments: by PID + start time, or by ID
    if d:
        from_record(inventory, spec, d).stop(timeout_s=timeout_s)
        stopped = True
    if _container_side(inventory):
        node = inventory.rank0
        runner = connector_for(inventory, node)
        for cid in labelled_routers(runner, inventory.cluster.name):
            stopped |= RouterContainer(spec, node.name, runner, router_container_name(inventory.cluster.name), cid,
                                       "").stop(timeout_s=timeout_s)
    elif log is not None:
        for pid, ticks in logged_routers(log):
            RouterProcess(spec, pid, log, ticks).stop(timeout_s=timeout_s)
            stopped = True
    return stopped


def logged_routers(log: Path) -> list[tuple[int, int | None]]:
    """Router processes (pid, start ticks) whose output is `log`: on the process runtime, the routers of the ledger
    whose router log it is, recorded or not."""
    return [(pid, procfs.start_ticks(pid)) for pid in procfs.pids()
            if procfs.stdout_target(pid) == str(log) and _runs_router(procfs.cmdline(pid))]
