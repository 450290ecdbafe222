"""Replicas: a profile's `replicas: K` splits the inventory into K groups of `server.tp_size` nodes (in rank order:
replica 0 is ranks 0..tp-1, replica 1 the next tp, ...), each rendered as its own TP group (its own rank 0, its own
--dist-init-addr), with SGLang's router in front on the cluster's rank 0 node. K = 1 is exactly `render()`.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.engines import render
from sparkctl.errors import ConfigError
from sparkctl.jsontypes import JSONObject
from sparkctl.router.process import router_python
from sparkctl.router.spec import MODULE, RouterSpec
from sparkctl.sglang.endpoints import PlannedListener, group_listeners, refuse_collisions, router_listeners
from sparkctl.sglang.render import RenderResult, api_address


@dataclass(frozen=True)
class Replica:
    index: int
    inventory: Inventory           # its nodes, re-ranked 0..tp-1
    result: RenderResult

    @property
    def url(self) -> str:
        s = self.result.specs[0]
        return f"http://{s.api_host}:{s.api_port}"

    @property
    def nodes(self) -> list[str]:
        return [n.name for n in self.inventory.nodes]


def replica_cluster(parent: str, index: int) -> str:
    """`<parent>.r<i>`: replica `index`'s own cluster (its ledger and lock); the inventory refuses '.' in cluster
    names, so no user's cluster is ever named so."""
    return f"{parent}.r{index}"


def replica_inventories(profile: Profile, inventory: Inventory) -> list[Inventory]:
    k, tp = profile.replicas, profile.server.tp_size
    if k == 1:
        return [inventory]
    per_node = {n.gpus for n in inventory.nodes}
    gpus = inventory.nodes[0].gpus
    if per_node != {gpus} or tp % gpus:
        raise ConfigError(f"replicas: {k} groups of server.tp_size {tp} need nodes with the same GPU count dividing "
                          f"{tp} (got GPUs per node {sorted(per_node)})", where=profile.origin_of("replicas"),
                          hint="list single-GPU Sparks, or set replicas: 1")
    size = tp // gpus
    if len(inventory.nodes) != k * size:
        raise ConfigError(f"replicas: {k} x server.tp_size {tp} needs {k * size} node(s); the inventory "
                          f"({inventory.path}) has {len(inventory.nodes)}", where=profile.origin_of("replicas"),
                          hint=f"list {k * size} nodes, or set replicas to {len(inventory.nodes) // size or 1}")
    groups = []
    for g in range(k):
        nodes = [n.model_copy(update={"rank": i}) for i, n in enumerate(inventory.nodes[g * size:(g + 1) * size])]
        groups.append(inventory.model_copy(update={"nodes": nodes}))
    return groups


def render_replicas(profile: Profile, inventory: Inventory, *,
                    environ: Mapping[str, str] | None = None) -> list[Replica]:
    """One Replica per group; ConfigError for a count that does not fit (or anything `render` refuses)."""
    environ = os.environ if environ is None else environ
    key_env = profile.api.api_key_env
    if profile.replicas > 1 and key_env and environ.get(key_env):
        raise ConfigError(f"replicas: {profile.replicas} with an API key (${key_env} is set): sglang-router 0.3.2 "
                          f"takes the workers' key only as --api-key in its argv (visible in ps), which sparkctl "
                          f"does not do", where=profile.origin_of("api.api_key_env"),
                          hint=f"unset {key_env} (or api.api_key_env) for a replicated deployment, and bind the "
                               f"router to a trusted network")
    reps = [Replica(i, inv, render(_own_dist_port(profile, i), inv, environ=environ))
            for i, inv in enumerate(replica_inventories(profile, inventory))]
    refuse_collisions(_listeners(inventory, reps), inventory.path)
    return reps


def _listeners(inventory: Inventory, reps: list[Replica]) -> list[PlannedListener]:
    label = len(reps) > 1
    return [x for rep in reps
            for x in group_listeners(rep.result.specs, rep.inventory, f"replica {rep.index} " if label else "")]


def _own_dist_port(profile: Profile, index: int) -> Profile:
    """Replica `index` rendezvouses on api.dist_port + index. SGLang's TCPStore listens on that port on every
    interface, not only the dist-init address (seen on the real 0.5.23 engine: the second replica on one machine
    failed with EADDRINUSE), so replicas that share a machine (a local cluster; any node holding two groups' rank 0)
    need ports of their own; on Sparks where each replica has its own nodes it changes nothing else."""
    if index == 0:
        return profile
    port = profile.api.dist_port + index
    if port > 65535:
        raise ConfigError(f"api.dist_port {profile.api.dist_port} + replica {index} is past 65535",
                          where=profile.origin_of("api.dist_port"), hint="choose a lower api.dist_port")
    return profile.model_copy(update={"api": profile.api.model_copy(update={"dist_port": port})})


