"""The router's HTTP API, as sglang-router 0.3.2 serves it (checked against the running router; captures in
tests/fixtures/router-0.3.2/):

* ``POST /workers {"url": ...}`` -> 202 ``{"status": "accepted", "worker_id": UUID, "location": ...}``: queued; the
  worker is listed once the router has read its /server_info and /model_info (a duplicate URL gets the same id and a
  failed ``job_status`` on ``GET /workers/{id}``); 422 (text) without ``url``.
* ``GET /workers`` -> ``{"workers": [{"id", "url", "is_healthy", "load", ...}], "total", "stats"}``.
* ``DELETE /workers/{id}`` -> 202 (queued); 400 for an id that is not a UUID; ``GET /workers/{id}`` 404
  ``WORKER_NOT_FOUND`` once gone. (0.3.2 has no /add_worker, /remove_worker or /list_workers.)
* ``/liveness`` 200 ``OK``; ``/readiness`` 200 ``{"status": "ready", "healthy_workers", "total_workers"}``.

Every wait is bounded and polls; nothing here sleeps without a deadline.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import httpx

from sparkctl.jsontypes import JSONObject
from sparkctl.router import RouterError
from sparkctl.router.metrics import RouterMetrics, parse_router_metrics
from sparkctl.sglang.serverinfo import parse_prometheus
from sparkctl.tls import tls_context

V = TypeVar("V")      # what a bounded wait gives once it holds (`RouterClient._until`)


@dataclass(frozen=True)
class Worker:
    id: str
    url: str
    healthy: bool
    load: int
    model_id: str | None

    @classmethod
    def from_json(cls, d: JSONObject) -> Worker:
        return cls(id=str(d.get("id", "")), url=str(d.get("url", "")).rstrip("/"), healthy=bool(d.get("is_healthy")),
                   load=int(d.get("load") or 0), model_id=d.get("model_id"))


@dataclass(frozen=True)
class RouterHealth:
    live: bool
    ready: bool
    healthy_workers: int
    total_workers: int
    detail: str


class RouterClient:
    def __init__(self, url: str, *, metrics_url: str | None = None, timeout_s: float = 5.0,
                 poll_s: float = 0.1) -> None:
        self.url, self.metrics_url, self.poll_s = url.rstrip("/"), metrics_url, poll_s
        self._http = httpx.Client(timeout=timeout_s, trust_env=False, verify=tls_context())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RouterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- one call each -------------------------------------------------------------------------------------------
    def _call(self, method: str, path: str, *, json: JSONObject | None = None) -> httpx.Response:
        try:
            return self._http.request(method, self.url + path, json=json)
        except httpx.HTTPError as exc:
            raise RouterError(f"router {self.url}: {method} {path} failed: {exc}",
                              hint="is the router running? (sparkctl status shows it)") from None

    def list_workers(self) -> list[Worker]:
        r = self._call("GET", "/workers")
        if r.status_code != 200:
            raise RouterError(f"router {self.url}: GET /workers answered {r.status_code}", evidence=r.text[:500])
        doc = _json_object(r)
        workers = doc.get("workers") if doc is not None else None
        if not isinstance(workers, list):
            raise RouterError(f"router {self.url}: GET /workers did not answer a JSON object with a workers list",
                              evidence=r.text[:500])
        return [Worker.from_json(w) for w in workers if isinstance(w, dict)]

    def find(self, worker_url: str) -> Worker | None:
        want = worker_url.rstrip("/")
        return next((w for w in self.list_workers() if w.url == want), None)

    def health(self) -> RouterHealth:
        try:
            live = self._http.get(self.url + "/liveness").status_code == 200
            r = self._http.get(self.url + "/readiness")
        except httpx.HTTPError as exc:
            return RouterHealth(False, False, 0, 0, f"no answer: {exc}")
        body = _json_object(r) or {}
        return RouterHealth(live, r.status_code == 200 and body.get("status") == "ready",
                            _count(body.get("healthy_workers")), _count(body.get("total_workers")),
                            f"/readiness {r.status_code} {r.text[:200]}")

    def metrics(self) -> RouterMetrics:
        if not self.metrics_url:
            raise RouterError(f"router {self.url}: no Prometheus URL known", hint="start it with a prometheus port")
        try:
            r = self._http.get(self.metrics_url)
        except httpx.HTTPError as exc:
            raise RouterError(f"router metrics {self.metrics_url}: {exc}") from None
        return parse_router_metrics(r.text)

    # ---- bounded operations -------------------------------------------------------------------------------------
    def _until(self, what: str, done: Callable[[], V | None], timeout_s: float) -> V:
        end = time.monotonic() + timeout_s
        while True:
            got = done()
            if got:
                return got
            if time.monotonic() >= end:
                raise RouterError(f"router {self.url}: {what} not within {timeout_s:g}s",
                                  hint="see the router's log; the worker's /health and /server_info must answer")
            time.sleep(self.poll_s)

    def add_worker(self, worker_url: str, *, timeout_s: float = 30.0) -> Worker:
        """Register ``worker_url`` and wait until the router lists it healthy (it routes to it from then on)."""
        r = self._call("POST", "/workers", json={"url": worker_url.rstrip("/")})
        if r.status_code not in (200, 201, 202):
            raise RouterError(f"router {self.url}: POST /workers {worker_url} answered {r.status_code}",
                              evidence=r.text[:500])
        return self._until(f"worker {worker_url} listed healthy",
                           lambda: (w if (w := self.find(worker_url)) and w.healthy else None), timeout_s)

    def remove_worker(self, worker_url: str, *, timeout_s: float = 30.0) -> bool:
        """Unregister ``worker_url`` and wait until the router no longer lists it (no new request goes to it).
        False if it was not registered."""
        w = self.find(worker_url)
        if w is None:
            return False
        r = self._call("DELETE", f"/workers/{w.id}")
        if r.status_code not in (200, 202, 204, 404):
            raise RouterError(f"router {self.url}: DELETE /workers/{w.id} ({worker_url}) answered {r.status_code}",
                              evidence=r.text[:500])
        self._until(f"worker {worker_url} removed", lambda: self.find(worker_url) is None, timeout_s)
        return True


class EngineFrozen(Exception):
    """An engine's /metrics read timed out (an engine that answers nothing, unlike one that is gone)."""


