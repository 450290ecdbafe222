"""Preflight checks that span nodes and come from host preparation: model and drafter manifests equal on
every node, the same fabric MTU on both ends, rank 0's fabric SSH path to each peer.

Two halves, so the checks work with any runtime that can run an argv on a node:

* ``gather(run_many, node, peers, model_dirs)`` -> ``HostFacts``: runs the facts' argvs (``sparkctl.nodes.facts``)
  through the given ``run_many`` (e.g. a node's SSH connector) and parses them;
* ``evaluate(facts_by_node, rank0)`` -> list of ``CheckResult`` (node, name, ok, seen, fix): PURE, no I/O.

Wired into ``apply.run_checks`` (sparkctl/deploy/apply.py) through ``run_preflight(..., then=...)``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkctl.errors import SparkctlError
from sparkctl.nodes import facts
from sparkctl.nodes.facts import FabricSsh, Manifest
from sparkctl.nodes.node_facts import host_model_path
from sparkctl.nodes.node_facts import model_paths as _model_paths
from sparkctl.state.records import CheckResult

if TYPE_CHECKING:
    from sparkctl.config.inventory import Inventory, Node
    from sparkctl.nodes.runtime import Runtime
    from sparkctl.nodes.ssh import CommandResult
    from sparkctl.sglang.launch import LaunchSpec

MANIFEST_TIMEOUT_S = 1800.0
PREPARE_MODELS = "sparkctl prepare --tags models --profile PROFILE"
PREPARE_FABRIC = "sparkctl prepare --tags fabric"
PREPARE_SSH = "sparkctl prepare --tags fabric-ssh"


@dataclass
class HostFacts:
    """What one node said: manifests per (what, engine path), fabric MTU, fabric SSH to each peer (rank 0)."""

    node: str
    manifests: dict[tuple[str, str], Manifest | None] = field(default_factory=dict)
    mtu: int | None = None
    fabric_interface: str = ""
    fabric_ssh: dict[str, FabricSsh] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def gather(run_many: Callable[[list[list[str]]], Sequence[CommandResult]], node: Node, peers: Sequence[Node],
           model_dirs: Sequence[tuple[str, str, str]], *, rank0: bool) -> HostFacts:
    """Run the facts on one node in one round-trip. ``model_dirs``: (what, engine path, host path);
    ``peers``: inventory nodes (rank 0 probes SSH to each over the fabric). ``run_many`` returns one result per argv
    (``sparkctl.nodes.ssh.CommandResult``: returncode/stdout/output)."""
    ip = facts.ip_addr_dev(node.fabric_interface)
    manifests = [((what, path), facts.model_manifest(host)) for what, path, host in model_dirs]
    ssh = [(p.name, facts.fabric_ssh(p.ssh.user, p.fabric_address)) for p in peers] if rank0 else []
    results = iter(run_many([list(ip.argv), *(list(f.argv) for _, f in manifests),
                             *(list(f.argv) for _, f in ssh)]))
    out = HostFacts(node.name, fabric_interface=node.fabric_interface)
    res = next(results, None)           # the ip fact's, then the manifests', then the ssh probes', in that order
    if res is not None:
        iface = ip.parse(res.stdout).get(node.fabric_interface) if res.returncode == 0 else None
        out.mtu = iface.mtu if iface else None
    for (key, manifest), res in zip(manifests, results):
        try:
            out.manifests[key] = manifest.parse(res.stdout) if res.returncode == 0 else None
        except ValueError:
            out.manifests[key] = None
        if out.manifests[key] is None:
            out.errors.append(f"manifest of {key[1]} failed: {res.output.strip()[-200:]}")
    for (peer, probe), res in zip(ssh, results):
        out.fabric_ssh[peer] = probe.parse(res.output)
    return out


def evaluate(by_node: dict[str, HostFacts], rank0: str) -> list[CheckResult]:
    """Every cross-node check from the gathered facts (pure)."""
    return [*model_parity(by_node, rank0), *mtu_equal(by_node, rank0), *fabric_ssh(by_node.get(rank0))]


def model_parity(by_node: dict[str, HostFacts], rank0: str) -> list[CheckResult]:
    """Model and drafter: present on every node, same files with the same checksums as on the reference node
    (rank 0 when it has them, else the first node that does)."""
    out: list[CheckResult] = []
    keys = sorted({k for f in by_node.values() for k in f.manifests})
    for what, path in keys:
        seen = {n: f.manifests.get((what, path)) for n, f in by_node.items()}
        present = {n: m for n, m in seen.items() if m is not None and m.present}
        if not present:
            continue          # on no node: the per-node model check already says where it is missing
        failed = False
        for n in sorted(set(seen) - set(present)):
            m = seen[n]
            why = f"manifest failed ({'; '.join(by_node[n].errors)[:200]})" if m is None else "directory missing"
            src = rank0 if rank0 in present else sorted(present)[0]
            out.append(CheckResult.failing(n, f"{what} parity", f"{what} {path} is not on {n} ({why}) but is on {src}",
                             f"{PREPARE_MODELS} (copies it from {src} over the fabric)"))
            failed = True
        ref = rank0 if rank0 in present else sorted(present)[0]
        want = present[ref].files
        for n, m in sorted(present.items()):
            differ = sorted(r for r in want if m.files.get(r) != want[r])
            extra = sorted(r for r in m.files if r not in want)
            if n != ref and (differ or extra):
                listed = ", ".join((differ + extra)[:3]) + (" ..." if len(differ) + len(extra) > 3 else "")
                out.append(CheckResult.failing(n, f"{what} parity",
                                 f"{what} {path} differs between {ref} and {n}: {len(differ)} file(s) differ or "
                                 f"are missing, {len(extra)} extra ({listed})",
                                 f"{PREPARE_MODELS} (copies {ref}'s files to {n} over the fabric)"))
                failed = True
        if not failed:
            stale = [n for n, m in present.items() if m.status == "computed"]
            out.append(CheckResult.passing(ref, f"{what} parity",
                                           f"{what} {path}: {len(want)} files, same checksums on "
                             f"{', '.join(sorted(present))}" + (f" (manifest recomputed on {', '.join(stale)})"
                                                                 if stale else "")))
    return out


def mtu_equal(by_node: dict[str, HostFacts], rank0: str) -> list[CheckResult]:
    """The fabric MTU is the same on every end (a mismatch drops or fragments NCCL's large packets)."""
    mtus = {n: f.mtu for n, f in by_node.items() if f.mtu is not None}
    if len(mtus) < 2:
        return []
    if len(set(mtus.values())) == 1:
        return [CheckResult.passing(rank0, "fabric mtu equal", f"mtu {next(iter(mtus.values()))} on "
                      f"{', '.join(sorted(mtus))}")]
    top = max(mtus.values())
    listed = ", ".join(f"{m} on {n}" for n, m in sorted(mtus.items()))
    return [CheckResult.failing(n, "fabric mtu equal", f"fabric mtu differs between the ends: {listed}",
                  f"set mtu {top} on {by_node[n].fabric_interface} of {n} too: {PREPARE_FABRIC} (netplan, "
                  f"mtu from prepare_fabric_mtu)")
            for n, m in sorted(mtus.items()) if m != top]


def fabric_ssh(rank0: HostFacts | None) -> list[CheckResult]:
    """Rank 0 reaches every peer over the fabric with the dedicated key (for node-to-node model/image copies)."""
    if rank0 is None:
        return []
    out = []
    for peer, r in sorted(rank0.fabric_ssh.items()):
        if r.ok:
            out.append(CheckResult.passing(rank0.node, f"fabric ssh {peer}",
                                           f"{rank0.node} reaches {peer} over the fabric"))
        elif r.key_missing:   # serving does not need it (only node-to-node copies do): a warning
            out.append(CheckResult.warning(rank0.node, f"fabric ssh {peer}",
                             f"the fabric SSH key {facts.FABRIC_KEY} is missing on {rank0.node} "
                             f"(node-to-node model copies need it; fix: {PREPARE_SSH})", PREPARE_SSH))
        else:
            out.append(CheckResult.failing(rank0.node, f"fabric ssh {peer}",
                             f"{rank0.node} cannot SSH to {peer} over the fabric: {r.error}",
                             f"{PREPARE_SSH}" + (" (the peer's fabric host key is not known yet)"
                                                 if r.host_key_problem else "")))
    return out


class CrossNodeChecks:
    """Glue for today's preflight: ``collect`` each node's facts while its own checks run (in parallel),
    then ``checks()`` evaluates them together. Nodes without an SSH connector (the process runtime of the
    embedded cluster) are left out."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self.facts: dict[str, HostFacts] = {}

    def collect(self, spec: LaunchSpec, runtime: Runtime) -> None:

        ssh = getattr(runtime, "ssh", None)
        if ssh is None:
            return
        node = self.inventory.node(spec.node)
        dirs = [(what, path, host) for what, path in _model_paths(spec.argv)
                if (host := host_model_path(path, node.host_paths.models)) is not None]
        peers = [p for p in self.inventory.nodes if p.name != node.name]
        try:
            # a first manifest of a big model reads every byte: allow for it (later runs compare only)
            self.facts[node.name] = gather(lambda argvs: ssh.run_many(argvs, timeout=MANIFEST_TIMEOUT_S), node,
                                           peers, dirs, rank0=node is self.inventory.nodes[0])
        except SparkctlError:
            return          # unreachable: the node's own ssh check already failed

    def checks(self) -> list[CheckResult]:
        return evaluate(self.facts, self.inventory.nodes[0].name) if len(self.facts) > 1 else []
