"""`sparkctl bench` of a replicated deployment: measured through SGLang's router, split per replica.

The arm is the router's endpoint (what `up` handed off), measured with the same client code and protocol as a single
pair; its configuration is replica 0's deployment record and ``/server_info`` (every replica runs the same profile),
and its concurrency cap is the sum of the replicas' (each replica's own log says why it is capped). Concurrency runs
at 1, 2, 4 and 8 unless ``--concurrency`` says otherwise. Around each level ``LevelSplit`` reads:

* the router's Prometheus text (sglang-router 0.3.2): ``smg_worker_cb_outcomes_total`` per worker, every outcome, one
  per proxied request -> requests per replica during the level (delta after - before);
* each replica's own ``/metrics`` (SGLang with ``--enable-metrics``): ``sglang:generation_tokens_total`` -> tokens
  per replica during the level.

Every read is bounded (``metrics_limits``: a few seconds, a 4 MiB body) and the first failure of a source marks it
unavailable for the rest of the run, so a hostile router costs one bound, not one per level; the aggregate figures
stand either way and the card says why the split is unavailable.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkctl.bench.logsource import LogSource, RuntimeLog, concurrency_cap_from_log
from sparkctl.bench.target import Arm, check_reachable
from sparkctl.errors import SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.router.metrics import parse_router_metrics
from sparkctl.sglang.bounds import Limits
from sparkctl.sglang.client import SGLangAPIError, SGLangClient, parse_server_info
from sparkctl.sglang.serverinfo import parse_prometheus
from sparkctl.state.records import ReplicatedRecord
from sparkctl.state.runs import ConcurrencyLevel, ReplicaShare, RouterBench, RouterLevel, RouterReplica

if TYPE_CHECKING:
    from sparkctl.deploy.door import Deployed

__all__ = ["RouterArm", "MetricsReader", "LevelSplit", "metrics_limits", "REQUESTS_SOURCE", "TOKENS_SOURCE"]

REQUESTS_SOURCE = ("router Prometheus smg_worker_cb_outcomes_total per worker (every outcome; one per proxied "
                   "request), delta over the level")
TOKENS_SOURCE = "each replica's own /metrics sglang:generation_tokens_total, delta over the level"
METRICS_CAP = 4 * 1024 * 1024
SETTLE_S = 2.0           # the router counts a request when its response ends: a level's last ones may lag the client


def metrics_limits(run: Limits) -> Limits:
    """Bounds of one metrics read: the run's own, but at most 5 s to connect, 10 s of silence, 15 s in all."""
    return Limits(connect_s=min(run.connect_s, 5.0), read_s=min(run.read_s, 10.0), idle_s=min(run.idle_s, 10.0),
                  request_s=min(run.request_s, 15.0), max_body_bytes=METRICS_CAP)


def _base_and_path(url: str) -> tuple[str, str]:
    from urllib.parse import urlsplit
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}", (p.path or "/") + (f"?{p.query}" if p.query else "")


class MetricsReader:
    """Bounded reads of the router's metrics and of each replica's; a source that failed once stays failed."""

    def __init__(self, metrics_url: str | None, replica_urls: list[str], limits: Limits) -> None:
        self.metrics_url = metrics_url
        self.replica_urls = [u.rstrip("/") for u in replica_urls]
        self.limits = limits
        self.router_error: str | None = None if metrics_url else "the record names no router metrics URL"
        self.tokens_error: str | None = None
        self.read_s = 0.0                 # seconds spent in metrics reads (the split's cost), failed ones included
        self._clients: dict[str, SGLangClient] = {}

    def _get(self, url: str) -> str:
        base, path = _base_and_path(url)
        t0 = time.monotonic()
        try:
            if base not in self._clients:     # one client (one keep-alive connection) per server, for the run
                self._clients[base] = SGLangClient(base, limits=self.limits)   # no run guard: a failure is the split's
            return self._clients[base].text(path, max_bytes=METRICS_CAP)
        finally:
            self.read_s += time.monotonic() - t0

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()

    def requests(self) -> dict[str, float] | None:
        """Requests the router proxied to each replica so far (None once the router's metrics failed)."""
        if self.router_error is not None:
            return None
        try:
            m = parse_router_metrics(self._get(self.metrics_url or ""))
        except SGLangAPIError as exc:
            self.router_error = f"{self.metrics_url}: {exc.message}"
            return None
        out = {u: m.requests_to(u) for u in self.replica_urls}
        bad = [u for u, v in out.items() if not math.isfinite(v) or v < 0]
        if bad:
            self.router_error = f"{self.metrics_url}: a request counter that is not a count for {', '.join(bad)}"
            return None
        if not any(u in m.workers for u in self.replica_urls):
            seen = ", ".join(sorted(m.workers)[:4]) or "none"
            self.router_error = (f"{self.metrics_url}: the router's metrics name none of the replicas as a worker "
                                 f"(smg_worker_* series for: {seen})")
            return None
        return out

    def tokens(self) -> dict[str, float] | None:
        """Generated tokens each replica reported so far (None once one replica's metrics failed)."""
        if self.tokens_error is not None:
            return None
        out: dict[str, float] = {}
        for u in self.replica_urls:
            try:
                m = parse_prometheus(self._get(u + "/metrics"))
            except SGLangAPIError as exc:
                self.tokens_error = f"{u}/metrics: {exc.message}"
                return None
            v = m.get("sglang:generation_tokens_total")
            if v is None or not math.isfinite(v) or v < 0:
                self.tokens_error = (f"{u}/metrics has no sglang:generation_tokens_total count (the engine needs "
                                     f"--enable-metrics: server.enable_metrics in the profile)")
                return None
            out[u] = v
        return out


