"""What sparkctl engines actually run on the cluster, read from the nodes rather than the ledger.

Docker nodes: every container labelled ``sparkctl.cluster=<cluster>`` (`docker ps -a --filter label=...`).
Process runtime (the embedded cluster): every local process whose stdout is a rank log under this ledger's
``logs/<deployment>/rank<N>.log`` and whose command line runs sparkctl: the log path is the process runtime's
label, so an engine started by a controller killed before it could record the pid is still found, and
engines of another state directory (another cluster, another test) are never touched.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparkctl.deploy.cluster import Cluster
from sparkctl.errors import LedgerError, SparkctlError
from sparkctl.nodes import procfs
from sparkctl.nodes.docker_runtime import DockerRuntime  # loaded already: for_node made this node's
from sparkctl.nodes.enginegroup import Leftover
from sparkctl.nodes.fanout import fan_out
from sparkctl.nodes.handles import ProcessHandle
from sparkctl.nodes.process import ProcessRuntime
from sparkctl.nodes.runtime import Handle
from sparkctl.state.ledger import REPAIR_HINT

if TYPE_CHECKING:
    from sparkctl.config.inventory import Node

_RANK_LOG = re.compile(r"^rank(\d+)\.log$")


@dataclass(frozen=True)
class ObservedEngine:
    handle: Handle
    running: bool

    @property
    def deployment(self) -> str:
        return self.handle.deployment

    def describe(self) -> str:
        return f"rank {self.handle.rank} ({self.handle.where} on {self.handle.node}) of {self.deployment}"


def process_engines(d: Cluster) -> list[ObservedEngine]:
    """Local engine processes writing to a rank log of this ledger (see module docstring)."""
    logs = d.ledger.root.resolve() / "logs"
    nodes = d.inventory.nodes
    out = []
    for pid in procfs.pids():
        target = procfs.stdout_target(pid)
        if not target or not target.startswith(str(logs) + "/"):
            continue
        path = Path(target)
        m = _RANK_LOG.match(path.name)
        stat = procfs.proc_stat(pid)
        if not m or stat is None or stat[0] == "Z" or not procfs.runs_sparkctl(pid):
            continue
        rank = int(m.group(1))
        node = nodes[rank].name if rank < len(nodes) else f"rank{rank}"
        out.append(ObservedEngine(ProcessHandle(node=node, rank=rank, deployment=path.parent.name, pid=pid,
                                        start_ticks=stat[1], log=str(path)), True))
    return out


def observe(d: Cluster, unreachable: list[str] | None = None) -> list[ObservedEngine]:
    """Every engine of this cluster found on its nodes (all nodes at once). A node that cannot say (SSH down)
    raises its NodeError, or with `unreachable` given is named there ("[node] why") and skipped."""
    found: list[ObservedEngine] = []
    if any(n.runtime == "process" for n in d.inventory.nodes):
        found += process_engines(d)
    docker = [n for n in d.inventory.nodes if n.runtime == "docker"]
    rts = d.runtimes("observe")

    def ps(node: Node) -> list[ObservedEngine]:
        rt = rts.for_node(node)
        if not isinstance(rt, DockerRuntime):
            raise TypeError(f"[{node.name}] a docker node without a docker runtime: {type(rt).__name__}")
        return [ObservedEngine(h, running) for h, running in rt.labelled()]
    for o in fan_out(docker, ps):
        if o.error is None:
            found.extend(o.value or [])
        elif isinstance(o.error, SparkctlError) and unreachable is not None:
            unreachable.append(f"[{o.item.name}] {o.error.message}")
        else:
            raise o.error
    return sorted(found, key=lambda e: (e.deployment, -e.handle.rank))


def stop_engine(d: Cluster, engine: ObservedEngine, *, remove: bool = True) -> str | None:
    """Stop (and remove) one found engine; None when done, else why it could not be stopped."""
    rt = d.runtimes(engine.deployment).for_node(engine.handle.node)
    try:
        rt.stop(engine.handle)
        if remove:
            rt.remove(engine.handle)
    except SparkctlError as exc:
        return exc.message
    return None


def leftovers(d: Cluster) -> list[Leftover]:
    """Processes of this cluster's engines that outlived them (a launcher that died first, a log pipe killed by the
    OOM killer): what still runs in the session or cgroup of an engine whose log pipe is gone, named by deployment
    and rank (process runtime: sparkctl/nodes/enginegroup.py; a container takes its processes with it). Nothing of
    a leftover serves: settle stops them, `status` and `doctor` name them, preflight names one holding a port."""

    local = [n for n in d.inventory.nodes if n.runtime == "process"]
    if not local:
        return []
    rt = d.runtimes("observe").for_node(local[0])
    if not isinstance(rt, ProcessRuntime):
        return []
    handles: list[ProcessHandle] = []
    for rid in d.ledger.record_ids():     # every record's handles, not whole records: the history only grows
        try:
            handles += [h for h in d.ledger.handles(rid) if isinstance(h, ProcessHandle)]
        except SparkctlError:           # a damaged record: `repair` deals with it; its engines' cgroups still count
            continue
    return rt.leftovers(handles)


def stop_leftovers(d: Cluster, found: list[Leftover] | None = None) -> list[str]:
    """Stop every leftover (SIGTERM, SIGKILL after 5 s); a line for each, said on the reporter."""
    lines = []
    for lo in leftovers(d) if found is None else found:
        left = lo.stop()
        line = (f"stopped leftover processes of {lo.describe()}" if not left else
                f"could not stop leftover processes of {lo.describe()}: still there "
                f"({', '.join(m.describe() for m in left)})")
        d.reporter.event(line)
        lines.append(line)
    return lines


def unrecorded(d: Cluster, engines: list[ObservedEngine]) -> None:
    """LedgerError (exit 6, pointing to `sparkctl repair`) when a running engine's deployment has no record:
    the ledger lost it (moved, deleted), and its engines must not be read as "nothing deployed" nor stopped as
    orphans."""

    known = set(d.ledger.record_ids())
    lost = sorted({e.deployment for e in engines if e.running and e.deployment not in known})
    if lost:
        raise LedgerError(f"engines of {', '.join(lost)} run but the ledger has no record of "
                          f"{'it' if len(lost) == 1 else 'them'}", where=str(d.ledger.root / "deployments"),
                          hint=REPAIR_HINT)
