"""One arm of `sparkctl bench`: the workload options, building an arm (an endpoint or a deployment record), and
measuring it section by section (cold, decode, acceptance, TTFT, concurrency, G6 captures).

`sparkctl.bench.run` puts arms together into a run and writes the card.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from sparkctl.bench import losslessness, measure, ttft
from sparkctl.bench.logsource import FileLog, LogSource, RuntimeLog, capacity_from_log, scheduler_summary
from sparkctl.bench.prompts import decode_prompts, g6_prompts
from sparkctl.bench.target import Arm, check_reachable
from sparkctl.config.loader import did_you_mean
from sparkctl.engines.card import acceptance_from, counters_source, engine_of_endpoint, log_source, not_reported
from sparkctl.engines.card import capacity_from_log as engine_capacity_from_log
from sparkctl.errors import ConfigError, SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.client import Limits, SGLangClient
from sparkctl.state.records import DeploymentRecord
from sparkctl.state.runs import AcceptanceResult, ArmResults, ColdResult, DecodeResult, GateFailure

if TYPE_CHECKING:
    from sparkctl.deploy.commands import Deployer

log = logging.getLogger("sparkctl.bench")

GATES = ("cold", "decode", "acceptance", "ttft", "concurrency", "g6")
Progress = Callable[[str], None]
T = TypeVar("T")


def parse_gates(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"decode,g6"`` -> ("decode", "g6"); ``all`` or None -> every gate. Unknown names: ConfigError."""
    if text is None:
        return GATES
    items = [g.strip().lower() for g in (text.split(",") if isinstance(text, str) else text) if g.strip()]
    if items == ["all"]:
        return GATES
    bad = [g for g in items if g not in GATES]
    if bad:
        hints = [f"{b} -> {did_you_mean(b, list(GATES))}" for b in bad if did_you_mean(b, list(GATES))]
        raise ConfigError(f"unknown gate(s): {', '.join(bad)}", where="--gates",
                          hint=(f"did you mean {', '.join(hints)}? " if hints else "") + f"gates: {', '.join(GATES)}")
    return tuple(g for g in GATES if g in items)


@dataclass
class BenchOptions:
    """The workload. Defaults are the seed card's protocol (800 tokens, n=5, 2 x 800 warm-up, 20 G6 prompts)."""

    gates: tuple[str, ...] = GATES
    runs: int = 5
    max_tokens: int = 800
    classes: tuple[str, ...] = ("code", "prose")
    warmup: int = 2
    warmup_max_tokens: int | None = None          # None: max_tokens
    acceptance_runs: int = 3
    ttft_sizes: tuple[int, ...] = (4096, 16384, 65536)
    ttft_runs: int = 3                             # per size, and for the cached repeat
    ttft_max_tokens: int = 8
    concurrency: tuple[int, ...] = (1, 2)
    router_concurrency: tuple[int, ...] = (1, 2, 4, 8)   # through the router of a replicated deployment
    g6_max_tokens: int | None = None               # None: max_tokens
    g6_limit: int | None = None                    # use only the first N G6 prompts (tests); None = all 20
    reference: list[str] = field(default_factory=list)   # lines for the reference-comparison slot
    out_dir: Path | None = None                    # a directory the user named (--out): written as given
    overwrite: bool = False                        # --force: replace a card already in out_dir
    timeout_s: float = 900.0

    def as_dict(self) -> JSONObject:
        d = asdict(self)
        d["out_dir"] = str(self.out_dir) if self.out_dir else None
        return d


def _noop(_: str) -> None:
    pass


# --------------------------------------------------------------------------- arms

def arm_from_endpoint(url: str, *, api_key: str | None = None, log_path: Path | None = None,
                      timeout_s: float | Limits = 900.0) -> Arm:
    url = url.rstrip("/")
    client = SGLangClient(url, api_key=api_key, timeout=timeout_s)
    arm = Arm(name=url, client=client, endpoint=url, log=FileLog(log_path) if log_path else None,
              api_key=api_key, timeout_s=timeout_s)
    check_reachable(arm)
    arm.refresh()
    if not arm.server_info:        # no /server_info: SGLang's card reads it; another engine answers for itself
        arm.engine = engine_of_endpoint(client)
        if not arm.sglang:
            arm.refresh()
    return arm