def router_spec(profile: Profile, inventory: Inventory, replicas: list[Replica]) -> RouterSpec:
    """The router on the cluster's rank 0 node, bound where that node's API binds, every replica a worker; the
    controller reaches it where it reaches that node's API (`spec.url` is the endpoint handed off)."""
    node = inventory.rank0
    bind = profile.api.host or node.api_bind
    r = profile.router
    for port, name in ((profile.api.port, "api.port"), (profile.api.dist_port, "api.dist_port")):
        if r.port == port or r.prometheus_port == port:       # replica 0's, always on rank 0's node
            raise ConfigError(f"router ports ({r.port}, {r.prometheus_port}) collide with {name} {port} on rank 0's "
                              f"node", where=profile.origin_of("router"), hint="give router.port and "
                              "router.prometheus_port ports of their own")
    # every other listener (another replica's API or TCP store on the same machine, two hosts on one address)
    reach = api_address(node, bind)
    refuse_collisions(_listeners(inventory, replicas) + router_listeners(node, bind, reach, r.port, r.prometheus_port),
                      inventory.path)
    return RouterSpec(host=bind, port=r.port, prometheus_port=r.prometheus_port, policy=r.policy,
                      worker_urls=tuple(rep.url for rep in replicas),
                      health_check_interval_s=r.health_check_interval_s, reach_host=reach)


def router_endpoint(profile: Profile, inventory: Inventory) -> str:
    """The endpoint handed off for a replicated deployment: the router's, as the controller reaches it."""
    node = inventory.rank0
    return f"http://{api_address(node, profile.api.host or node.api_bind)}:{profile.router.port}"


def replicated_render(profile: Profile, inventory: Inventory, *, replica: int | None = None,
                      rank: int | None = None, environ: Mapping[str, str] | None = None) -> JSONObject:
    """`sparkctl render` of a replicated profile as one document: every replica (index, nodes, url, and its ranks'
    argv + env, secrets as ***) and the router in front of them (node, url, argv). `replica` and `rank` narrow the
    replicas and ranks shown (rank N of every replica, every rank of replica I, or both); a replica or rank the
    profile does not have is a ConfigError saying which it has. The router is always there: it is part of the
    deployment whichever ranks are shown."""
    reps = render_replicas(profile, inventory, environ=environ)
    tp, k = len(reps[0].result.specs), len(reps)
    usage = (f"sparkctl render --profile {profile.name} --replica I --rank N (I: {_span(k, 'replica')}; "
             f"N: {_span(tp, 'rank')}); "
             f"either alone narrows to a replica, or to that rank of every replica")
    if replica is not None and not 0 <= replica < k:
        raise ConfigError(f"--replica {replica}: profile {profile.name} has {_span(k, 'replica')}",
                          where=profile.origin_of("replicas"), hint=usage)
    if rank is not None and not 0 <= rank < tp:
        raise ConfigError(f"--rank {rank}: each replica of profile {profile.name} has {_span(tp, 'rank')}",
                          where=profile.origin_of("server.tp_size"), hint=usage)
    spec = router_spec(profile, inventory, reps)
    docker = inventory.rank0.runtime == "docker"
    argv = ["python3", *MODULE, *spec.args()] if docker else spec.process_argv(router_python())
    warnings: list[str] = []
    for rep in reps:
        warnings += [w for w in rep.result.warnings if w not in warnings]
    return {"profile": profile.name, "engine": profile.engine, "engine_version": profile.engine_version(),
            "sglang_version": profile.image.sglang_version if profile.engine == "sglang" else None,
            "inventory": inventory.path,
            "emulated": inventory.emulated, "replicas": [
                {"index": rep.index, "nodes": rep.nodes, "url": rep.url,
                 "ranks": rep.result.to_json(rank)["ranks"]}
                for rep in reps if replica is None or rep.index == replica],
            "router": {"node": inventory.rank0.name, "url": router_endpoint(profile, inventory),
                       "runs": (f"in a container of the engine image on {inventory.rank0.name}" if docker
                                else "as a process on this machine"),
                       "policy": spec.policy, "argv": argv},
            "warnings": warnings}


def _span(n: int, noun: str) -> str:
    return f"{noun} 0 only" if n == 1 else f"{noun}s 0..{n - 1}"
