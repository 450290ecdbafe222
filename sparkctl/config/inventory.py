"""Inventory: the nodes of one cluster, read from an Ansible YAML inventory.

The same file works with `ansible-playbook -i`: hosts live under `all.hosts` or any
`all.children.<group>.hosts`, connection settings use Ansible's own names
(`ansible_host`, `ansible_port`, `ansible_user`, `ansible_ssh_private_key_file`),
and sparkctl's per-node settings are plain host variables. Example::

    all:
      vars: {sparkctl_cluster: desk}
      children:
        sparks:
          hosts:
            spark-a: {ansible_host: 10.0.0.10, fabric_interface: enp1s0f0np0,
                      fabric_address: 192.168.100.10, roce_hcas: [rocep1s0f0, roceP2p1s0f0]}
"""
from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sparkctl.config.loader import config_error_from, did_you_mean, read_yaml, refusal
from sparkctl.config.values import (
    Choice,
    Count,
    EngineEnvKey,
    EnvValue,
    Flag,
    HcaName,
    HostPath,
    IfName,
    ImageRef,
    LocalPath,
    PlainName,
    Port,
    SimValue,
    SshHost,
    SshUser,
    Text,
    Word,
)
from sparkctl.errors import ConfigError, SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.resources import shipped, user_dirs

_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)
_CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


class SSHSettings(BaseModel):
    model_config = _STRICT
    host: SshHost = Field(description="Management address or name sparkctl reaches the node on (ansible_host).")
    port: Port = Field(22, description="SSH port (ansible_port).")
    user: SshUser = Field("root", description="SSH user (ansible_user).")
    key_file: LocalPath | None = Field(None,
                                       description="Private key for key-based auth (ansible_ssh_private_key_file).")
    connection: Choice[Literal["ssh", "local"]] = Field(
        "ssh", description="'local' for the embedded cluster (ansible_connection: local): no SSH at all.")


class HostPaths(BaseModel):
    model_config = _STRICT
    models: HostPath = Field("/models",
                             description="Host directory holding model and drafter weights (mounted read-only).")
    cache: HostPath = Field("/var/cache/sparkctl",
                       description="Host directory for JIT caches (TileLang, Triton, FlashInfer, torch compile).")


class Node(BaseModel):
    """One machine of the cluster (a DGX Spark, or a loopback stand-in)."""

    model_config = _STRICT
    name: PlainName = Field(description="Inventory host name, e.g. spark-a.")
    ssh: SSHSettings = Field(description="How to reach the node.")
    rank: Count | None = Field(None, description="Explicit node rank (sparkctl_rank); default: inventory order.")
    fabric_interface: IfName = Field(description="Netdev of the CX-7 fabric link, e.g. enp1s0f0np0.")
    fabric_address: Text = Field(description="This node's IPv4 address on the fabric link.")
    roce_hcas: list[HcaName] = Field(default_factory=list,
                                 description="RoCE HCAs for NCCL_IB_HCA (both twins of the cabled port).")
    host_paths: HostPaths = Field(default_factory=HostPaths, description="Host directories used by the engine.")
    runtime: Choice[Literal["docker", "process"]] = Field(
        "docker", description="'docker' (real Sparks) or 'process' (the embedded cluster's local emulator).")
    gpu_runtime: Choice[Literal["nvidia", "gpus-all", "none"]] = Field(
        "nvidia", description="How containers get the GPU: --runtime nvidia, --gpus all, or nothing.")
    api_bind: Word = Field("0.0.0.0", description="Address the engine's HTTP server binds to on this node.")
    gpus: Count = Field(1, ge=1, le=64, description="GPUs on this node (a DGX Spark has one GB10).")
    engine_env: dict[EngineEnvKey, EnvValue] = Field(
        default_factory=dict, description="Extra environment for this node's engine only (after the profile's env), "
                                          "e.g. SGLANG_CPU_OMP_THREADS_BIND per rank on a CPU, NCCL_IB_GID_INDEX.")

    @field_validator("fabric_address")
    @classmethod
    def _ipv4(cls, value: str) -> str:
        try:
            ipaddress.IPv4Address(value)
        except ValueError:
            raise ValueError(f"'{value}' is not an IPv4 address") from None
        return value