def arm_from_record(deployer: Deployer, record: DeploymentRecord, *, log_path: Path | None = None,
                    timeout_s: float | Limits | None = None) -> Arm:
    """The arm of a deployment record: its endpoint, its API key (from the env var the profile names),
    rank 0's log through the runtime (or ``log_path``)."""
    prof = record.profile_data
    key_env = record.api_key_env
    api_key = os.environ.get(key_env) if key_env else None
    timeout = timeout_s or float((prof.get("warmup") or {}).get("timeout_s") or 900)
    src: LogSource | None
    if log_path:
        src = FileLog(log_path)
    else:
        h0 = record.handle_of(0)
        src = RuntimeLog(deployer.runtimes(record.id).for_node(h0.node), h0) if h0 else None
    endpoint = record.endpoint.rstrip("/")
    arm = Arm(name=record.profile or record.id, client=SGLangClient(endpoint, api_key=api_key, timeout=timeout),
              endpoint=endpoint, model=(prof.get("model") or {}).get("served_name"), log=src, record=record,
              api_key=api_key, timeout_s=timeout, engine=record.engine)
    check_reachable(arm)
    arm.refresh()
    return arm


# --------------------------------------------------------------------------- one arm

def _gate(name: str, fn: Callable[[], T], progress: Progress) -> T | GateFailure:
    """Run one measurement; a known failure is recorded under the gate and the bench goes on."""
    try:
        return fn()
    except SparkctlError as exc:
        progress(f"{name}: FAILED: {exc.message}")
        return GateFailure(error=exc.render())


def measure_arm(arm: Arm, opts: BenchOptions, run_tag: str, *, primary: bool, g6: bool,
                progress: Progress = _noop) -> tuple[ArmResults, list[losslessness.Capture] | None]:
    """Every selected measurement on one arm (TTFT and concurrency on the primary arm only)."""
    gates = set(opts.gates)
    prompts = {c: p for c, p in decode_prompts().items() if c in opts.classes}
    code = decode_prompts()["code"]
    results = ArmResults()

    def say(m: str) -> None:
        progress(f"[{arm.role} {arm.name}] {m}")

    if arm.log is not None:
        results.boot_log_capacity = (capacity_from_log(arm.log.whole()) if arm.sglang else
                                     engine_capacity_from_log(arm.engine, arm.log.whole())) or None
    if "cold" in gates:
        results.cold = _gate("cold", lambda: ColdResult(
            first_request=measure.first_request(arm, code, opts.warmup_max_tokens or opts.max_tokens),
            at_boot=arm.record.warmup.cold if arm.record and arm.record.warmup else None,
            note="excluded from every median; the first request of this bench is cold only if nothing ran "
                 "since boot (a deployment's own warm-up at boot is reported as at_boot)"), say)
        cold = results.cold.first_request.latency_s if isinstance(results.cold, ColdResult) else None
        say(f"first request: {cold} s")
    needs_decode = gates & {"decode", "acceptance"}
    if needs_decode and opts.warmup:
        results.warmup = _gate("warmup", lambda: measure.warm_up(arm, code, opts.warmup, opts.warmup_max_tokens
                                                                  or opts.max_tokens), say)
    if needs_decode:
        wanted = prompts if "decode" in gates else {"code": code}
        results.decode = _gate("decode", lambda: measure.measure_decode(arm, wanted, runs=opts.runs,
                                                                         max_tokens=opts.max_tokens, progress=say),
                               say)
    if "acceptance" in gates:
        results.acceptance = _acceptance(arm, results.decode, opts, say)
    if "ttft" in gates and primary:
        results.ttft = _gate("ttft", lambda: ttft.measure_ttft(arm, opts.ttft_sizes, runs=opts.ttft_runs,
                                                                   run_tag=run_tag, max_tokens=opts.ttft_max_tokens,
                                                                   progress=say), say)
    if "concurrency" in gates and primary:
        results.concurrency = _gate("concurrency", lambda: measure.measure_concurrency(
            arm, code, opts.concurrency, max_tokens=opts.max_tokens, progress=say), say)
    captures = None
    if "g6" in gates and g6:
        plist = g6_prompts()[: opts.g6_limit] if opts.g6_limit else g6_prompts()
        captures = losslessness.run_g6_arm(arm.client, plist, max_tokens=opts.g6_max_tokens or opts.max_tokens,
                                           model=arm.model, progress=say)
    return results, captures


