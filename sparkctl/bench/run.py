"""`sparkctl bench` as a library call: build the arms, measure them, compare, write the card.

Three ways in:

* ``bench_deployment(deployer, opts)``: the ledger's active deployment (endpoint, launch specs, capacity,
  profile; rank 0's log through its runtime). With ``compare_profile`` the other profile is deployed
  through deploy's door as the compare transaction's arm (one `up` plan, journal and record), measured with the
  same workload, and the original deployment is restored (always, also after a failure) by ``door.restore``.
* ``bench_endpoint(url, opts)``: any OpenAI-compatible SGLang endpoint, nothing deployed; the
  configuration comes from ``/server_info``. ``compare_endpoint`` adds a second running endpoint.
* ``bench_log(path, opts)``: scheduler lines of a captured log only (acceptance, gauge, capacity).
* ``bench_replicated(inventory, opts)``: a replicated deployment, one arm: the router's endpoint, measured as any
  arm is; the card gets the "through the router" section (per-level aggregate, per-replica split, the single
  pair's figures beside them). Every replica's ranks are watched while the arm is measured (a death fails the run
  as for a single pair); what runs and how each replica is reached come from ``sparkctl.deploy.door.deployed``
  (the replicated record is only read there, never written).

Every run leaves a record: ``report.json`` (every number plus the configuration it came from) and
``report.md`` (the card, rendered from that JSON) under ``Ledger.run_dir(run_id)`` or ``opts.out_dir``,
also when a measurement failed (``status: failed`` with the error); ``sparkctl.bench.card_files`` writes them.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkctl.bench import losslessness
from sparkctl.bench import router_arm as rb
from sparkctl.bench.arms import (
    GATES,
    BenchOptions,
    Progress,
    _noop,
    arm_from_endpoint,
    arm_from_record,
    measure_arm,
    parse_gates,
)
from sparkctl.bench.card_files import ReportDir, card_dir, write_report
from sparkctl.bench.logsource import FileLog, capacity_from_log, scheduler_summary
from sparkctl.bench.outcome import RunState, bench_error, failures
from sparkctl.bench.prompts import decode_prompts, g6_prompts, prompt_set_digest
from sparkctl.bench.ranks import RankWatch, RankWatches
from sparkctl.bench.router_card import single_pair
from sparkctl.bench.stats import ratio
from sparkctl.bench.target import Arm, arm_role
from sparkctl.deploy import door
from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.commands import Deployer
from sparkctl.deploy.results import UpResult
from sparkctl.deploy.steps import ARM_COMMAND
from sparkctl.enginenames import ENGINE_NAMES
from sparkctl.engines import render
from sparkctl.errors import BenchError, ConfigError, SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.client import Limits, SGLangAPIError
from sparkctl.state.ledger import Ledger, now_iso
from sparkctl.state.records import Status
from sparkctl.state.runs import ArmEntry, ArmResults, DecodeResult, RunRecord

if TYPE_CHECKING:
    from sparkctl.config.inventory import Inventory
    from sparkctl.config.profile import Profile
    from sparkctl.deploy.commands import Deployer
    from sparkctl.deploy.progress import Reporter
    from sparkctl.deploy.results import ReplicatedUpResult, UpResult

__all__ = ["GATES", "BenchOptions", "parse_gates", "arm_from_endpoint", "bench", "bench_deployment",
           "bench_endpoint", "bench_log", "bench_replicated", "refuse_compare", "SCHEMA"]

SCHEMA = "sparkctl.bench/1"


# --------------------------------------------------------------------------- comparison + run

def _decode_summary(arm: ArmEntry, cls: str) -> JSONObject | None:
    decode = arm.results.decode
    entry = decode.classes.get(cls) if isinstance(decode, DecodeResult) else None
    return entry.decode_tok_s if entry is not None else None


def _compare(arms: list[ArmEntry]) -> JSONObject:
    """ON/OFF (or A/B) decode ratios per class from two measured arms."""
    if len(arms) != 2:
        return {}
    on, off = (arms[0], arms[1])
    if off.config["role"] == "ON":
        on, off = off, on
    out: JSONObject = {"numerator": on.config["role"], "denominator": off.config["role"], "decode": {}}
    for cls in decode_prompts():
        a, b = _decode_summary(on, cls), _decode_summary(off, cls)
        if a or b:
            r = ratio(a["median"] if a else None, b["median"] if b else None)
            out["decode"][cls] = {"on": a["median"] if a else None, "off": b["median"] if b else None,
                                  "ratio": None if r is None else round(r, 3)}
    return out


def _between_engines(arms: list[Arm]) -> str | None:
    """"vLLM 0.32.0 vs SGLang 0.5.23" when the two arms are two engines (``bench --compare`` across engines: the
    card's reference row measured on the same nodes), else None."""
    a, b = arms
    return None if a.engine == b.engine else f"{_engine_label(a)} vs {_engine_label(b)}"


def _engine_label(arm: Arm) -> str:
    name = ENGINE_NAMES.get(arm.engine, arm.engine)
    return f"{name} {arm.version}" if arm.version else name


def _new_result(mode: str, opts: BenchOptions, run_id: str, limits: Limits, run_s: float | None) -> RunRecord:
    options = {**opts.as_dict(), "limits": limits.as_dict(), "run_deadline_s": run_s}
    return RunRecord(schema_=SCHEMA, run_id=run_id, mode=mode, started=now_iso(), options=options,
                     prompt_set=prompt_set_digest(), reference=list(opts.reference))


def _finish(result: RunRecord, arms: list[Arm]) -> None:
    result.emulated = any(a.config["emulated"] for a in result.arms) or any(a.emulated for a in arms)
    result.finished = now_iso()


def _measure_all(result: RunRecord, arms_in_order: list[Callable[[], Arm]], opts: BenchOptions,
                 run: RunState, watch: Callable[[Arm], RankWatch | RankWatches | None] = lambda arm: None) -> None:
    """Build and measure the arms one after another (a later arm may need an earlier one torn down)."""
    run_tag = result.run_id
    g6 = len(arms_in_order) == 2
    captures: list[list[losslessness.Capture] | None] = []
    built: list[Arm] = []
    for i, make in enumerate(arms_in_order):
        arm = run.make_arm(make)
        built.append(arm)
        arm.role = ("A", "B")[i] if len(arms_in_order) == 2 else "ON" if arm.speculative else "OFF"
        watcher = watch(arm)
        try:
            if watcher is not None:
                run.watch = watcher.__enter__()
            res, caps = measure_arm(arm, opts, f"{run_tag}/{i}", primary=(i == 0), g6=g6, progress=run.progress)
        except BaseException:
            result.arms.append(ArmEntry(config=arm.config(), results=ArmResults()))   # what was measured, even so
            raise
        finally:
            run.watch = None
            if watcher is not None:
                watcher.__exit__(None, None, None)
                if watcher.death is not None:
                    # An extra field of the record (extra="allow"): written only when a rank died, so the JSON
                    # of every other run keeps its shape.
                    setattr(result, "rank_death", watcher.death)  # noqa: B010
            arm.client.close()
        result.arms.append(ArmEntry(config=arm.config(), results=res))
        captures.append(caps)
        run.stop_if_tripped()
    if len(built) == 2:
        arm_role(built)
        for entry, arm in zip(result.arms, built):
            entry.config["role"] = arm.role
        between = _between_engines(built)
        if between:      # each arm's title names its engine: the card compares engines, not settings of one
            for entry, arm in zip(result.arms, built):
                entry.config["engine_label"] = _engine_label(arm)
        result.comparison = _compare(result.arms)
        first, second = captures[0], captures[1]
        if first is not None and second is not None:
            on_i = 0 if built[0].role in ("ON", "A") else 1
            on_caps, off_caps = (first, second) if on_i == 0 else (second, first)
            plist = g6_prompts()[: opts.g6_limit] if opts.g6_limit else g6_prompts()
            verdicts = [losslessness.compare(p.id, a, b)
                        for p, a, b in zip(plist, on_caps, off_caps)]
            result.g6 = {"on": built[on_i].role, "off": built[1 - on_i].role,
                            "max_tokens": opts.g6_max_tokens or opts.max_tokens, "temperature": 0,
                            "captured": "reasoning_content + content (+ tool calls); server tokens when logprobs "
                                        "cover the completion, else whitespace tokens",
                            **losslessness.summarize_verdicts(verdicts, between_engines=between),
                            "prompts": [{**v.as_dict(), "on_output": a.as_dict(), "off_output": b.as_dict()}
                                        for v, a, b in zip(verdicts, on_caps, off_caps)]}
    _finish(result, built)
    failed = failures(result)
    if failed:
        raise BenchError(f"{len(failed)} measurement(s) failed: {failed[0]}", where="bench",
                         hint="the card shows each failure in its section; fix the server and run again",
                         evidence="\n".join(failed[:20]))


def _run(result: RunRecord, body: Callable[[], None], out_dir: ReportDir,
         run: RunState | None = None) -> RunRecord:
    """Run `body`, record how it ended (successful, failed, canceled), write the report either way; returns the
    record as written (`write_report`)."""
    secrets = run.secrets if run else set()
    try:
        body()
        result.status = Status.SUCCESSFUL
    except (Exception, KeyboardInterrupt) as exc:
        result.status = Status.CANCELED if isinstance(exc, KeyboardInterrupt) else Status.FAILED
        err = exc
        if run is not None and isinstance(exc, SGLangAPIError):
            err = bench_error(exc)
        result.errors.append(err.render() if isinstance(err, SparkctlError) else f"{type(err).__name__}: {err}")
        result.finished = result.finished or now_iso()
        files = write_report(result, out_dir, secrets).files
        if isinstance(err, BenchError):
            new = copy.copy(err)
            new.hint = (f"{err.hint}; " if err.hint else "") + f"the card, marked failed: {files['markdown']}"
            raise new from exc
        raise
    return write_report(result, out_dir, secrets)


def bench_endpoint(url: str, opts: BenchOptions, *, ledger: Ledger | None = None, api_key: str | None = None,
                   log_path: Path | None = None, compare_endpoint: str | None = None,
                   compare_log_path: Path | None = None, progress: Progress = _noop, limits: Limits | None = None,
                   run_s: float | None = None, compare_api_key: str | None = None) -> RunRecord:
    """Measure a running endpoint (and optionally a second one to compare against).

    ``api_key`` goes to ``url`` and ``compare_api_key`` to ``compare_endpoint``, each only when given (the CLI
    gives them only when the user named the variable with ``--api-key-env``). ``limits`` bound every request,
    ``run_s`` the whole run (seconds).
    """
    limits = limits or Limits()
    run_id = Ledger.new_id("bench")
    result = _new_result("endpoint", opts, run_id, limits, run_s)
    out = card_dir(opts, ledger, run_id)
    run = RunState(limits, run_s, progress)
    makers = [lambda: arm_from_endpoint(url, api_key=api_key, log_path=log_path, timeout_s=limits)]
    if compare_endpoint:
        makers.append(lambda: arm_from_endpoint(compare_endpoint, api_key=compare_api_key, log_path=compare_log_path,
                                                timeout_s=limits))
    return _run(result, lambda: _measure_all(result, makers, opts, run), out, run)


def bench_deployment(deployer: Deployer, opts: BenchOptions, *, primary_profile: Profile | None = None,
                     compare_profile: Profile | None = None,
                     compare_endpoint: str | None = None, log_path: Path | None = None,
                     compare_log_path: Path | None = None, compare_api_key: str | None = None,
                     progress: Progress = _noop, limits: Limits | None = None,
                     run_s: float | None = None) -> RunRecord:
    """Measure the active deployment; with ``compare_profile`` deploy it, measure, restore the original.

    ``primary_profile``: deploy that profile first (a no-op when it already runs healthy) and measure it;
    it stays deployed afterwards, as after ``sparkctl up``.
    """

    if primary_profile is not None:
        progress(f"making sure {primary_profile.name} is deployed")
        up = _deploy(deployer, primary_profile)
        reason = up.reason if isinstance(up, UpResult) else None
        progress(f"{primary_profile.name}: {up.outcome}" + (f" ({reason})" if reason else ""))
    original = deployer.ledger.active()
    if original is None:
        raise SparkctlError("no active deployment to measure", where=str(deployer.ledger.root),
                            hint="deploy one (sparkctl up --profile NAME) or measure any server with --endpoint URL")
    if compare_profile is not None and compare_profile.name == original.profile:
        raise ConfigError(f"--compare {compare_profile.name} is the profile already deployed",
                          hint="compare against a different profile, e.g. --compare dflash-off")
    limits = limits or Limits()
    run_id = Ledger.new_id(f"bench-{original.profile}")
    result = _new_result("deployment", opts, run_id, limits, run_s)
    result.deployment = original.id
    out = card_dir(opts, deployer.ledger, run_id)
    run = RunState(limits, run_s, progress)
    progress = run.progress
    makers: list[Callable[[], Arm]] = [lambda: arm_from_record(deployer, original, log_path=log_path,
                                                               timeout_s=limits)]
    if compare_endpoint:
        makers.append(lambda: arm_from_endpoint(compare_endpoint, api_key=compare_api_key, log_path=compare_log_path,
                                                timeout_s=limits))
    elif compare_profile is not None:
        def deploy_other() -> Arm:
            progress(f"deploying {compare_profile.name} for the comparison arm (the original is restored after)")
            up = door.up(deployer, compare_profile, door.UpRequest(command=ARM_COMMAND), confirm=door.proceed)
            assert isinstance(up, UpResult)          # an arm is one group (door.up refuses replicas in one)
            result.compare_deployment = {"deployment": up.deployment, "outcome": up.outcome, "endpoint": up.endpoint}
            return arm_from_record(deployer, deployer.ledger.load(str(up.deployment)), log_path=compare_log_path,
                                   timeout_s=limits)
        makers.append(deploy_other)

    def watch(arm: Arm) -> RankWatch | None:
        if arm.record is None:
            return None
        return RankWatch(deployer.runtimes(arm.record.id), arm.record, run.guard, doing=lambda: run.doing)

    def body() -> None:
        try:
            _measure_all(result, makers, opts, run, watch)
        finally:
            if compare_profile is not None and not compare_endpoint:
                result.restore = door.restore(deployer, original.id, progress=progress,
                                              say="restoring the original deployment ({profile})")

    if compare_profile is not None and not compare_endpoint:
        # Hold the cluster lock for the whole comparison: no other `up` may redeploy between the arms.
        with deployer.ledger.lock("bench --compare"):
            return _run(result, body, out, run)
    return _run(result, body, out, run)


def bench_log(path: Path, opts: BenchOptions, *, ledger: Ledger | None = None) -> RunRecord:
    """Scheduler numbers from a captured log alone: accept len/rate ranges, the gauge peak, capacity."""
    run_id = Ledger.new_id("bench-log")
    result = _new_result("log-only", opts, run_id, Limits(), None)
    out = card_dir(opts, ledger, run_id)

    def body() -> None:
        src = FileLog(path)
        lines = src.whole()
        sch = scheduler_summary(lines)
        d = sch["decode"]
        result.log_only = {
            "log": str(path), "scope": "whole captured log (not windowed to a run of this bench)",
            "source": "scheduler decode-batch log, lines with #running-req >= 1",
            "accept_len": d["accept_len"], "accept_rate": d["accept_rate"], "active_batches": d["active_batches"],
            "decode_batches": d["batches"], "gauge_peak_gen_throughput": d["peak_gen_throughput"],
            "max_running_req": d["max_running_req"], "dialects": d["dialects"],
            "sglang_version": "unknown (not printed in the log)",
            "capacity": capacity_from_log(lines) or None,
            "prefill": {k: v for k, v in sch.items() if k != "decode"}}
        result.finished = now_iso()

    return _run(result, body, out)


def bench(inventory: Inventory, opts: BenchOptions, *, reporter: Reporter | None = None,
          profile: Profile | None = None, compare: Profile | None = None,
          endpoint: str | None = None, compare_endpoint: str | None = None, log: Path | None = None,
          compare_log: Path | None = None, log_only: bool = False, api_key: str | None = None,
          progress: Progress = _noop, limits: Limits | None = None, run_s: float | None = None) -> RunRecord:
    """`sparkctl bench`: pick the mode from what is given, run it, return its run record (as written).

    ``endpoint``: measure that server (and ``compare_endpoint``). ``log_only``, or a ``log`` with nothing
    deployed and nothing else named: log-only analysis. Otherwise the inventory's active deployment
    (``profile`` deployed first when given; ``compare`` deployed for the second arm, then the original restored).
    ``api_key`` is for the endpoints given by URL, and only when the caller names it (the CLI: ``--api-key-env
    NAME``); deployments use the env var their own profile names, and nothing else gets a key.
    ``limits`` bound every request and ``run_s`` the whole run.
    """

    if endpoint and (compare or profile):
        raise ConfigError("--endpoint measures a running server; --profile/--compare deploy profiles",
                          hint="use --compare-endpoint URL with --endpoint")
    if compare and compare_endpoint:
        raise ConfigError("--compare and --compare-endpoint both name the second arm", hint="pick one")
    if compare is not None and compare.replicas > 1:     # before the first arm is deployed or measured
        raise ConfigError(f"--compare {compare.name} has replicas: {compare.replicas}: a comparison deploys its "
                          f"second arm as one TP group, never replicas behind the router",
                          where=compare.origin_of("replicas"),
                          hint=f"measure it alone: sparkctl bench --profile {compare.name} (its card sets the latest "
                               f"single-group card of the same model beside the router's figures)")
    if compare is not None:       # one the cluster cannot hold, likewise (read-only: nothing starts)
        render(compare, inventory)
    for p in (log, compare_log):
        if p is not None and not p.is_file():
            raise ConfigError(f"no such log file: {p}", where="--log")

    ledger = Ledger.for_cluster(inventory.cluster.name)
    deployer = Deployer(inventory, reporter, ledger)
    if not log_only and not endpoint and door.deployed(deployer, profile).kind == "replicated":
        refuse_compare(compare, compare_endpoint, (log, compare_log))
        if profile is not None:
            progress(f"making sure {profile.name} is deployed ({profile.replicas} replicas behind the router)")
            progress(f"{profile.name}: {_deploy(deployer, profile).outcome}")
        return bench_replicated(inventory, opts, progress=progress, limits=limits, run_s=run_s)
    if log_only or (log and not endpoint and not profile and not compare and ledger.active() is None):
        if not log:
            raise ConfigError("--log-only needs --log FILE")
        return bench_log(log, opts, ledger=ledger)
    if endpoint:
        return bench_endpoint(endpoint, opts, ledger=ledger, api_key=api_key, log_path=log,
                              compare_endpoint=compare_endpoint, compare_log_path=compare_log, progress=progress,
                              limits=limits, run_s=run_s, compare_api_key=api_key)
    if deployer.embedded_notice:
        progress(deployer.embedded_notice)
    return bench_deployment(deployer, opts, primary_profile=profile, compare_profile=compare,
                            compare_endpoint=compare_endpoint, log_path=log, compare_log_path=compare_log,
                            compare_api_key=api_key, progress=progress, limits=limits, run_s=run_s)


def _deploy(deployer: Deployer, profile: Profile) -> UpResult | ReplicatedUpResult:
    """`bench --profile P`: P deployed through deploy's door, as `sparkctl up` would (a no-op when it runs
    healthy; a replicated profile behind its router; one group after the router and replicas went down)."""
    return door.up(deployer, profile, door.UpRequest(), confirm=door.proceed)


# ------------------------------------------------------------------------------------ replicated deployments
def bench_replicated(inventory: Inventory, opts: BenchOptions, *, progress: Progress = _noop,
                     limits: Limits | None = None, run_s: float | None = None) -> RunRecord:
    """Measure the cluster's replicated deployment through its router; returns the run record (as written)."""

    ledger = Ledger.for_cluster(inventory.cluster.name)
    what = door.deployed(Cluster(inventory, None, ledger))
    data = what.replicated
    if not what.endpoint or data is None or not data.replicas:
        raise SparkctlError("the replicated deployment's record names no router endpoint or no replica",
                            where=str(what.where or ledger.root), hint="`sparkctl status` shows it; "
                                                                       "`sparkctl up --profile P` deploys it again")
    limits = limits or Limits()
    opts = dataclasses.replace(opts, concurrency=tuple(opts.router_concurrency))   # 1, 2, 4, 8 unless given
    run_id = Ledger.new_id(f"bench-{data.profile or 'replicated'}")
    result = _new_result("replicated", opts, run_id, limits, run_s)
    out = card_dir(opts, ledger, run_id)
    run = RunState(limits, run_s, progress)
    made: dict[str, Any] = {}
    progress(f"replicated deployment {data.profile}: measured through the router {data.endpoint}")

    def make() -> Arm:
        reps = rb.replica_entries(what, limits)
        arm = rb.router_arm(data, reps, limits)
        reader = rb.MetricsReader(data.router.metrics_url if data.router else None, [r["url"] for r in reps],
                                  rb.metrics_limits(limits))
        split = rb.LevelSplit(reader, [{"index": r["index"], "url": r["url"]} for r in reps])
        arm.level_observer = split
        made.update(arm=arm, reader=reader, split=split)
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
                result.router = rb.router_section(data, arm, made["split"], made["reader"],
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
