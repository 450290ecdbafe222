"""What preflight needs to know about one node, gathered read-only: `NodeFacts`.

A runtime's `gather(spec)` fills this (the docker runtime over SSH in two round-trips of parallel
commands, the process runtime locally); `sparkctl.deploy.preflight_rules.evaluate` judges it. Command
outputs are kept as they came (exit code, stdout, stderr), so the rules are pure functions of text and are
tested on captured output from real Sparks.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from sparkctl.errors import NodeError
from sparkctl.nodes import docker_facts, facts
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.sglang.render import MODELS_MOUNT

if TYPE_CHECKING:
    from sparkctl.config.inventory import Node
    from sparkctl.nodes.ssh import CommandResult, SSHConnector

T = TypeVar("T")      # what a fact's parser makes of a command's stdout (`NodeFacts.parsed`)


@dataclass
class NodeFacts:
    """Everything preflight read on one node. `outputs` keys: docker, ip, mem, ss, gpu, smi, ib, ibdev, model,
    drafter, ping:<peer>, bigping:<peer> (docker runtime); `ports_free` and `engine_error` (process runtime)."""

    node: str
    runtime: str                                   # "docker" | "process"
    reached: str | None = None                     # "198.18.1.2:22" when SSH connected
    unreachable: NodeError | None = None           # why SSH did not connect (then nothing else was read)
    outputs: dict[str, CommandResult] = field(default_factory=dict)
    ports_free: dict[tuple[str, int], bool] = field(default_factory=dict)
    # who listens on a port that is not free (process runtime): pid and title, where this user can see it
    port_holders: dict[tuple[str, int], tuple[int, str]] = field(default_factory=dict)
    # processes of sparkctl's engines that outlived them, pid -> whose ("rank 1 of dep-...": deploy.observe)
    leftover_pids: dict[int, str] = field(default_factory=dict)
    engine_error: str | None = None                # the engine cannot run here (process runtime), and why
    engine: str = "emulator"                       # what the process runtime runs: "emulator" | "sglang"
    engine_fix: str | None = None                  # the command that makes the engine runnable (engine_error set)
    local_paths: dict[str, tuple[str, bool]] = field(default_factory=dict)  # process runtime, real engine:
                                                   # what ("model", "drafter") -> (path here, present)

    def parsed(self, key: str, parse: Callable[[str], T]) -> T | None:
        """`parse(stdout)` of a command that exited 0, else None."""
        res = self.outputs.get(key)
        return parse(res.stdout) if res is not None and res.returncode == 0 else None


def host_model_path(path: str, host_models: str) -> str | None:
    """Where a /models/... path of the engine lives on the node (its host_paths.models), or None if elsewhere."""
    if path == MODELS_MOUNT or path.startswith(MODELS_MOUNT + "/"):
        return host_models.rstrip("/") + path[len(MODELS_MOUNT):]
    return None


def model_paths(argv: list[str]) -> list[tuple[str, str]]:
    """(check name, path) for the model and the drafter when they are local absolute paths (hub ids are not):
    SGLang's --model-path and --speculative-draft-model-path; vLLM's positional model after `serve` and the
    `model` of its --speculative-config JSON."""
    found: list[tuple[str, str | None]] = []
    if argv[2:4] == ["vllm.entrypoints.cli.main", "serve"]:
        found.append(("model", argv[4] if len(argv) > 4 else None))
        if "--speculative-config" in argv[:-1]:
            try:
                config = json.loads(argv[argv.index("--speculative-config") + 1])
            except ValueError:
                config = None
            found.append(("drafter", config.get("model") if isinstance(config, dict) else None))
    else:
        for what, flags in (("model", ("--model-path", "--model")), ("drafter", ("--speculative-draft-model-path",))):
            flag = next((f for f in flags if f in argv[:-1]), None)
            found.append((what, argv[argv.index(flag) + 1] if flag else None))
    return [(what, path) for what, path in found if isinstance(path, str) and path.startswith("/")]


def gather_over_ssh(ssh: SSHConnector, node: Node, peers: list[Node], spec: LaunchSpec) -> NodeFacts:
    """Read a Spark's facts: one round-trip of parallel commands, then full-MTU don't-fragment pings to the
    peers that answered a small ping (what to ask second depends on the first answers, nothing is judged here)."""
    out = NodeFacts(node.name, "docker")
    try:
        ssh.connect()
    except NodeError as exc:
        out.unreachable = exc
        return out
    out.reached = ssh.address
    # what each command is read as -> its argv (the facts' own parsers run later, on `outputs`)
    named: list[tuple[str, tuple[str, ...]]] = [
        ("docker", docker_facts.docker_info().argv), ("ip", facts.ip_addr().argv), ("mem", facts.meminfo().argv),
        ("ss", facts.listening().argv), ("gpu", facts.gpu_query().argv), ("smi", facts.nvidia_smi().argv),
        ("ib", facts.dir_entries("/dev/infiniband").argv)]
    if node.roce_hcas:
        named.append(("ibdev", facts.ibdev2netdev().argv))
    for what, path in model_paths(spec.argv):
        host = host_model_path(path, node.host_paths.models) or path
        named.append((what, ("ls", "-d", "--", host)))
    named += [(f"ping:{p.name}", facts.ping(p.fabric_address, dont_fragment=False).argv) for p in peers]
    out.outputs = dict(zip([k for k, _ in named], ssh.run_many([list(argv) for _, argv in named])))
    iface = (out.parsed("ip", facts.parse_ip_addr_json) or {}).get(node.fabric_interface)
    answered = [p for p in peers if facts.parse_ping(out.outputs[f"ping:{p.name}"].output).ok]
    if iface is not None and iface.up and iface.mtu and answered:
        size = iface.mtu - 28
        bigs = ssh.run_many([list(facts.ping(p.fabric_address, size=size).argv) for p in answered])
        out.outputs.update({f"bigping:{p.name}": res for p, res in zip(answered, bigs)})
    return out