def _delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    d = {u: after.get(u, 0.0) - before.get(u, 0.0) for u in after}
    return None if any(v < 0 for v in d.values()) else d


# The router's request and token counters per replica URL when a level starts (None: not readable).
LevelToken = tuple[dict[str, float] | None, dict[str, float] | None]


@dataclass
class LevelSplit:
    """The concurrency measurement's level observer: per-replica requests (and tokens) of each level."""

    reader: MetricsReader
    replicas: list[JSONObject]                          # {"index", "url"} of every replica, in order
    settle_s: float = SETTLE_S
    levels: list[RouterLevel] = field(default_factory=list)

    def before(self, c: int) -> LevelToken:
        return self.reader.requests(), self.reader.tokens()

    def after(self, c: int, entry: ConcurrencyLevel, token: LevelToken) -> None:
        try:
            self._after(c, entry, token)
        except Exception as exc:  # noqa: BLE001 - an observer never breaks the measurement it watches
            self.levels.append(RouterLevel(concurrency=c, aggregate_tok_s=entry.aggregate_tok_s,
                                           requests_sent=c, split="unavailable",
                                           split_note=f"{type(exc).__name__}: {exc}"))

    def _after(self, c: int, entry: ConcurrencyLevel, token: LevelToken) -> None:
        req0, tok0 = token
        answered = len(entry.requests)
        tokens_sent = entry.total_completion_tokens
        end = time.monotonic() + self.settle_s
        while True:                    # bounded: until the router counted every answered request, or settle_s
            req1 = self.reader.requests() if req0 is not None else None
            tok1 = self.reader.tokens() if tok0 is not None else None
            dr, dt = _delta(req0, req1), _delta(tok0, tok1)
            counted_ok = dr is None or sum(dr.values()) >= answered
            tokens_ok = dt is None or sum(dt.values()) >= tokens_sent
            if (counted_ok and tokens_ok) or time.monotonic() >= end:
                break
            time.sleep(0.05)
        if req0 is not None and req1 is not None and dr is None and self.reader.router_error is None:
            self.reader.router_error = (f"{self.reader.metrics_url}: the router's request counters went backwards "
                                        f"during the level (restarted?)")
        if tok0 is not None and tok1 is not None and dt is None and self.reader.tokens_error is None:
            self.reader.tokens_error = "a replica's generation_tokens_total went backwards during the level"
        counted = sum(dr.values()) if dr is not None else None
        tok_total = sum(dt.values()) if dt is not None else None
        shares = []
        for rep in self.replicas:
            u = rep["url"].rstrip("/")
            r = dr.get(u) if dr is not None else None
            t = dt.get(u) if dt is not None else None
            shares.append(ReplicaShare(index=rep["index"], url=u, requests=r,
                                       share=round(r / counted, 4) if r is not None and counted else None,
                                       tokens=t, token_share=round(t / tok_total, 4) if t is not None and tok_total
                                       else None))
        note = None
        if dr is None:
            note = f"per-replica split unavailable: {self.reader.router_error}"
        elif counted != c:
            note = (f"the router counted {counted:g} request(s) to the replicas for the {c} sent "
                    f"({answered} answered); other clients of the router count too")
        self.levels.append(RouterLevel(concurrency=c, aggregate_tok_s=entry.aggregate_tok_s, requests_sent=c,
                                       requests_counted=counted, split="measured" if dr is not None else
                                       "unavailable", split_note=note, replicas=shares))