class ClusterSettings(BaseModel):
    """Cluster-wide settings (Ansible `all.vars` with the `sparkctl_` prefix)."""

    model_config = _STRICT
    name: Text = Field("default", description="Cluster name (letters, digits, '-' and '_'; at most 64); names "
                                             "containers and the state directory <state root>/<name>.")
    known_hosts: LocalPath | None = Field(None, description="known_hosts file used to verify node host keys.")
    host_key_policy: Choice[Literal["accept-new", "pinned"]] = Field(
        "accept-new", description="accept-new: trust a host key on first contact; pinned: only keys in known_hosts.")
    engine_image: ImageRef | None = Field(None, description="Engine image for every profile on this cluster (overrides "
                                                       "the profile's image; e.g. a test cluster's emulator image).")
    sim: dict[PlainName, SimValue] = Field(default_factory=dict,
                                description="Emulator knobs for the embedded cluster (see sparkctl/sim/README.md).")
    engine: Choice[Literal["emulator", "sglang", "vllm", "real"]] = Field(
        "emulator", description="What the process runtime runs for each rank: 'emulator' (sparkctl/sim, the default), "
                                "'sglang' (the real `sglang.launch_server` from engine_python's environment, e.g. "
                                "on a CPU), 'vllm' (the real `vllm serve` from engine_python's environment) or 'real' "
                                "(the profile's engine, from its environment in engine_pythons). Docker nodes run what "
                                "their image holds.")
    engine_python: LocalPath | None = Field(
        None, description="The Python whose environment has the engine installed, for engine: sglang or vllm (its "
                          "bin/python, e.g. ~/.cache/sparkctl/real-engine/current/venv/bin/python).")
    engine_pythons: dict[Choice[Literal["sglang", "vllm"]], LocalPath] = Field(
        default_factory=dict, description="For engine: real, each engine's Python (e.g. {sglang: ..., vllm: ...}): "
                                          "profiles of either engine deploy on the same nodes, one replacing the "
                                          "other.")

    def pythons(self) -> dict[str, str]:
        """Each real engine the process runtime can run -> its Python (none for the emulator)."""
        if self.engine == "real":
            return {str(name): path for name, path in self.engine_pythons.items()}
        if self.engine != "emulator" and self.engine_python is not None:
            return {self.engine: self.engine_python}
        return {}
    fabric_topology: Choice[Literal["direct", "switch"]] | None = Field(
        None, description="How the fabric joins the nodes: 'direct' (one cable between two nodes) or 'switch' (one "
                          "subnet through a switch). Default: direct for two nodes, switch for more.")
    fabric_subnet: Text | None = Field(
        None, description="The switch's fabric subnet (CIDR, e.g. 192.168.100.0/24) every node's fabric_address "
                          "must be in. Default for a switch: the /24 around rank 0's fabric_address.")

    @field_validator("fabric_subnet")
    @classmethod
    def _cidr(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ipaddress.IPv4Network(value, strict=True)
            except ValueError as exc:
                raise ValueError(f"'{value}' is not an IPv4 subnet in CIDR form ({exc})") from None
        return value


    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not _CLUSTER_NAME.fullmatch(value):
            raise refusal(f"{value!r} is not a plain cluster name",
                          "use letters, digits, '-' and '_' only (no '/', '..' or leading '-'), e.g. desk; "
                          "it becomes a directory under the state root and part of container names")
        return value


class Inventory(BaseModel):
    """The nodes, ordered by rank (rank 0 first)."""

    model_config = _STRICT
    path: Text = Field(description="File this inventory came from.")
    cluster: ClusterSettings = Field(description="Cluster-wide settings.")
    nodes: list[Node] = Field(min_length=1, description="Nodes in rank order.")
    embedded: Flag = Field(False, description="True for the embedded local cluster (emulated engine).")

    @model_validator(mode="after")
    def _consistent(self) -> Inventory:
        names = [n.name for n in self.nodes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"two nodes named {dup[0]!r}")
        for n in self.nodes:
            for what, path in (("models", n.host_paths.models), ("cache", n.host_paths.cache)):
                if n.runtime != "process" and path.startswith("~"):
                    raise ValueError(f"nodes.{n.name}.host_paths.{what}: {path!r} starts with '~', which only a "
                                     f"process-runtime node expands (docker mounts need an absolute host path): "
                                     f"give the absolute path")
        engine = self.cluster.engine
        if engine == "real":
            if not self.cluster.engine_pythons or self.cluster.engine_python is not None:
                raise ValueError("cluster.engine: 'real' takes each engine's Python in cluster.engine_pythons (e.g. "
                                 "{sglang: PATH, vllm: PATH}), not cluster.engine_python")
        elif self.cluster.engine_pythons:
            raise ValueError(f"cluster.engine_pythons is set but cluster.engine is {engine!r} (set sparkctl_engine: "
                             f"real to run each profile's engine from it)")
        if engine != "emulator":
            if engine != "real" and self.cluster.engine_python is None:
                raise ValueError(f"cluster.engine: {engine!r} needs cluster.engine_python (the Python of the "
                                 f"environment {engine} is installed in)")
            docker = [n.name for n in self.nodes if n.runtime != "process"]
            if docker:
                raise ValueError(f"cluster.engine: {engine!r} chooses the process runtime's engine, but "
                                 f"{', '.join(docker)} use runtime {self.node(docker[0]).runtime!r} (docker nodes run "
                                 f"what their image holds): remove sparkctl_engine or set runtime: process")
        elif self.cluster.engine_python is not None:
            raise ValueError("cluster.engine_python is set but cluster.engine is 'emulator' (set sparkctl_engine: "
                             "sglang or vllm to run it)")
        return self

    @property
    def emulated(self) -> bool:
        """Its engine is sparkctl's emulator: any node on the process runtime, unless the inventory chose the real
        engine for it (`sparkctl_engine: sglang`)."""
        return self.cluster.engine == "emulator" and (self.embedded or any(n.runtime == "process" for n in self.nodes))

    @property
    def real_engine_on_cpu(self) -> bool:
        """The process runtime runs a real engine here (SGLang or vLLM on this machine's CPU, not a GB10)."""
        return self.cluster.engine != "emulator"

    @property
    def rank0(self) -> Node:
        return self.nodes[0]

    @property
    def fabric_topology(self) -> str:
        """'direct' or 'switch': the inventory's own, else direct for two nodes (one cable), switch for more."""
        return self.cluster.fabric_topology or ("direct" if len(self.nodes) <= 2 else "switch")

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise ConfigError(f"no node named {name!r}", where=self.path,
                          hint=f"nodes are: {', '.join(n.name for n in self.nodes)}")


_ANSIBLE_KEYS = {"ansible_host": "host", "ansible_port": "port", "ansible_user": "user",
                 "ansible_ssh_private_key_file": "key_file", "ansible_connection": "connection"}
_NODE_KEYS = {"sparkctl_rank", "fabric_interface", "fabric_address", "roce_hcas", "host_paths", "runtime",
              "gpu_runtime", "api_bind", "gpus", "engine_env"}
_CLUSTER_KEYS = {"sparkctl_cluster": "name", "sparkctl_known_hosts": "known_hosts",
                 "sparkctl_host_key_policy": "host_key_policy", "sparkctl_sim": "sim",
                 "sparkctl_engine_image": "engine_image", "sparkctl_fabric_topology": "fabric_topology",
                 "sparkctl_fabric_subnet": "fabric_subnet", "sparkctl_engine": "engine",
                 "sparkctl_engine_python": "engine_python", "sparkctl_engine_pythons": "engine_pythons"}


def _collect_hosts(group: JSONObject, inherited: JSONObject, out: list[tuple[str, JSONObject]],
                   where: str, path: str) -> None:
    if not isinstance(group, dict):
        raise ConfigError(f"{path}: expected a mapping (got {type(group).__name__})", where=where,
                          hint="an Ansible group is a mapping of 'hosts', 'children' and 'vars'")
    for part in ("vars", "hosts", "children"):
        if not isinstance(group.get(part) or {}, dict):
            raise ConfigError(f"{path}.{part}: expected a mapping (got {type(group[part]).__name__})", where=where,
                              hint=f"write {part} as name: value pairs (see inventory/sparks.example.yml)")
    for name, hvars in (group.get("hosts") or {}).items():
        if not isinstance(hvars or {}, dict):
            raise ConfigError(f"{path}.hosts.{name}: expected the host's variables as a mapping "
                              f"(got {type(hvars).__name__})", where=where,
                              hint=f"write {name}: {{ansible_host: ..., fabric_interface: ..., fabric_address: ...}}")
    gvars = {**inherited, **(group.get("vars") or {})}
    for key in group:
        if key not in ("hosts", "children", "vars"):
            raise ConfigError(f"{path}.{key}: unknown key in an Ansible group", where=where,
                              hint="groups hold only 'hosts', 'children' and 'vars'")
    for name, hvars in (group.get("hosts") or {}).items():
        out.append((str(name), {**gvars, **(hvars or {})}))
    for cname, child in (group.get("children") or {}).items():
        _collect_hosts(child or {}, gvars, out, where, f"{path}.children.{cname}")


def _node_from_vars(name: str, hvars: JSONObject, where: str) -> JSONObject:
    ssh: JSONObject = {}
    node: JSONObject = {"name": name}
    for key, value in hvars.items():
        if key in _ANSIBLE_KEYS:
            ssh[_ANSIBLE_KEYS[key]] = value
        elif key == "sparkctl_rank":
            node["rank"] = value
        elif key in _NODE_KEYS:
            node[key] = value
        elif key.startswith(("ansible_", "prepare_")) or key in _CLUSTER_KEYS:
            continue  # Ansible's own variables, the playbooks' (playbooks/README.md), inherited cluster vars
        else:
            guess = did_you_mean(key, sorted(_NODE_KEYS | set(_ANSIBLE_KEYS)))
            raise ConfigError(f"hosts.{name}.{key}: unknown host variable", where=where,
                              hint=f"did you mean '{guess}'?" if guess else
                              f"known: {', '.join(sorted(_NODE_KEYS | set(_ANSIBLE_KEYS)))}")
    ssh.setdefault("host", name)
    node["ssh"] = ssh
    for required in ("fabric_interface", "fabric_address"):
        if required not in node:
            what = "netdev, e.g. enp1s0f0np0" if required == "fabric_interface" else "IPv4 address"
            raise ConfigError(f"hosts.{name}.{required}: missing", where=where,
                              hint=f"set {required} for {name} (the CX-7 fabric {what})")
    return node


def load_inventory(path: Path, *, embedded: bool = False) -> Inventory:
    """Load and validate an Ansible-format inventory file."""
    data = read_yaml(path)
    where = str(path)
    if not isinstance(data, dict) or "all" not in data:
        raise ConfigError("not an Ansible YAML inventory: top-level 'all:' is missing", where=where,
                          hint="see inventory/sparks.example.yml")
    root = data["all"] or {}
    if not isinstance(root, dict):
        raise ConfigError(f"all: expected a mapping (got {type(root).__name__})", where=where,
                          hint="see inventory/sparks.example.yml")
    hosts: list[tuple[str, JSONObject]] = []
    _collect_hosts(root, {}, hosts, where, "all")
    if not hosts:
        raise ConfigError("no hosts in the inventory", where=where, hint="add hosts under all.children.sparks.hosts")
    names = [h[0] for h in hosts]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ConfigError(f"two nodes named {name!r}", where=where, hint="give every host a unique name")
        seen.add(name)
    cvars = root.get("vars") or {}
    cluster = {_CLUSTER_KEYS[k]: v for k, v in cvars.items() if k in _CLUSTER_KEYS}
    for k in cvars:
        if k.startswith("sparkctl_") and k not in _CLUSTER_KEYS:
            guess = did_you_mean(k, sorted(_CLUSTER_KEYS))
            raise ConfigError(f"all.vars.{k}: unknown cluster variable", where=where,
                              hint=f"did you mean '{guess}'?" if guess
                              else f"known: {', '.join(sorted(_CLUSTER_KEYS))}")
    nodes = [_node_from_vars(n, v, where) for n, v in hosts]
    if any("rank" in n for n in nodes):
        for spec in nodes:
            if not isinstance(spec.get("rank"), int) or isinstance(spec.get("rank"), bool):
                problem = ("missing (other hosts set it)" if "rank" not in spec
                           else f"not an integer (got {spec['rank']!r})")
                raise ConfigError(f"hosts.{spec['name']}.sparkctl_rank: {problem}", where=where,
                                  hint="set sparkctl_rank on all nodes (0 for rank 0, 1, ...), or on none")
        ranks = [n["rank"] for n in nodes]
        if sorted(ranks) != list(range(len(nodes))):
            raise ConfigError(f"sparkctl_rank: the {len(nodes)} hosts must have ranks 0..{len(nodes) - 1} once each "
                              f"(got {ranks})", where=where, hint="number the hosts 0, 1, ... without gaps or repeats")
        nodes.sort(key=lambda n: n["rank"])
    try:
        inventory = Inventory(path=where, cluster=cluster, nodes=nodes, embedded=embedded)
    except ValidationError as exc:
        raise _inventory_error(exc, where, nodes) from None
    seen_fabric: dict[str, str] = {}
    for node in inventory.nodes:
        first = seen_fabric.setdefault(node.fabric_address, node.name)
        if first != node.name:
            raise ConfigError(f"hosts.{node.name}.fabric_address: {node.fabric_address} is also "
                              f"hosts.{first}.fabric_address", where=where,
                              hint="give every node its own address on the fabric link (rank 0's is the rendezvous "
                                   "address the other ranks dial)")
    _check_fabric(inventory, where)
    return inventory


def _check_fabric(inventory: Inventory, where: str) -> None:
    """N nodes share one fabric: a cable joins two, a switch joins more (every address in its one subnet)."""
    n = len(inventory.nodes)
    if inventory.fabric_topology == "direct":
        if n > 2:
            raise ConfigError(f"all.vars.sparkctl_fabric_topology: direct links join two nodes; this inventory has "
                              f"{n}", where=where,
                              hint="put the nodes on one fabric subnet through a switch (sparkctl_fabric_topology: "
                                   "switch, with sparkctl_fabric_subnet), or list two nodes")
        return
    subnet = ipaddress.IPv4Network(inventory.cluster.fabric_subnet or f"{inventory.rank0.fabric_address}/24",
                                   strict=False)
    given = "all.vars.sparkctl_fabric_subnet" if inventory.cluster.fabric_subnet else \
        f"the /24 around rank 0's fabric_address ({inventory.rank0.name})"
    for node in inventory.nodes:
        if ipaddress.IPv4Address(node.fabric_address) not in subnet:
            raise ConfigError(f"hosts.{node.name}.fabric_address: {node.fabric_address} is not in the fabric "
                              f"subnet {subnet} ({given})", where=where,
                              hint="through a switch every node needs an address in one subnet: fix the address, or "
                                   "set sparkctl_fabric_subnet to the switch's subnet (e.g. 192.168.100.0/24)")


def _inventory_error(exc: ValidationError, where: str, nodes: list[JSONObject]) -> ConfigError:
    err = config_error_from(exc, Inventory, where)
    # Show the key the user wrote: 'all.vars.sparkctl_cluster' rather than 'cluster.name'.
    for var, key in _CLUSTER_KEYS.items():
        if err.message.startswith(f"cluster.{key}:"):
            err.message = f"all.vars.{var}:" + err.message[len(f"cluster.{key}:"):]
    # Show 'hosts.spark-a.fabric_address' rather than 'nodes[0].fabric_address'.
    ansible = {v: k for k, v in _ANSIBLE_KEYS.items()}
    for i, n in enumerate(nodes):
        for field, var in ansible.items():
            ours, theirs = f"nodes[{i}].ssh.{field}:", f"hosts.{n['name']}.{var}:"
            err.message = err.message.replace(ours, theirs)
            err.evidence = err.evidence and err.evidence.replace(ours, theirs)
        err.message = err.message.replace(f"nodes[{i}].", f"hosts.{n['name']}.")
        err.evidence = err.evidence and err.evidence.replace(f"nodes[{i}].", f"hosts.{n['name']}.")
    return err


def resolve_inventory(explicit: str | None) -> Inventory:
    """--inventory > SPARKCTL_INVENTORY > ./inventory/sparks.yml > ~/.config/sparkctl/inventory/sparks.yml >
    the embedded local cluster (shipped). The shipped file named by path is the embedded cluster too (a systemd
    unit names it with --inventory: sparkctl.watch.systemd)."""
    for given in (explicit, os.environ.get("SPARKCTL_INVENTORY")):
        if given:
            return load_inventory(Path(given), embedded=_is_embedded_file(given))
    for base in user_dirs():
        real = base / "inventory" / "sparks.yml"
        if real.is_file():
            return load_inventory(real)
    return load_inventory(shipped("inventory", "local.yml"), embedded=True)


def _is_embedded_file(path: str) -> bool:
    try:
        return os.path.realpath(path) == os.path.realpath(shipped("inventory", "local.yml"))
    except SparkctlError:             # no shipped data here: whatever the path is, it is not the embedded file
        return False
