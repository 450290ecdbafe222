"""`--metrics-port PORT`: the watcher's Prometheus metrics (the `watch` extra: prometheus_client).

Served on 127.0.0.1 unless `--metrics-addr` says otherwise. What it exports (names under ``sparkctl_``):

* the deployment: ``sparkctl_up`` (1 while the watcher runs), ``sparkctl_deployment_healthy`` (1/0; absent when
  the desired state is down), ``sparkctl_desired_down``, ``sparkctl_rank_alive{rank,node}``,
  ``sparkctl_gate_passed{gate}`` (the hand-off gates of the deployment checked), ``sparkctl_watch_gave_up``;
* what the watcher did: ``sparkctl_watch_restarts_total{reason,outcome}``, ``sparkctl_watch_rollbacks_total
  {outcome}``, ``sparkctl_watch_restart_refused`` (1 while it refuses), ``sparkctl_watch_refusals_total{cause}``
  (each refused attempt, by cause: a secret missing or changed, a file gone ...),
  ``sparkctl_watch_time_to_recover_seconds`` (a histogram: failure seen -> serving again);
* per node, from /proc/meminfo (the facts parser of preflight): ``sparkctl_node_memory_available_bytes``,
  ``sparkctl_node_memory_cached_bytes``, ``sparkctl_node_swap_free_bytes`` (GB10's GPU shares this memory, and
  nvidia-smi reports its memory as "Not Supported");
* per GPU, only where nvidia-smi reports a number: ``sparkctl_gpu_temperature_celsius``, ``sparkctl_gpu_power_watts``,
  ``sparkctl_gpu_sm_clock_mhz``. A node without a GPU (the embedded cluster) or a field reported as [N/A] has no
  sample: a value is never made up.
"""
from __future__ import annotations

import subprocess
import time
from types import ModuleType
from typing import TYPE_CHECKING

from sparkctl.errors import ConfigError, SparkctlError
from sparkctl.extras import needed
from sparkctl.nodes import facts
from sparkctl.nodes.environ import helper_env
from sparkctl.nodes.process import read_local_meminfo
from sparkctl.nodes.ssh import connector_for

if TYPE_CHECKING:
    from sparkctl.config.inventory import Inventory, Node
    from sparkctl.deploy.cluster import Cluster
    from sparkctl.watch.desired import Desired, Verdict

NODE_DEADLINE_S = 20.0     # every node's reads of one check, in total
READ_TIMEOUT_S = 10.0      # one read at most


def require_prometheus() -> ModuleType:
    with needed("watch", "--metrics-port"):
        import prometheus_client
    return prometheus_client


def _node_output(inventory: Inventory, node: Node, argv: tuple[str, ...], timeout: float) -> str | None:
    """stdout of a fact's command on `node` (the embedded cluster's nodes are this machine), or None."""
    if node.runtime == "process":
        if argv == ("cat", "/proc/meminfo"):
            res = read_local_meminfo(node.name)
            return res.stdout if res.returncode == 0 else None
        try:      # a helper: the allowlisted environment, never the caller's secrets
            done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                                  env=helper_env())
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None
    try:
        res = connector_for(inventory, node).run(list(argv), timeout=timeout)
    except SparkctlError:
        return None
    return res.stdout if res.returncode == 0 else None


