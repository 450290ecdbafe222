"""One `sparkctl bench` run's record (`RunRecord`, the run's `report.json`) and the card's measured sections as
models: each arm's measurements (`ArmResults`: cold start, warm-up, decode, acceptance, TTFT, concurrency) and, for
a replicated deployment, the bench through the router (`RouterBench`, split per replica).

The ledger reads and writes these (`state.ledger`), the bench builds them (`bench/`); the parts every record shares
(`Status`, `RecordName`, the renames, `KeysAsWritten`) are in `state.records`.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sparkctl.jsontypes import JSONObject
from sparkctl.state.records import KeysAsWritten, RecordName, Status, WarmupRequest, _Record


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReplicaShare(_Section):
    """One replica's part of one concurrency level through the router."""
    index: int
    url: str
    requests: float | None = Field(None, description="Requests the router sent it during the level (delta of "
                                   "smg_worker_cb_outcomes_total, every outcome); null when unreadable.")
    share: float | None = Field(None, description="requests / the level's requests the router counted.")
    tokens: float | None = Field(None, description="Generated tokens it reported during the level (delta of its own "
                                 "/metrics sglang:generation_tokens_total); null when unreadable.")
    token_share: float | None = None


class RouterLevel(_Section):
    """One concurrency level measured through the router, with its per-replica split."""
    concurrency: int
    aggregate_tok_s: float | None = Field(description="The level's aggregate (the concurrency section's figure).")
    requests_sent: int = Field(description="Requests the bench sent in this level.")
    requests_counted: float | None = Field(None, description="Sum of the replicas' request deltas.")
    split: str = Field(description="measured | unavailable")
    split_note: str | None = None
    replicas: list[ReplicaShare] = Field(default_factory=list)
    single_pair_tok_s: float | None = Field(None, description="The single pair's measured aggregate at this "
                                            "concurrency (single_pair's card); null when none was measured.")
    vs_single_pair: float | None = None


class SinglePairCard(_Section):
    """The card the single pair's figures come from: the latest single-group card of the same model."""
    run_id: str
    started: str | None
    profile: str | None
    deployment: str | None
    emulated: bool
    path: str | None
    aggregate_tok_s: dict[str, float] = Field(description="Measured aggregate tok/s by concurrency (\"c1\": ...).")


class RouterReplica(_Section):
    index: int
    url: str
    nodes: list[str]
    cluster: str | None
    deployment: str | None
    max_running_requests: int | None
    max_running_requests_source: str


class RouterBench(_Section):
    """`sparkctl bench` of a replicated deployment: measured through the router, split per replica."""
    url: str
    metrics_url: str | None
    profile: str | None
    model: str | None
    emulated: bool
    replicas: list[RouterReplica]
    requests_source: str
    tokens_source: str | None
    levels: list[RouterLevel] = Field(default_factory=list)
    single_pair: SinglePairCard | None = None
    single_pair_note: str
    metrics_error: str | None = Field(None, description="Why the router's metrics could not be read (the split "
                                      "is unavailable from then on).")
    tokens_error: str | None = None
    metrics_read_s: float | None = Field(None, description="Seconds the run spent reading the router's and the "
                                         "replicas' metrics (outside every timed window).")


# --------------------------------------------------------------------------- the card's measurements

class _Measured(KeysAsWritten):
    """A measured part of a bench card, as the measure functions build it and ``report.json`` holds it.

    Statistics summaries (`sparkctl.bench.stats.Summary.as_dict`), the scheduler-log summary and the token
    calibration stay JSON objects: they are the card's own JSON, each written by one function.
    """


class GateFailure(_Measured):
    """A gate that failed with a known error: the card shows it in its section and the bench goes on."""
    error: str


