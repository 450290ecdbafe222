"""Typed ledger records: one deployment (`up` / `rollback`) and one bench run.

The ledger reads and writes these, never loose dicts: a file of the wrong shape is a LedgerError naming the
file, not a deployment that silently lacks fields. Statuses share one vocabulary (`Status`); whether a deployment
is known-good is derived from its status, never stored apart from it.

Extending a record: add a field with a default (old files stay readable). Crash recovery, for example, adds a
list of engine intents beside `handles` (which engine is about to start where, with its label or PID and the
controller's PID), each an entry of its own model like the handles.
"""
from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, computed_field, model_validator

from sparkctl.jsontypes import JSONObject
from sparkctl.nodes.handles import Handle


def _record_name(value: str) -> str:
    from sparkctl.untrusted import clean, is_plain_name
    if not is_plain_name(value):
        raise ValueError(f"{clean(repr(value), 80)} is not a plain name (letters, digits, '.', '-', '_'; never a path)")
    return value


# A name read back from a record (a deployment id, a profile, a run id): a name, never a path or a terminal
# sequence, validated like a profile's own name (a file changed by hand is a LedgerError naming it, exit 6).
RecordName = Annotated[str, AfterValidator(_record_name)]


class Status(StrEnum):
    """Where a deployment or a bench run stands. A bench run ends successful, failed or canceled."""

    RUNNING = "running"
    SUCCESSFUL = "successful"
    FAILED = "failed"
    CANCELED = "canceled"          # Ctrl-C
    SUPERSEDED = "superseded"      # a newer deployment took over; stopped but restartable
    STOPPED = "stopped"            # `sparkctl down`
    INTERRUPTED = "interrupted"    # its controller died mid-way (SIGKILL, power loss); found and settled by reconcile
    RECOVERED = "recovered"        # rebuilt by `sparkctl repair` from engines found running; never verified by gates


DeploymentStatus = Status
KNOWN_GOOD = frozenset({Status.SUCCESSFUL, Status.SUPERSEDED, Status.STOPPED})


class _Record(BaseModel):
    # extra="allow": keys written by a newer sparkctl survive a load/save round trip instead of being dropped.
    model_config = ConfigDict(extra="allow", validate_assignment=True)


class _View(_Record):
    """A typed part of a record that callers written for the dict form can still read (`x["k"]`, `x.get("k")`)."""

    def get(self, key: str, default: object = None) -> Any:
        if key in type(self).model_fields:
            value = getattr(self, key)
            return default if value is None else value
        return (self.model_extra or {}).get(key, default)

    def __getitem__(self, key: str) -> Any:
        if key in type(self).model_fields:
            return getattr(self, key)
        extra = self.model_extra or {}
        if key in extra:
            return extra[key]
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and (key in type(self).model_fields or key in (self.model_extra or {}))


class GateResult(_View):
    """One verify gate: health, models, settings, capacity, workers, smoke."""

    name: str
    ok: bool
    evidence: str = ""


class Severity(StrEnum):
    OK = "ok"
    WARN = "warning"      # passes, but worth reading (a test node without nvidia-smi, a small MTU)
    FAIL = "failed"       # blocks the deployment


class CheckResult(_View):
    """One preflight check on one node: what was checked, what was seen, what to do. The one model of a check:
    what preflight returns is what the record keeps. `ok` is False only for a failure (a warning passes)."""

    node: str
    name: str
    ok: bool = True
    severity: Severity = Severity.OK
    seen: str = ""
    fix: str = ""

    @classmethod
    def passing(cls, node: str, name: str, seen: str) -> CheckResult:
        return cls(node=node, name=name, ok=True, severity=Severity.OK, seen=seen)

    @classmethod
    def warning(cls, node: str, name: str, seen: str, fix: str = "") -> CheckResult:
        return cls(node=node, name=name, ok=True, severity=Severity.WARN, seen=seen, fix=fix)

    @classmethod
    def failing(cls, node: str, name: str, seen: str, fix: str) -> CheckResult:
        return cls(node=node, name=name, ok=False, severity=Severity.FAIL, seen=seen, fix=fix)

    @property
    def line(self) -> str:
        """`name: seen`, with `warning:` before a warning's text."""
        return f"{self.name}: " + ("warning: " if self.severity is Severity.WARN else "") + self.seen

    def as_dict(self) -> JSONObject:
        return self.model_dump(mode="json")