def _acceptance(arm: Arm, decode: DecodeResult | GateFailure | None, opts: BenchOptions,
                say: Progress) -> AcceptanceResult:
    out = AcceptanceResult(speculative_algorithm=arm.speculative_algorithm, draft_tokens=arm.draft_tokens,
                           sglang_version=arm.version)
    if not arm.speculative:
        out.status = "no speculative decoding on this arm"
        return out
    if not arm.sglang:
        return _engine_acceptance(arm, decode, out, say)
    code = decode.classes.get("code") if isinstance(decode, DecodeResult) else None
    if code is not None and "scheduler_log" in code.model_fields_set:
        d = code.scheduler_log["decode"]
        out.log = {"source": "scheduler decode-batch log, during active code decode",
                      "log": arm.log.label if arm.log else None, "accept_len": d["accept_len"],
                      "accept_rate": d["accept_rate"], "active_batches": d["active_batches"],
                      "gauge_peak_gen_throughput": d["peak_gen_throughput"], "dialects": d["dialects"]}
        if not d["accept_len"]:
            out.log["note"] = "no Decode batch line with accept len during the code runs"
            if isinstance(arm.log, FileLog):
                # a capture that did not grow during the run: analyse all of it, and say so
                whole = scheduler_summary(arm.log.whole())["decode"]
                if whole["accept_len"]:
                    out.log_whole_file = {
                        "source": "scheduler decode-batch log, lines with #running-req >= 1",
                        "scope": "whole captured log (not windowed to a run of this bench)",
                        "log": arm.log.label, "accept_len": whole["accept_len"],
                        "accept_rate": whole["accept_rate"], "active_batches": whole["active_batches"],
                        "gauge_peak_gen_throughput": whole["peak_gen_throughput"]}
    else:
        out.log = {"note": "no scheduler log available for this arm (use --log FILE)"}
    out.generate = measure.acceptance_from_generate(arm, decode_prompts()["code"], runs=opts.acceptance_runs,
                                                    max_tokens=opts.max_tokens)
    generated = (out.generate.accept_len or {}).get("median")
    say(f"acceptance: log {out.log.get('accept_len')}, /generate {generated}")
    return out


def _engine_acceptance(arm: Arm, decode: DecodeResult | GateFailure | None, out: AcceptanceResult,
                       say: Progress) -> AcceptanceResult:
    """Acceptance on an engine other than SGLang: its own counters' deltas around the code runs (its definitions)
    and the acceptance lines it logged during them; no per-request figure (no /generate), with the reason."""
    out.engine = arm.engine
    out.not_reported = not_reported(arm.engine).get("per_request_acceptance", "")
    code = decode.classes.get("code") if isinstance(decode, DecodeResult) else None
    deltas = code.engine_counters if code is not None else {}
    if deltas:
        out.counters = {"source": counters_source(arm.engine), **acceptance_from(arm.engine, deltas)}
        if not deltas.get("spec_drafts"):
            out.counters["note"] = "no drafts counted during the code runs"
    else:
        out.counters = {"note": "the engine's /metrics did not answer around the code runs (or no code runs)"}
    if code is not None and arm.log is not None:
        out.engine_log = {"source": log_source(arm.engine), "log": arm.log.label, **code.engine_log}
        if not code.engine_log.get("spec_lines"):
            out.engine_log["note"] = "no acceptance line logged during the code runs (the engine logs every 10 s)"
    else:
        out.engine_log = {"note": "no engine log available for this arm (use --log FILE)"}
    say(f"acceptance: /metrics mean length {out.counters.get('mean_acceptance_length')}, log "
        f"{out.engine_log.get('accept_len')}")
    return out