class RequestRun(_Measured):
    """One streamed request as recorded: tokens, timings, rates (rounded for the record)."""
    prompt: str = Field("", description="The prompt's id (cold and warm-up requests only).")
    max_tokens: int = Field(0, description="Its max_tokens (the cold request only).")
    completion_tokens: int | None
    prompt_tokens: int | None
    reasoning_tokens: int | None
    cached_tokens: int | None
    finish_reason: str | None
    ttft_s: float | None
    latency_s: float
    decode_s: float | None
    decode_tok_s: float | None = Field(description="(completion_tokens - 1) / (t_last_token - t_first_token).")
    e2e_tok_s: float | None
    usage_missing: bool
    prefill_tok_s: float | None = Field(None, description="prompt_tokens / ttft_s (TTFT runs only).")
    log_prefill_new_tokens: int | None = Field(None, description="Scheduler log, during a TTFT run.")
    log_prefill_cached_tokens: int | None = Field(None, description="Scheduler log, during a TTFT run.")


class DecodeClass(_Measured):
    """One prompt class of the decode section: its runs and their median (min-max)."""
    prompt: str
    title: str
    runs: list[RequestRun]
    decode_tok_s: JSONObject | None = Field(description="Summary of the runs' decode tok/s; null: not measured.")
    note: str | None
    e2e_tok_s: JSONObject | None
    scheduler_log: JSONObject = Field(default_factory=dict, description="The scheduler log window of the class "
                                      "(acceptance ranges, gauge peak); only with a log.")
    engine_counters: JSONObject = Field(default_factory=dict, description="An engine other than SGLang: its "
                                        "/metrics counters' deltas around the class's runs (sparkctl.engines.card).")
    engine_log: JSONObject = Field(default_factory=dict, description="An engine other than SGLang: what it logged "
                                   "during the class's runs (its periodic lines); only with a log.")


class DecodeResult(_Measured):
    max_tokens: int
    runs: int
    temperature: int
    stream: bool
    formula: str
    classes: dict[str, DecodeClass]


class GenerateAcceptance(_Measured):
    """Per-request accept length from native ``/generate`` ``meta_info``."""
    source: str
    prompt: str
    status: str = Field("", description="\"unavailable\" when the endpoint has no /generate.")
    per_request: list[float | None]
    accept_len: JSONObject | None
    meta: list[JSONObject]
    error: str | None
    note: str | None


class AcceptanceResult(_Measured):
    speculative_algorithm: str | None
    draft_tokens: int | None
    sglang_version: str | None
    status: str = Field("", description="Set when the arm has no speculative decoding.")
    log: JSONObject = Field(default_factory=dict, description="Acceptance from the scheduler log (or why none).")
    log_whole_file: JSONObject = Field(default_factory=dict, description="A static capture analysed whole.")
    generate: GenerateAcceptance | None = None
    engine: str = Field("", description="Set for an engine other than SGLang (its acceptance is `counters` and "
                        "`engine_log`, not /generate and the scheduler log).")
    counters: JSONObject = Field(default_factory=dict, description="The engine's /metrics counters' deltas around "
                                 "the code runs, and its acceptance figures from them.")
    engine_log: JSONObject = Field(default_factory=dict, description="The engine's own acceptance log lines during "
                                   "the code runs.")
    not_reported: str = Field("", description="Why there is no per-request figure on this engine.")

    def accept_len(self) -> float | None:
        """The arm's one acceptance-length figure (None when not measured): SGLang's median per-request accept
        length from /generate; another engine's mean acceptance length from its counters around the code runs
        (vLLM: 1 + accepted / drafts, its own definition)."""
        if self.engine:
            value = self.counters.get("mean_acceptance_length")
        else:
            value = ((self.generate.accept_len if self.generate else None) or {}).get("median")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class TTFTSize(_Measured):
    """One target prompt size: measured, failed or unmeasurable at the window."""
    target_tokens: int
    status: str = ""
    note: str | None = None
    runs: list[RequestRun] = Field(default_factory=list)
    ttft_s: JSONObject | None = None
    prefill_tok_s: JSONObject | None = None
    prompt_tokens: list[int | None] = Field(default_factory=list)
    # per run, how its prompt was fitted to the label (sparkctl.bench.prompts.PromptFit.as_dict); absent on old cards
    fit: list[JSONObject] = Field(default_factory=list)
    redraws: list[int] = Field(default_factory=list, description="Per run, how often its filler was drawn again "
                               "because the answer showed no text within max_tokens (absent on old cards).")
    engine_cached_tokens: int | None = Field(None, description="Another engine than SGLang: prompt tokens it counted "
                                             "as prefix-cache hits over these runs (its /metrics counter's delta, "
                                             "read before and after the batch).")