class RankSpec(_View):
    """One rank's launch as recorded: secrets redacted (`LaunchSpec.redacted`)."""

    rank: int
    node: str
    argv: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    sglang_version: str | None = None
    api_host: str | None = None
    api_port: int | None = None
    image: str | None = None
    mounts: list[Any] = Field(default_factory=list)


class Capacity(_View):
    """What rank 0's engine resolved at boot (its capacity line)."""

    max_total_num_tokens: int | None = None
    max_running_requests: int | None = None
    context_len: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    available_gpu_mem: float | None = None


class WarmupRequest(_View):
    elapsed_s: float
    completion_tokens: int | None = None
    finish_reason: str | None = None


class Warmup(_View):
    cold: WarmupRequest | None = None        # the first request, timed apart
    warm: list[WarmupRequest] = Field(default_factory=list)
    max_tokens: int | None = None


class NodeImages(_View):
    """The images one node's rank runs: the engine image and (pipeline) the launch image, tag and ID."""

    engine_tag: str | None = None
    engine_id: str | None = None
    launch_tag: str | None = None
    launch_id: str | None = None


class StageEntry(_Record):
    name: str
    started: str
    status: str = "running"          # running | ok | failed
    elapsed_s: float | None = None
    error: str | None = None


class Failure(_Record):
    stage: str
    message: str
    node: str | None = None


class Controller(_Record):
    """The sparkctl process driving a deployment: a later command tells a dead one from a live one by these."""

    pid: int
    host: str
    start_ticks: int | None = None     # kernel start time of the pid (a recycled pid is not the controller)
    since: str
    command: str = "up"


class Intent(_Record):
    """Written before a rank is started: which engine of which deployment is about to run where."""

    node: str
    rank: int
    deployment: str
    at: str
    engine: str | None = None          # container name (docker) or "pid N" once known (process)


class JournalEntry(_Record):
    """One line of a deployment's journal: before a step's effect what is about to happen and where (`intent`),
    after it what happened (`ok`, `noop` with its reason, `failed` with the error)."""

    step: str
    phase: str                         # intent | ok | noop | failed
    at: str
    what: str = ""
    nodes: list[str] = Field(default_factory=list)
    detail: str | None = None
    replica: int | None = Field(None, ge=0, le=255, description="A replicated `up`'s step for one replica (its "
                                "index); None for a step of the whole (and for every step of a single group).")

    def line(self) -> str:
        where = f" on {', '.join(self.nodes)}" if self.nodes else ""
        return f"{self.at} {self.step} {self.phase}{where}: {self.detail or self.what}"


class RestoreEntry(_Record):
    at: str
    after: str
    gates: list[GateResult] = Field(default_factory=list)


