"""`sparkctl prepare` and `sparkctl facts`: which playbooks to run with which variables, and what they found.

prepare.yml (docker, fabric, dirs, gpu, fabric-ssh) then, with a profile, models.yml (the profile's model and
drafter on every node); ``restore=True`` runs restore.yml instead. Facts are read by facts.yml and parsed
here with the parsers preflight uses (``sparkctl.nodes.facts``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError
from sparkctl.jsontypes import JSONObject
from sparkctl.nodes import docker_facts, facts
from sparkctl.nodes.facts import parse_manifest
from sparkctl.nodes.node_facts import model_paths as _model_paths  # the one reading of --model-path & co.
from sparkctl.prepare.runner import PlaybookRun, TaskResult, run_playbook
from sparkctl.router.replicas import render_replicas

PREPARE_TAGS = ("docker", "fabric", "dirs", "gpu", "fabric-ssh", "drop-caches")
MODELS_MOUNT = "/models"


def profile_models(profile_name: str, inv: Inventory) -> list[str]:
    """Model and drafter directories of a profile (one group, or replicas), relative to host_paths.models
    (``/models/X`` -> ``X``)."""

    # every replica of a replicated profile runs the same model and drafter: replica 0's argv names them (and a
    # count of replicas the inventory cannot hold is refused as `render` refuses it)
    result = render_replicas(load_profile(profile_name), inv)[0].result
    out: list[str] = []
    for what, path in _model_paths(result.specs[0].argv):
        if not path.startswith(MODELS_MOUNT + "/"):
            raise ConfigError(f"the profile's {what} {path} is not under {MODELS_MOUNT}", where=profile_name,
                              hint=f"models are synced only below host_paths.models (mounted at {MODELS_MOUNT})")
        rel = path[len(MODELS_MOUNT) + 1:].rstrip("/")
        if rel not in out:
            out.append(rel)
    return out


@dataclass
class PrepareResult:
    runs: list[PlaybookRun] = field(default_factory=list)

    @property
    def stats(self) -> dict[str, dict[str, int]]:
        """Summed over the playbooks run: host -> ok/changed/failed/unreachable/skipped."""
        out: dict[str, dict[str, int]] = {}
        for run in self.runs:
            for host, counts in run.stats.items():
                acc = out.setdefault(host, dict.fromkeys(counts, 0))
                for k, v in counts.items():
                    acc[k] = acc.get(k, 0) + v
        return out

    def as_dict(self) -> JSONObject:
        return {"stats": self.stats, "runs": [
            {"playbook": r.playbook, "check": r.check, "status": r.status, "artifacts": str(r.artifacts),
             "changed": [{"host": c.host, "task": c.task} for c in r.changed() if "item" not in c.res]}
            for r in self.runs]}


class _PlaybookOptions(TypedDict):
    """What every playbook of one `prepare` runs with (`run_playbook`'s keywords)."""

    check: bool
    become_password: str | None
    on_event: Callable[[TaskResult], None] | None


def prepare(inv: Inventory, *, check: bool = False, tags: list[str] | None = None, models: list[str] | None = None,
            restore: bool = False, become_password: str | None = None,
            on_event: Callable[[TaskResult], None] | None = None) -> PrepareResult:
    """Run the preparation playbooks; raises NodeError naming host, task and fix on the first failure."""
    tags = [t for t in (tags or []) if t]
    unknown = [t for t in tags if t not in (*PREPARE_TAGS, "models")]
    if unknown:
        raise ConfigError(f"unknown tag(s) {', '.join(unknown)}", hint=f"tags: {', '.join((*PREPARE_TAGS, 'models'))}")
    if "models" in tags and not models:
        raise ConfigError("--tags models needs --profile", hint="the model and drafter to sync come from the profile")
    common: _PlaybookOptions = {"check": check, "become_password": become_password, "on_event": on_event}
    result = PrepareResult()
    if restore:
        result.runs.append(run_playbook(inv, "restore.yml", **common))
        result.runs[-1].raise_for_failures()
        return result
    host_tags = [t for t in tags if t != "models"]
    if not tags or host_tags:
        result.runs.append(run_playbook(inv, "prepare.yml", tags=host_tags or None, **common))
        result.runs[-1].raise_for_failures()
    if models and (not tags or "models" in tags):
        result.runs.append(run_playbook(inv, "models.yml", extravars={"prepare_models": models}, **common))
        result.runs[-1].raise_for_failures()
    return result


_FACT_TASKS = {"nvidia-smi": "Fact: nvidia-smi", "ip": "Fact: ip -j addr", "ibdev2netdev": "Fact: ibdev2netdev",
               "docker": "Fact: docker info", "meminfo": "Fact: meminfo", "manifests": "Fact: model manifests"}


def gather_facts(inv: Inventory, *, models: list[str] | None = None) -> dict[str, JSONObject]:
    """Per node: gpu, driver, memory, fabric interface, RoCE links, docker runtimes, model manifests."""
    run = run_playbook(inv, "facts.yml", extravars={"prepare_models": models or []})
    run.raise_for_failures()
    return {n.name: node_facts(run, n.name, n.fabric_interface, models or [], fabric_address=n.fabric_address)
            for n in inv.nodes}


def fabric_address_held(address: str | None, networks: tuple[str, ...]) -> bool | None:
    """Whether an interface with these CIDR addresses answers on `address` (lo's 127.0.0.1/8 holds 127.0.0.2)."""
    import ipaddress
    if not address:
        return None
    try:
        want = ipaddress.ip_address(address)
    except ValueError:
        return None
    return any(want in ipaddress.ip_interface(a).network if "/" in a else want == ipaddress.ip_address(a)
               for a in networks if ":" not in a)


def node_facts(run: PlaybookRun, host: str, fabric_interface: str, models: list[str], *,
               fabric_address: str | None = None) -> JSONObject:
    """Parse one host's registered fact outputs (pure: only the run's recorded results). The fabric's `address`
    is the inventory's (what the ranks dial), `ipv4` what the interface carries, `holds_address` whether the
    interface answers on the address."""
    def out(key: str) -> str | None:
        res = run.registered(host, _FACT_TASKS[key])
        return str(res.get("stdout", "")) if res and res.get("rc") == 0 else None

    result: JSONObject = {}
    smi = out("nvidia-smi")
    parsed = facts.parse_nvidia_smi(smi) if smi else None
    result["gpu"] = {"name": parsed.gpus[0][1] if parsed and parsed.gpus else None,
                     "driver": parsed.driver_version if parsed else None,
                     "cuda": parsed.cuda_version if parsed else None} if parsed else None
    mem = out("meminfo")
    result["memory_gib"] = round(facts.parse_meminfo(mem).total / 2**30, 1) if mem else None
    ip = out("ip")
    iface = facts.parse_ip_addr_json(ip).get(fabric_interface) if ip else None
    result["fabric"] = ({"interface": iface.name, "state": iface.state, "mtu": iface.mtu, "ipv4": list(iface.ipv4),
                         "address": fabric_address,
                         "holds_address": fabric_address_held(fabric_address, iface.addresses)}
                        if iface else None)
    ib = out("ibdev2netdev")
    result["roce"] = ([{"hca": ln.hca, "netdev": ln.netdev, "up": ln.up} for ln in facts.parse_ibdev2netdev(ib)]
                      if ib else None)
    dk = out("docker")
    info = docker_facts.parse_docker_info_json(dk) if dk else None
    result["docker"] = ({"version": info.server_version, "runtimes": list(info.runtimes),
                         "default_runtime": info.default_runtime} if info else None)
    man = run.registered(host, _FACT_TASKS["manifests"]) or {}
    result["models"] = {}
    for item in man.get("results") or []:
        if item.get("rc") == 0:
            m = parse_manifest(item.get("stdout", ""))
            result["models"][str(item.get("item"))] = {"status": m.status, "files": len(m.files),
                                                       "manifest": m.path}
    return result
