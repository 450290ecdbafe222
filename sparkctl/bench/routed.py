"""`sparkctl bench` on a replicated deployment: one arm, the router's endpoint, measured as any arm is; the card gets
the "through the router" section (per-level aggregate, per-replica split, the single pair's figures beside them).

Every replica's ranks are watched while the arm is measured (a death fails the run as for a single pair); the
replicated record is only read (``sparkctl.deploy.replicated.Record``), never written.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkctl.bench import replicas as rb
from sparkctl.bench.arms import BenchOptions, Progress, _noop
from sparkctl.bench.outcome import RunState
from sparkctl.bench.ranks import RankWatch, RankWatches
from sparkctl.bench.router_card import single_pair
from sparkctl.bench.target import Arm
from sparkctl.errors import ConfigError, SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.bounds import Limits
from sparkctl.state.ledger import Ledger

if TYPE_CHECKING:
    from sparkctl.config.inventory import Inventory

__all__ = ["bench_replicated"]


def bench_replicated(inventory: Inventory, opts: BenchOptions, *, progress: Progress = _noop,
                     limits: Limits | None = None, run_s: float | None = None) -> JSONObject:
    """Measure the cluster's replicated deployment through its router; returns the run record's JSON."""
    from sparkctl.bench.run import _measure_all, _new_result, _out_dir, _run
    from sparkctl.deploy.replicated import Record

    ledger = Ledger.for_cluster(inventory.cluster.name)
    rec = Record.load(ledger.root)
    data = rec.data
    if not (data.get("endpoint") or (data.get("router") or {}).get("url")) or not data.get("replicas"):
        raise SparkctlError("the replicated deployment's record names no router endpoint or no replica",
                            where=str(rec.path), hint="`sparkctl status` shows it; `sparkctl up --profile P` "
                                                      "deploys it again")
    limits = limits or Limits()
    opts = rb.with_router_levels(opts)
    run_id = Ledger.new_id(f"bench-{data.get('profile') or 'replicated'}")
    result = _new_result("replicated", opts, run_id, limits, run_s)
    out = _out_dir(opts, ledger, run_id)
    run = RunState(limits, run_s, progress)
    made: dict[str, Any] = {}
    progress(f"replicated deployment {data.get('profile')}: measured through the router {data.get('endpoint')}")

    def make() -> Arm:
        reps = rb.replica_entries(inventory, data, limits)
        arm = rb.router_arm(data, reps, limits)
        reader = rb.MetricsReader((data.get("router") or {}).get("metrics_url"), [r["url"] for r in reps],
                                  rb.metrics_limits(limits))
        arm.level_observer = rb.LevelSplit(reader, [{"index": r["index"], "url": r["url"]} for r in reps])
        made.update(arm=arm, reader=reader)
        return arm

    def watch(arm: Arm) -> RankWatches | None:
        watches = [RankWatch(r["deployer"].runtimes(r["record"].id), r["record"], run.guard,
                             doing=lambda: run.doing)
                   for r in getattr(arm, "replicas", []) if r.get("record") is not None and r.get("deployer")]
        return RankWatches(watches) if watches else None

    def body() -> None:
        try:
            _measure_all(result, [make], opts, run, watch)
        finally:
            arm = made.get("arm")
            if made.get("reader") is not None:
                made["reader"].close()
            if arm is not None:
                pdata = arm.record.profile_data if arm.record is not None else {}
                model = (pdata.get("model") or {}).get("path") or arm.server_info.get("model_path")
                result.router = rb.router_section(data, arm, arm.level_observer, made["reader"],
                                                  single_pair(ledger, model, arm.model))
    return _run(result, body, out, run)


def refuse_compare(compare: object, compare_endpoint: str | None, logs: tuple[Any, ...] = ()) -> None:
    """What a replicated bench does not take: a second arm, or a log file (each replica's log is read through its
    own runtime)."""
    if any(p is not None for p in logs):
        raise ConfigError("--log/--compare-log name one engine's log; a replicated deployment's replicas are read "
                          "through their own runtimes", where="--log",
                          hint="drop --log; `sparkctl logs` shows each replica's log")
    if compare is not None or compare_endpoint:
        raise ConfigError("a replicated deployment is measured alone, through its router: --compare and "
                          "--compare-endpoint are for a single-group deployment",
                          hint="the card sets the latest single-group card of the same model beside the router's "
                               "figures; bench that deployment on its own to record one")