@dataclass
class RouterArm(Arm):
    """The router's endpoint as an arm: replica 0's configuration, the replicas' summed concurrency cap."""

    replicas: list[JSONObject] = field(default_factory=list)   # index, url, server_info, record, log
    replica_logs: list[LogSource] = field(default_factory=list)

    def _caps(self) -> list[int | None]:
        out: list[int | None] = []
        for rep in self.replicas:
            info = rep.get("server_info") or {}
            s = parse_server_info(info) if info else None
            cap = s.effective_max_running_requests if s else None
            if cap is None and rep.get("record") is not None:
                v = (rep["record"].capacity or {}).get("max_running_requests")
                cap = v if isinstance(v, int) else None
            out.append(cap)
        return out

    @property
    def max_running_requests(self) -> tuple[int | None, str]:
        caps = self._caps()
        known = [c for c in caps if isinstance(c, int)]
        if caps and len(known) == len(caps):
            return sum(known), (f"sum over the {len(caps)} replicas' /server_info effective_max_running_requests "
                               f"({' + '.join(map(str, caps))})")
        return None, "unknown (a replica's resolved max_running_requests could not be read)"

    def concurrency_cap(self) -> JSONObject | None:
        for src in self.replica_logs:
            found = concurrency_cap_from_log(src.whole())
            if found:
                total, _ = self.max_running_requests
                return {**found, "max_running_requests": total,
                        "reason": f"each of the {len(self.replicas)} replicas: {found['reason']}"}
        return super().concurrency_cap()

    def replica_rows(self) -> list[RouterReplica]:
        rows = []
        for rep, cap in zip(self.replicas, self._caps()):
            rec = rep.get("record")
            rows.append(RouterReplica(index=rep["index"], url=rep["url"], nodes=list(rep.get("nodes") or []),
                                      cluster=rep.get("cluster"), deployment=rec.id if rec else None,
                                      max_running_requests=cap,
                                      max_running_requests_source="its /server_info" if rep.get("server_info")
                                      else "its deployment record" if cap is not None else "unknown"))
        return rows


def replica_entries(what: Deployed, limits: Limits) -> list[JSONObject]:
    """Every replica of the replicated deployment `what` (`deploy.door.deployed`) with its deployment record (its
    own ledger, reached through the door), /server_info and rank 0's log."""
    out = []
    for entry in (what.replicated.replicas if what.replicated is not None else []):
        rep: JSONObject = {"index": entry.index, "url": entry.url.rstrip("/"),
                               "nodes": list(entry.nodes), "cluster": entry.cluster,
                               "record": None, "server_info": {}, "log": None, "deployer": None}
        try:
            d = what.replica(entry)
            rep["deployer"], rep["record"] = d, d.ledger.active()
        except SparkctlError:
            pass                                   # no ledger of its own to read: its HTTP answers still count
        rec = rep["record"]
        if rec is not None and (h0 := rec.handle_of(0)) is not None:
            rep["log"] = RuntimeLog(rep["deployer"].runtimes(rec.id).for_node(h0.node), h0)
        try:
            with SGLangClient(rep["url"], limits=metrics_limits(limits)) as c:
                rep["server_info"] = c.server_info()
        except SGLangAPIError:
            pass
        out.append(rep)
    return out


def router_arm(data: ReplicatedRecord, replicas: list[JSONObject], limits: Limits) -> RouterArm:
    """The arm of the router's endpoint (raises when the router does not answer /health 200)."""
    endpoint = str(data.endpoint or (data.router.url if data.router else "")).rstrip("/")
    first = replicas[0] if replicas else {}
    rec = first.get("record")
    prof = rec.profile_data if rec is not None else {}
    arm = RouterArm(name=f"{data.profile or 'replicated'} x{len(replicas)} through the router",
                    client=SGLangClient(endpoint, limits=limits), endpoint=endpoint,
                    model=(prof.get("model") or {}).get("served_name") or first.get("server_info", {}).get(
                        "served_model_name"), record=rec, timeout_s=limits, replicas=replicas,
                    replica_logs=[r["log"] for r in replicas if r.get("log") is not None])
    check_reachable(arm)
    arm.server_info = dict(first.get("server_info") or {})        # the router's own /get_server_info says little
    return arm


def router_section(data: ReplicatedRecord, arm: RouterArm, split: LevelSplit, reader: MetricsReader,
                   single: tuple[Any, str]) -> RouterBench:
    card, note = single
    levels = []
    for lv in split.levels:
        fig = (card.aggregate_tok_s.get(f"c{lv.concurrency}") if card is not None else None)
        ratio = round(lv.aggregate_tok_s / fig, 3) if fig and lv.aggregate_tok_s else None
        levels.append(lv.model_copy(update={"single_pair_tok_s": fig, "vs_single_pair": ratio}))
    return RouterBench(url=arm.endpoint, metrics_url=data.router.metrics_url if data.router else None,
                       profile=data.profile,
                       model=arm.model, emulated=arm.emulated, replicas=arm.replica_rows(),
                       requests_source=REQUESTS_SOURCE,
                       tokens_source=TOKENS_SOURCE if reader.tokens_error is None else None,
                       levels=levels, single_pair=card, single_pair_note=note, metrics_error=reader.router_error,
                       tokens_error=reader.tokens_error, metrics_read_s=round(reader.read_s, 3))