def drain(in_flight: Callable[[], int | None], *, timeout_s: float, poll_s: float = 0.1,
          what: str = "worker") -> float:
    """Wait (bounded) until ``in_flight()`` reads 0: the requests a removed worker still serves. Returns the seconds
    waited; raises RouterError with the last count at the bound. ``in_flight`` returning None (unreadable) counts as
    not drained."""
    t0 = time.monotonic()
    last: int | None = None
    frozen = 0
    while True:
        try:
            last = in_flight()
            frozen = 0
        except EngineFrozen as exc:
            frozen += 1
            if frozen >= FROZEN_READS:
                raise RouterError(f"{what}: frozen: {exc} {frozen} times in a row (stopped, hung or swapping), "
                                  f"after {time.monotonic() - t0:.1f}s of the {timeout_s:g}s drain",
                                  hint="look at the engine (sparkctl status, sparkctl doctor); the update replaces "
                                       "it once it is stopped") from None
            continue
        if last == 0:
            return time.monotonic() - t0
        if time.monotonic() - t0 >= timeout_s:
            raise RouterError(f"{what}: {last if last is not None else 'unknown'} request(s) still in flight after "
                              f"{timeout_s:g}s", hint="raise the drain bound, or let the update stop those requests")
        time.sleep(poll_s)


FROZEN_READS = 2     # consecutive /metrics reads that time out: the engine is frozen, not busy


def engine_in_flight(api_url: str, *, timeout_s: float = 2.0) -> int | None:
    """Running + queued requests of one SGLang engine, from its /metrics (needs --enable-metrics); None if unread.
    A refused connection is 0: no process listens there, so nothing is in flight (a dead engine is not waited
    for). A read that times out raises EngineFrozen: see `drain`."""
    try:
        r = httpx.get(api_url.rstrip("/") + "/metrics", timeout=timeout_s, trust_env=False,
                      verify=tls_context())
    except httpx.ConnectError as exc:
        if isinstance(exc.__cause__ or exc.__context__, ConnectionRefusedError) or "refused" in str(exc).lower():
            return 0
        return None
    except httpx.TimeoutException:
        raise EngineFrozen(f"{api_url}/metrics did not answer within {timeout_s:g}s") from None
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    m = parse_prometheus(r.text)
    if "sglang:num_running_reqs" not in m:
        return None
    return int(m["sglang:num_running_reqs"] + m.get("sglang:num_queue_reqs", 0.0))


def detach(router: RouterClient, worker_url: str, *, drain_s: float, remove_s: float = 30.0) -> float:
    """A rolling update's first move on one replica: out of the router (no new request), then its in-flight requests
    drained (bounded by ``drain_s``). Returns the seconds the drain took. Idempotent: a replica already out is
    only drained (a re-run after a crash between the two moves)."""
    router.remove_worker(worker_url, timeout_s=remove_s)
    return drain(lambda: engine_in_flight(worker_url), timeout_s=drain_s, what=f"replica {worker_url}")


def attach(router: RouterClient, worker_url: str, *, timeout_s: float = 30.0) -> Worker:
    """A rolling update's last move on one replica (after its gates passed): back into the router, healthy.
    Idempotent: a replica already in is returned as it is listed."""
    w = router.find(worker_url)
    if w is not None and w.healthy:
        return w
    return router.add_worker(worker_url, timeout_s=timeout_s)


def _json_object(r: httpx.Response) -> JSONObject | None:
    """The body as a JSON object when it is one (a router of another version or a hostile one: None)."""
    try:
        doc = r.json()
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _count(value: object) -> int:
    return value if type(value) is int and value >= 0 else 0
