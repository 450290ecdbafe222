"""Every address and port a layout listens on, and the refusal when two of them would be one.

A layout is what `render` (one TP group), `render_replicas` (K groups) and `router_spec` (the router in front)
make from a profile and an inventory. Each rank listens on its HTTP API (rank 0) or dummy health server (the
others), and rank 0 of each group on its TCP store (--dist-init-addr's port, bound on every interface: seen on the
real 0.5.23 engine); the router on its port and its Prometheus port. Two listeners collide when they are on one
machine (the process runtime's nodes all run on this machine; any other node is the machine its ansible_host
names) on one port and one address (or either on every interface), or when the controller would reach both at one
URL (a rank 0's HTTP API or the router: what the controller and clients reach). A collision is refused before
anything starts, naming both hosts: two inventory hosts with one API address would otherwise render two replicas
on one URL without a word.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sparkctl.config.inventory import Inventory, Node
from sparkctl.errors import ConfigError
from sparkctl.sglang.launch import LaunchSpec

WILDCARD = ("0.0.0.0", "::", "")
THIS_MACHINE = "this machine (process runtime)"


@dataclass(frozen=True)
class PlannedListener:
    node: str
    machine: str        # THIS_MACHINE, or the node's ansible_host
    bind: str           # the address it binds (WILDCARD: every interface)
    reach: str          # the address it is reached at (the controller's; the ranks' fabric address for a TCP store)
    port: int
    what: str           # e.g. "replica 1 rank 0 HTTP API (api.port)"
    reached: bool = True  # the controller or a client reaches it at `reach` (an API, the router), not only a rank

    def collides(self, other: PlannedListener) -> bool:
        if self.port != other.port:
            return False
        if self.reached and other.reached and self.reach == other.reach:
            return True
        return self.machine == other.machine and (self.bind == other.bind or self.bind in WILDCARD
                                                  or other.bind in WILDCARD)

    def describe(self) -> str:
        return f"{self.what} on host {self.node} ({self.reach}:{self.port})"


def machine_of(node: Node) -> str:
    return THIS_MACHINE if node.runtime == "process" else node.ssh.host


def group_listeners(specs: Iterable[LaunchSpec], inventory: Inventory, label: str = "") -> list[PlannedListener]:
    """What one TP group's ranks listen on (`LaunchSpec.listen_ports`, read from their own argv)."""
    out = []
    for spec in specs:
        node = inventory.node(spec.node)
        for bind, port, what in spec.listen_ports():
            store = what.startswith("TCP store")
            out.append(PlannedListener(spec.node, machine_of(node), "0.0.0.0" if store else bind,
                                node.fabric_address if store else spec.api_host, port,
                                f"{label}rank {spec.rank} {what}", reached=spec.rank == 0 and not store))
    return out


def router_listeners(node: Node, host: str, reach: str, port: int, prometheus_port: int) -> list[PlannedListener]:
    return [PlannedListener(node.name, machine_of(node), host, reach, port, "the router (router.port)"),
            PlannedListener(node.name, machine_of(node), host, reach, prometheus_port,
                     "the router's metrics (router.prometheus_port)")]


def refuse_collisions(listeners: list[PlannedListener], where: str) -> None:
    """ConfigError naming the first two listeners that would be one address and port, and both hosts."""
    for i, a in enumerate(listeners):
        for b in listeners[i + 1:]:
            if a.collides(b):
                same = "the same host" if a.node == b.node else f"hosts {a.node} and {b.node}"
                raise ConfigError(
                    f"{a.describe()} and {b.describe()} would listen on one address and port ({same})",
                    where=where,
                    hint="give every host its own ansible_host (or api_bind), or the profile ports of their own "
                         "(api.port, api.dist_port, router.port, router.prometheus_port)")
