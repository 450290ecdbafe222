"""The networks of a test cluster: the management bridge every node and the controller share, and the fabric
(a direct veth between two nodes, or a switch: a bridge with one veth per node for three or four); their
teardown. A mixin of `testrig.cluster.TestCluster`, which holds the nodes, prefix and subnet index.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from testrig.hostops import ClusterError, _link_exists, _run
from testrig.node_daemons import FABRIC_IFACE

if TYPE_CHECKING:
    from pathlib import Path

    from testrig.cluster import Node

MGMT_IFACE = "mgmt0"
FABRIC_MTU = 9000


class ClusterNetwork:
    """Management bridge and fabric of the cluster's nodes (needs TestCluster's nodes, prefix, net index)."""

    if TYPE_CHECKING:   # what this mixin reads of TestCluster (for the type checker; TestCluster defines them)
        name_prefix: str
        net_index: int
        node_count: int
        nodes: dict[str, Node]

        @property
        def bridge(self) -> str: ...
        @property
        def controller_address(self) -> str: ...
        @property
        def state_dir(self) -> Path: ...
        def _uts_file(self, node: Node) -> Path: ...

    @property
    def switched(self) -> bool:
        """The fabric is a switch (a bridge), not a direct cable: more than two nodes."""
        return self.node_count > 2

    @property
    def fabric_bridge(self) -> str:
        """The fabric switch of a cluster of more than two nodes (``<prefix>-fab``)."""
        return f"{self.name_prefix}-fab"

    @property
    def fabric_subnet(self) -> str:
        return f"198.18.{self.net_index}.0/24"

    def _fabric_port(self, node: Node) -> str:
        """Host end of a node's fabric veth on the switch: ``<prefix>-fab-a`` (at most 12 characters)."""
        return f"{self.fabric_bridge}-{node.name[-1]}"

    def _check_subnets_free(self) -> None:
        routes = _run(["ip", "-4", "route", "show"]).stdout
        for subnet in (f"198.19.{self.net_index}.", f"198.18.{self.net_index}."):
            if subnet in routes:
                raise ClusterError(f"subnet {subnet}0/24 is already routed on this machine",
                                   hint="another test cluster is up (scripts/test-cluster down), or pick "
                                        "another net_index", evidence=routes)

    def _make_network(self) -> None:
        p, br = self.name_prefix, self.bridge
        _run(["ip", "link", "add", br, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.controller_address}/24", "dev", br])
        _run(["ip", "link", "set", br, "up"])
        nodes = list(self.nodes.values())
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for n in nodes:
            _run(["ip", "netns", "add", n.netns])
            self._uts_file(n).touch()
            _run(["unshare", f"--uts={self._uts_file(n)}", "hostname", n.name])
            host_end = f"{p}-{n.name}"
            _run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", MGMT_IFACE, "netns", n.netns])
            _run(["ip", "link", "set", host_end, "master", br, "up"])
        if self.switched:
            self._make_fabric_switch(nodes)
        else:
            a, b = nodes
            _run(["ip", "link", "add", FABRIC_IFACE, "netns", a.netns, "mtu", str(FABRIC_MTU), "type", "veth",
                  "peer", "name", FABRIC_IFACE, "netns", b.netns, "mtu", str(FABRIC_MTU)])
        for n in nodes:
            ns = ["ip", "-n", n.netns]
            _run([*ns, "link", "set", "lo", "up"])
            _run([*ns, "addr", "add", f"{n.mgmt_address}/24", "dev", MGMT_IFACE])
            _run([*ns, "link", "set", MGMT_IFACE, "up"])
            _run([*ns, "addr", "add", f"{n.fabric_address}/24", "dev", FABRIC_IFACE])
            _run([*ns, "link", "set", FABRIC_IFACE, "up"])

    def _make_fabric_switch(self, nodes: list[Node]) -> None:
        """The switch: a bridge (MTU 9000, no address: the controller is not on the fabric) and one veth per node,
        its node end ``enp1s0f0np0`` in the node, its host end a port of the bridge."""
        sw = self.fabric_bridge
        _run(["ip", "link", "add", sw, "mtu", str(FABRIC_MTU), "type", "bridge"])
        for n in nodes:
            port = self._fabric_port(n)
            _run(["ip", "link", "add", port, "mtu", str(FABRIC_MTU), "type", "veth", "peer", "name", FABRIC_IFACE,
                  "netns", n.netns, "mtu", str(FABRIC_MTU)])
            _run(["ip", "link", "set", port, "master", sw, "up"])
        _run(["ip", "link", "set", sw, "mtu", str(FABRIC_MTU), "up"])

    def _remove_links(self, node: Node) -> None:
        """The host ends of a node's veths (before its netns: that deletion removes the veth asynchronously)."""
        for host_end in (f"{self.name_prefix}-{node.name}", self._fabric_port(node)):
            if _link_exists(host_end):
                _run(["ip", "link", "delete", host_end], check=False)

    def _remove_bridges(self) -> None:
        for bridge in (self.bridge, self.fabric_bridge):
            if _link_exists(bridge):
                _run(["ip", "link", "delete", bridge], check=False)