class CachedRepeat(_Measured):
    """The radix-cached repeat of the first measured size, with how it was recognised."""
    runs: list[RequestRun]
    ttft_s: JSONObject | None
    radix_cached: bool
    basis: str
    target_tokens: int | None
    engine_cached_tokens: int | None = Field(None, description="Another engine than SGLang: prefix-cache hit tokens "
                                             "it counted over the repeats (its /metrics counter's delta).")


class TTFTResult(_Measured):
    context_length: int | None
    calibration: JSONObject
    stream: bool
    clock: str
    max_tokens: int
    sizes: list[TTFTSize]
    cached_repeat: CachedRepeat | None
    cached_repeat_of: int | None = None


class Serialization(_Measured):
    serialized: bool
    evidence: list[str]
    checked: list[str]
    reason: str | None = None
    reason_source: str | None = None
    fix: str | None = None


class ConcurrencyLevel(_Measured):
    """c identical requests started together."""
    concurrency: int
    requests: list[RequestRun]
    errors: list[str] | None
    total_completion_tokens: int = 0
    wall_s: float = 0.0
    aggregate_tok_s: float | None = None
    max_streams_decoding_at_once: int | None = None
    log_max_running_req: int | None = None
    log_decode_batches: int | None = None
    serialization: Serialization | None = None
    vs_c1: float | None = None


class ConcurrencyResult(_Measured):
    prompt: str
    max_tokens: int
    max_running_requests: int | None
    max_running_requests_source: str
    cap_reason: JSONObject | None
    formula: str
    levels: list[ConcurrencyLevel]


class ColdResult(_Measured):
    first_request: RequestRun
    at_boot: WarmupRequest | None
    note: str


class ArmResults(_Measured):
    """Every selected measurement of one arm; a gate that failed holds its error instead."""
    boot_log_capacity: JSONObject | None = None
    cold: ColdResult | GateFailure | None = None
    warmup: list[RequestRun] | GateFailure | None = None
    decode: DecodeResult | GateFailure | None = None
    acceptance: AcceptanceResult | None = None
    ttft: TTFTResult | GateFailure | None = None
    concurrency: ConcurrencyResult | GateFailure | None = None


class ArmEntry(_Measured):
    """One arm of a run: its configuration (JSON, as recorded) and its results."""
    config: JSONObject
    results: ArmResults


class RunRecord(_Record):
    """One `sparkctl bench` run: what was measured (arms, comparison, G6) and how it ended.

    Each arm's measurements are models (`ArmResults`); the comparison and G6 sections are still JSON objects. The
    card (report.md) is rendered from this record's JSON, after the run's secrets are masked in it.
    """

    schema_: str = Field(alias="schema")
    run_id: RecordName
    mode: str                                   # deployment | replicated | endpoint | log-only
    status: Status = Status.RUNNING
    started: str
    finished: str | None = None
    options: JSONObject = Field(default_factory=dict)
    prompt_set: str | None = None
    arms: list[ArmEntry] = Field(default_factory=list)
    comparison: JSONObject = Field(default_factory=dict)
    g6: JSONObject | None = None
    reference: list[str] = Field(default_factory=list)
    emulated: bool = False
    errors: list[str] = Field(default_factory=list)
    deployment: str | None = None
    compare_deployment: JSONObject | None = None
    restore: JSONObject | None = None
    log_only: JSONObject | None = None
    files: dict[str, str] = Field(default_factory=dict)
    router: RouterBench | None = Field(None, description="A replicated deployment: the run went through the "
                                       "router; aggregate per concurrency level, per-replica split, the single "
                                       "pair's figures beside them.")

    model_config = ConfigDict(extra="allow", validate_assignment=True, populate_by_name=True)

    def as_json(self) -> JSONObject:
        return self.model_dump(mode="json", by_alias=True, exclude_none=False)