class DeploymentRecord(_Record):
    """One `up`, `rollback` or bench-driven deployment, from plan to hand-off (or failure and restore)."""

    id: RecordName
    kind: str = "up"
    profile: RecordName
    profile_data: JSONObject
    inventory: str | None = None
    cluster: str
    emulated: bool = False
    identity: str
    sglang_version: str | None = None
    specs: list[RankSpec] = Field(default_factory=list)             # LaunchSpec.redacted() per rank
    warnings: list[str] = Field(default_factory=list)
    status: Status = Status.RUNNING
    created: str
    updated: str | None = None
    stages: list[StageEntry] = Field(default_factory=list)
    journal: list[JournalEntry] = Field(default_factory=list)
    preflight: list[CheckResult] = Field(default_factory=list)
    image_ids: dict[str, str] = Field(default_factory=dict)      # node -> ID of the image its rank runs
    images: dict[str, NodeImages] = Field(default_factory=dict)   # node -> engine_tag/_id, launch_tag/_id
    launch_doc: JSONObject | None = None     # the launch image's /etc/sparkctl/launch.json (holds no secret)
    gates: list[GateResult] = Field(default_factory=list)
    previous: RecordName | None = None
    previous_known_good: RecordName | None = None
    handles: list[Handle] = Field(default_factory=list)
    capacity: Capacity | None = None
    warmup: Warmup | None = None
    endpoint: str
    speculative_algorithm: str | None = None
    finished: str | None = None
    elapsed_s: float | None = None
    handed_off: str | None = None
    failure: Failure | None = None
    rollback: str | None = None              # what happened after a failure: "new engines stopped", "skipped ..."
    restored: str | None = None              # the deployment restored after this one failed
    restore_error: str | None = None         # why restoring the previous deployment failed
    superseded_by: str | None = None
    stopped: str | None = None
    engines_removed: str | None = None
    restored_at: str | None = None
    restored_after: str | None = None
    restores: list[RestoreEntry] = Field(default_factory=list)
    controller: Controller | None = None      # who drives it while status is running / a restore is under way
    intents: list[Intent] = Field(default_factory=list)
    restoring: str | None = None              # id of the deployment being restored after this one failed
    reconciled: str | None = None             # what a later command did with what a dead controller left

    @model_validator(mode="before")
    @classmethod
    def _drop_derived(cls, data: object) -> Any:
        if isinstance(data, dict) and "known_good" in data:
            data = {k: v for k, v in data.items() if k != "known_good"}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def known_good(self) -> bool:
        """It served and passed every gate (and was not found broken since): a rollback target."""
        return self.status in KNOWN_GOOD

    def handle_of(self, rank: int) -> Handle | None:
        return next((h for h in self.handles if h.rank == rank), None)

    @property
    def api_key_env(self) -> str | None:
        """The environment variable holding the API key, as the recorded profile names it."""
        return (self.profile_data.get("api") or {}).get("api_key_env")

    def as_json(self) -> JSONObject:
        return self.model_dump(mode="json", exclude_none=False)


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


class RunRecord(_Record):
    """One `sparkctl bench` run: what was measured (arms, comparison, G6) and how it ended.

    The measured sections stay JSON data: the card (report.md) is rendered from this record's JSON.
    """

    schema_: str = Field(alias="schema")
    run_id: RecordName
    mode: str                                   # deployment | replicated | endpoint | log-only
    status: Status = Status.RUNNING
    started: str
    finished: str | None = None
    options: JSONObject = Field(default_factory=dict)
    prompt_set: str | None = None
    arms: list[JSONObject] = Field(default_factory=list)
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


class ReplicaEntry(_Record):
    index: int = Field(ge=0, le=255)
    url: str = Field(pattern=r"^https?://[^\s/]+$")
    nodes: list[str] = Field(min_length=1)
    # The replica's own ledger and lock: <state root>/<cluster>. A plain cluster name plus `.r<i>`, so a damaged
    # record can never point a ledger outside the state root (no '/', no '..').
    cluster: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}(\.r[0-9]{1,3})?$")


class RouterEntry(_Record):
    """Where the router serves; the rest (pid and start time, or a container) is its runtime's, kept as extra keys
    and checked by that runtime when it finds the router again (sparkctl.router.process.RouterProcess.from_dict)."""

    url: str = Field(pattern=r"^https?://[^\s/]+$")
    metrics_url: str | None = Field(None, pattern=r"^https?://[^\s/]+/metrics$")
    kind: Literal["process", "container"] = "process"    # a record from before kinds were kept is a process


class ReplicatedRecord(_Record):
    """The parent cluster's `replicated.json`: K replicas behind SGLang's router (deploy/replicated.py). Read and
    written only through this model, so a file of the wrong shape is a LedgerError, not a KeyError mid-`down`."""

    profile: RecordName | None = None
    endpoint: str | None = None
    status: str | None = None          # updating | active | failed | down
    started: str | None = None
    handed_off: str | None = None
    replicas: list[ReplicaEntry] = Field(default_factory=list)
    router: RouterEntry | None = None
    journal: list[JournalEntry] = Field(default_factory=list)   # the single group's journal model
    controller: Controller | None = None   # the `up` that set status "updating" (alive: in progress; gone: interrupted)
