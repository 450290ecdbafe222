"""What the router runs as: one `RouterSpec` -> `python3 -m sglang_router.launch_router ...` (a list, never a shell
string), on the controller's machine (embedded cluster) or inside a container from the engine image on rank 0's node
(docker runtime: lmsysorg/sglang images carry sglang-router).

Flags and their defaults are sglang-router 0.3.2's (`python -m sglang_router.launch_router --help`, router_args.py):
--policy {random, round_robin, cache_aware, power_of_two, manual} (default cache_aware; 0.3.2 has none of smg's
later least_load / prefix_hash / consistent_hashing); --health-check-interval-secs 60, --health-check-timeout-secs 5,
--health-failure-threshold 3, --health-success-threshold 2, --health-check-endpoint /health; Prometheus on
--prometheus-host/--prometheus-port (29000).
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass, field

from sparkctl.errors import ConfigError

ROLE_LABEL, ROLE = "sparkctl.role", "router"
IDENTITY_LABEL = "sparkctl.router-identity"
CLUSTER_LABEL = "sparkctl.router-cluster"      # not sparkctl.cluster: the engines' own listings never see it
POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "manual")
MODULE = ["-m", "sglang_router.launch_router"]


@dataclass(frozen=True)
class RouterSpec:
    host: str
    port: int
    worker_urls: tuple[str, ...] = ()
    policy: str = "round_robin"
    prometheus_host: str | None = None          # default: host
    prometheus_port: int = 29000
    health_check_interval_s: int = 5            # the router's own default is 60: a dead replica would keep traffic
    health_check_timeout_s: int = 5
    health_failure_threshold: int = 3
    health_success_threshold: int = 2
    health_check_endpoint: str = "/health"
    request_timeout_s: int = 1800
    log_level: str = "info"
    extra: tuple[str, ...] = field(default=())
    reach_host: str | None = None               # where the controller reaches it (default: host); a router bound to
    #                                             0.0.0.0 on rank 0's node is reached at that node's address


    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"router policy {self.policy!r} is not one of sglang-router 0.3.2's",
                              hint=f"use one of: {', '.join(POLICIES)}")
        for name, port in (("port", self.port), ("prometheus_port", self.prometheus_port)):
            if not 1 <= port <= 65535:
                raise ConfigError(f"router {name} {port} is not a TCP port", hint="use 1..65535")
        if self.port == self.prometheus_port and self.metrics_host == self.host:
            raise ConfigError(f"router port and prometheus port are both {self.port}",
                              hint="give the router's metrics their own port")
        for url in self.worker_urls:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"router worker URL {url!r} has no http:// or https://",
                                  hint="write workers as http://HOST:PORT")

    @property
    def metrics_host(self) -> str:
        return self.prometheus_host or self.host

    @property
    def url(self) -> str:
        """The router as the controller reaches it (``reach_host`` when set, else the bind address)."""
        return f"http://{_url_host(self.reach_host or self.host)}:{self.port}"

    @property
    def metrics_url(self) -> str:
        host = self.reach_host if self.reach_host and self.prometheus_host is None else self.metrics_host
        return f"http://{_url_host(host)}:{self.prometheus_port}/metrics"

    def identity(self, image: str = "") -> str:
        """Content hash of what the router runs (its arguments, and the image for a container): same hash = a
        running router that can be kept (a left-over container of another launch is replaced)."""
        return hashlib.sha256(json.dumps([image, *self.args()]).encode()).hexdigest()[:16]

    def args(self) -> list[str]:
        """The launcher's arguments (after `python3 -m sglang_router.launch_router`)."""
        argv = ["--host", self.host, "--port", str(self.port), "--policy", self.policy,
                "--prometheus-host", self.metrics_host, "--prometheus-port", str(self.prometheus_port),
                "--health-check-interval-secs", str(self.health_check_interval_s),
                "--health-check-timeout-secs", str(self.health_check_timeout_s),
                "--health-failure-threshold", str(self.health_failure_threshold),
                "--health-success-threshold", str(self.health_success_threshold),
                "--health-check-endpoint", self.health_check_endpoint,
                "--request-timeout-secs", str(self.request_timeout_s), "--log-level", self.log_level]
        if self.worker_urls:
            argv += ["--worker-urls", *self.worker_urls]
        return argv + list(self.extra)

    def process_argv(self, python: str) -> list[str]:
        """A local process: `python` is the interpreter that has sglang_router installed."""
        return [python, *MODULE, *self.args()]

    def container_argv(self, image: str, name: str, *, cluster: str) -> list[str]:
        """`docker run` of the router inside the engine image on rank 0's node (host network: it reaches every
        replica on the fabric or management addresses, and serves the handed-off endpoint on the node's own).
        Labels: ``sparkctl.role=router`` (what `stop` checks before removing anything), the cluster, and the
        launch's identity (a left-over container of the same launch is kept, another replaced). ``--pull never``:
        a missing image fails here instead of a silent multi-GB pull; ``--init`` forwards SIGTERM."""
        return ["docker", "run", "--detach", "--pull", "never", "--name", name,
                "--label", f"{ROLE_LABEL}={ROLE}", "--label", f"{CLUSTER_LABEL}={cluster}",
                "--label", f"{IDENTITY_LABEL}={self.identity(image)}",
                "--network", "host", "--init", "--restart", "no", "--env", "NO_COLOR=1",
                "--entrypoint", "python3", image, *MODULE, *self.args()]


def _url_host(host: str) -> str:
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host