class WatchMetrics:
    """The registry and its HTTP server; the supervisor calls `check`, `restart`, `rollback`, `recovered`, `nodes`."""

    def __init__(self, port: int, addr: str = "127.0.0.1", cluster: str = "") -> None:
        pc = require_prometheus()
        self.pc = pc
        reg = self.registry = pc.CollectorRegistry()
        g, labels = pc.Gauge, ("cluster",)
        self.up = g("sparkctl_up", "1 while the watcher runs", labels, registry=reg)
        self.healthy = g("sparkctl_deployment_healthy", "1 when the desired deployment serves (every rank running, "
                         "rank 0 /health 200; replicated: router ready, every replica healthy)",
                         ("cluster", "desired", "profile"), registry=reg)
        self.down = g("sparkctl_desired_down", "1 when the desired state is down (after `sparkctl down`)", labels,
                      registry=reg)
        self.rank = g("sparkctl_rank_alive", "1 when the rank's engine runs (stopped or zombie: 0)",
                      ("cluster", "rank", "node"), registry=reg)
        self.gate = g("sparkctl_gate_passed", "The desired deployment's hand-off gates (1 passed, 0 failed)",
                      ("cluster", "gate"), registry=reg)
        self.gave_up = g("sparkctl_watch_gave_up", "1 once the watcher stopped acting after a crash loop", labels,
                         registry=reg)
        self.refused_g = g("sparkctl_watch_restart_refused", "1 while the watcher refuses to restart the desired "
                           "deployment (it cannot start exactly what was deployed: a secret's variable missing ...)",
                           labels, registry=reg)
        self.refusals = pc.Counter("sparkctl_watch_refusals", "Restarts refused because they could not start "
                                   "exactly the recorded deployment, by cause (errors.REFUSAL_CAUSES: secret-missing, "
                                   "secret-changed, file-missing, not-as-recorded, record)", ("cluster", "cause"),
                                   registry=reg)
        self.restarts = pc.Counter("sparkctl_watch_restarts", "Restarts of the whole group by the watcher",
                                   ("cluster", "reason", "outcome"), registry=reg)
        self.rollbacks = pc.Counter("sparkctl_watch_rollbacks", "Rollbacks after a crash loop", ("cluster", "outcome"),
                                    registry=reg)
        self.recover = pc.Histogram("sparkctl_watch_time_to_recover_seconds", "From the failure seen to serving again",
                                    labels, buckets=(1, 2, 5, 10, 30, 60, 120, 300, 600, 1800), registry=reg)
        self.mem_available = g("sparkctl_node_memory_available_bytes", "MemAvailable of /proc/meminfo", ("node",),
                               registry=reg)
        self.mem_cached = g("sparkctl_node_memory_cached_bytes", "Cached of /proc/meminfo (page cache)", ("node",),
                            registry=reg)
        self.swap_free = g("sparkctl_node_swap_free_bytes", "SwapFree of /proc/meminfo", ("node",), registry=reg)
        self.gpu_temp = g("sparkctl_gpu_temperature_celsius", "GPU temperature as nvidia-smi reports it",
                          ("node", "gpu"), registry=reg)
        self.gpu_power = g("sparkctl_gpu_power_watts", "GPU power draw as nvidia-smi reports it", ("node", "gpu"),
                           registry=reg)
        self.gpu_clock = g("sparkctl_gpu_sm_clock_mhz", "GPU SM clock as nvidia-smi reports it", ("node", "gpu"),
                           registry=reg)
        self.cluster = cluster
        self.up.labels(cluster).set(1)
        self.gave_up.labels(cluster).set(0)
        self.refused_g.labels(cluster).set(0)
        try:
            self.server, _ = pc.start_http_server(port, addr=addr, registry=reg)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}", where="--metrics-port",
                              hint="choose a free port (e.g. --metrics-port 9464) or stop what listens there") from None
        self.url = f"http://{addr}:{self.server.server_port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- what the supervisor reports -----------------------------------------------------------------------------
    def check(self, c: Cluster, desired: Desired, verdict: Verdict, *, gave_up: bool) -> None:
        cl = self.cluster
        self.gave_up.labels(cl).set(1 if gave_up else 0)
        self.down.labels(cl).set(1 if desired.kind == "down" else 0)
        self.healthy.clear()
        self.rank.clear()
        self.gate.clear()
        if verdict.healthy is None:
            return
        self.healthy.labels(cl, desired.label, desired.profile or "").set(1 if verdict.healthy else 0)
        for r in verdict.ranks:
            self.rank.labels(cl, str(r.rank), r.node).set(1 if r.alive else 0)
        if desired.kind == "deployment" and desired.deployment is not None:
            try:
                gates = c.ledger.load(desired.deployment).gates
            except Exception:  # noqa: BLE001 - a metric, never a reason to stop supervising
                gates = []
            for gate in gates:
                self.gate.labels(cl, gate.name).set(1 if gate.ok else 0)

    def restarted(self, reason: str, outcome: str) -> None:
        self.restarts.labels(self.cluster, reason or "unknown", outcome).inc()

    def refused(self, on: bool, *, cause: str | None = None) -> None:
        """The refusal gauge; a refused attempt (`cause` given) is counted by its cause too."""
        self.refused_g.labels(self.cluster).set(1 if on else 0)
        if on and cause:
            self.refusals.labels(self.cluster, cause).inc()

    def rolled_back(self, outcome: str) -> None:
        self.rollbacks.labels(self.cluster, outcome).inc()

    def recovered(self, seconds: float) -> None:
        self.recover.labels(self.cluster).observe(seconds)

    def nodes(self, inventory: Inventory, *, deadline_s: float = NODE_DEADLINE_S) -> None:
        """Each node's memory and GPU samples, read within `deadline_s` in total (each read gets what is left, at
        most `READ_TIMEOUT_S`); a node not reached in time keeps its last samples until the next check."""
        end = time.monotonic() + deadline_s

        def left() -> float:
            return min(READ_TIMEOUT_S, end - time.monotonic())
        for node in inventory.nodes:
            if left() <= 0:
                return
            text = _node_output(inventory, node, facts.meminfo().argv, left())
            if text:
                try:
                    mem = facts.parse_meminfo(text)
                except ValueError:
                    mem = None
                if mem is not None:
                    self.mem_available.labels(node.name).set(mem.available)
                    if mem.cached is not None:
                        self.mem_cached.labels(node.name).set(mem.cached)
                    if mem.swap_free is not None:
                        self.swap_free.labels(node.name).set(mem.swap_free)
            if node.gpu_runtime == "none":
                continue                 # no GPU on this node (the embedded cluster): no sensor samples
            fact = facts.gpu_sensors()
            if left() <= 0:
                return
            out = _node_output(inventory, node, fact.argv, left())
            for gpu in fact.parse(out) if out else []:
                for gauge, value in ((self.gpu_temp, gpu.temperature_c), (self.gpu_power, gpu.power_w),
                                     (self.gpu_clock, gpu.sm_clock_mhz)):
                    if value is not None:
                        gauge.labels(node.name, str(gpu.index)).set(value)
