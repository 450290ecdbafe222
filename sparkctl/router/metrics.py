"""The router's Prometheus text (sglang-router 0.3.2, names `smg_*`; tests/fixtures/router-0.3.2/metrics.txt) ->
what `status` and the gates read: each worker's health gauge, its circuit-breaker outcomes (one per proxied request),
and the router's own request and response counts."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from sparkctl.sglang.serverinfo import parse_prometheus_samples


@dataclass
class WorkerStats:
    url: str
    healthy: bool | None = None                     # smg_worker_health 1/0
    outcomes: dict[str, float] = field(default_factory=dict)   # smg_worker_cb_outcomes_total by outcome
    breaker_state: float | None = None              # smg_worker_cb_state (0 closed)

    @property
    def requests(self) -> float:
        return sum(self.outcomes.values())


@dataclass
class RouterMetrics:
    workers: dict[str, WorkerStats]
    http_requests: dict[tuple[str, str], float]     # (method, path) -> count
    responses: dict[str, float]                     # status code -> count
    pool_size: float | None
    health_checks: dict[str, float]                 # result -> count

    def requests_to(self, url: str) -> float:
        w = self.workers.get(url.rstrip("/"))
        return w.requests if w else 0.0


def parse_router_metrics(text: str) -> RouterMetrics:
    workers: dict[str, WorkerStats] = {}
    http: dict[tuple[str, str], float] = {}
    responses: dict[str, float] = defaultdict(float)
    checks: dict[str, float] = defaultdict(float)
    pool = None

    def worker(labels: dict[str, str]) -> WorkerStats:
        url = labels.get("worker", "").rstrip("/")
        return workers.setdefault(url, WorkerStats(url))

    for s in parse_prometheus_samples(text):
        if s.name == "smg_worker_health":
            worker(s.labels).healthy = s.value >= 1
        elif s.name == "smg_worker_cb_outcomes_total":
            worker(s.labels).outcomes[s.labels.get("outcome", "")] = s.value
        elif s.name == "smg_worker_cb_state":
            worker(s.labels).breaker_state = s.value
        elif s.name == "smg_http_requests_total":
            http[(s.labels.get("method", ""), s.labels.get("path", ""))] = s.value
        elif s.name == "smg_http_responses_total":
            responses[s.labels.get("status_code", "")] += s.value
        elif s.name == "smg_worker_pool_size":
            pool = (pool or 0.0) + s.value
        elif s.name == "smg_worker_health_checks_total":
            checks[s.labels.get("result", "")] += s.value
    return RouterMetrics(workers=workers, http_requests=http, responses=dict(responses), pool_size=pool,
                         health_checks=dict(checks))
