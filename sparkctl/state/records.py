"""Typed ledger records: one deployment (`up` / `rollback`); a bench run's (`RunRecord`) is state/runs.py's.

The ledger reads and writes these, never loose dicts: a file of the wrong shape is a LedgerError naming the
file, not a deployment that silently lacks fields. Statuses share one vocabulary (`Status`); whether a deployment
is known-good is derived from its status, never stored apart from it.

Extending a record: add a field with a default (old files stay readable). Crash recovery, for example, adds a
list of engine intents beside `handles` (which engine is about to start where, with its label or PID and the
controller's PID), each an entry of its own model like the handles.
"""
from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    computed_field,
    model_serializer,
    model_validator,
)

from sparkctl.config.profile import Profile
from sparkctl.jsontypes import JSONObject, renamed_keys
from sparkctl.nodes.handles import Handle
from sparkctl.sglang.launch import RankSpec
from sparkctl.untrusted import clean, is_plain_name


def _record_name(value: str) -> str:
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
    INTERRUPTED = "interrupted"    # its controller died mid-way (SIGKILL, power loss); settled by the next command
    RECOVERED = "recovered"        # rebuilt by `sparkctl repair` from engines found running; never verified by gates


DeploymentStatus = Status
KNOWN_GOOD = frozenset({Status.SUCCESSFUL, Status.SUPERSEDED, Status.STOPPED})


class _Record(BaseModel):
    # extra="allow": keys written by a newer sparkctl survive a load/save round trip instead of being dropped.
    model_config = ConfigDict(extra="allow", validate_assignment=True)
    # Keys renamed since this part of a record was first written: old name -> new name. A record written before a
    # rename loads under the new name and is written back with it (tests/unit/test_records.py loads records written
    # by the code before each rename: tests/lifecycle/fixtures/).
    RENAMED: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        return renamed_keys(data, cls.RENAMED) if cls.RENAMED and isinstance(data, dict) else data


class GateResult(_Record):
    """One verify gate: health, models, settings, capacity, workers, smoke."""

    name: str
    ok: bool
    evidence: str = ""


class Severity(StrEnum):
    OK = "ok"
    WARN = "warning"      # passes, but worth reading (a test node without nvidia-smi, a small MTU)
    FAIL = "failed"       # blocks the deployment


class CheckResult(_Record):
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


class Capacity(_Record):
    """What rank 0's engine resolved at boot (its capacity line)."""

    max_total_num_tokens: int | None = None
    max_running_requests: int | None = None
    context_len: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    available_gpu_mem: float | None = None


class WarmupRequest(_Record):
    elapsed_s: float
    completion_tokens: int | None = None
    finish_reason: str | None = None


class Warmup(_Record):
    cold: WarmupRequest | None = None        # the first request, timed apart
    warm: list[WarmupRequest] = Field(default_factory=list)
    max_tokens: int | None = None


class NodeImages(_Record):
    """The images one node's rank runs: the engine image and (pipeline) the launch image, tag and ID."""

    engine_tag: str | None = None
    engine_id: str | None = None
    launch_tag: str | None = None
    launch_id: str | None = None


class StepEntry(_Record):
    name: str
    started: str
    status: str = "running"          # running | ok | failed
    elapsed_s: float | None = None
    error: str | None = None


class Failure(_Record):
    RENAMED: ClassVar[dict[str, str]] = {"stage": "step"}     # 2026-12

    step: str
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


class SecretPrints(_Record):
    """Fingerprints of the secret values a deployment was made with, so that an unattended restart can tell a value
    changed since (a rotated API key) without the value ever being stored: `prints` maps each secret variable
    (api.api_key_env, api.hf_token_env) set at deploy time to HMAC-SHA256(`key`, value), `key` being random and this
    deployment's own (the record is 0600; neither is ever printed). Made by deploy/inputs.py."""

    key: str
    prints: dict[str, str] = Field(default_factory=dict)


class NodePath(_Record):
    """A path on a node that a deployment's launch needs and that was there when it deployed (the model, the
    drafter, any other file or directory its argv names under the models mount, the mount itself): checked again
    before an unattended restart (deploy/inputs.py)."""

    node: str
    what: str                 # "model", "drafter", "--chat-template", "models mount"
    path: str                 # as the engine sees it (/models/...)
    host: str                 # where it is on the node


# A deployment record's renamed keys (`_Record.RENAMED`).
RENAMED_KEYS = {
    "kind": "command",          # 2026-12: `kind` meant a command here, a runtime, a router and a handle elsewhere
    "reconciled": "settled",    # 2026-12: settling what a dead controller left is not controller-runtime's reconcile
    "stages": "steps",          # 2026-12: one name for the plan's steps, as planned, journaled and run
}


class RecordHandles(BaseModel):
    """A deployment record read for its engines' handles alone: what a look for leftover processes asks of every
    record in the history (`Ledger.handles`). The rest of the record is neither validated nor kept, so that look
    costs a JSON read per record, not a whole record's validation."""

    model_config = ConfigDict(extra="ignore")
    handles: list[Handle] = Field(default_factory=list)


class DeploymentRecord(_Record):
    """One `up`, `rollback` or bench-driven deployment, from plan to hand-off (or failure and restore)."""

    RENAMED: ClassVar[dict[str, str]] = RENAMED_KEYS

    id: RecordName
    command: str = "up"                 # what made it: up, rollback, repair, bench-compare, bench-restore
    profile: RecordName
    profile_data: JSONObject
    inventory: str | None = None
    cluster: str
    emulated: bool = False
    identity: str
    sglang_version: str | None = None     # the engine's release (the name is from when SGLang was the only engine)
    engine: str = "sglang"                # the profile's engine: sglang | vllm
    specs: list[RankSpec] = Field(default_factory=list)             # LaunchSpec.redacted() per rank
    warnings: list[str] = Field(default_factory=list)
    status: Status = Status.RUNNING
    created: str
    updated: str | None = None
    steps: list[StepEntry] = Field(default_factory=list)
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
    settled: str | None = None                # what a later command did with what a dead controller left
    secrets: SecretPrints | None = None       # fingerprints of the secret values deployed with (never a value)
    needed: list[NodePath] = Field(default_factory=list)   # node paths the launch needs, present at deploy time

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

    def deployed_profile(self) -> Profile:
        """The profile as this deployment ran it (`profile_data`, validated again), never the file as it is now:
        what a rollback, a restore or a watcher's restart deploys."""
        return Profile.model_validate(self.profile_data)

    @property
    def api_key_env(self) -> str | None:
        """The environment variable holding the API key, as the recorded profile names it."""
        return (self.profile_data.get("api") or {}).get("api_key_env")

    def as_json(self) -> JSONObject:
        return self.model_dump(mode="json", exclude_none=False)


# --------------------------------------------------------------------------- the card's measurements

class KeysAsWritten(BaseModel):
    """A model of a JSON file section that dumps the keys it was given or set, in their order, and no others.

    A field without a default is a key always written (null when there is no value); a field with a default is a
    key written only when it was set (a scheduler log window, a cached-repeat size, a failed size's note). So the
    JSON keeps the shape the files already have: old files load, and load/dump gives the same file back.
    """

    # extra="allow": keys written by a newer sparkctl survive a load/save round trip instead of being dropped.
    model_config = ConfigDict(extra="allow")

    @model_serializer(mode="wrap")
    def _set_keys_only(self, handler: SerializerFunctionWrapHandler) -> JSONObject:
        data: JSONObject = handler(self)
        fields = type(self).model_fields
        keep = set(self.model_extra or {})
        for name in self.model_fields_set:
            keep.update(k for k in (name, fields[name].alias if name in fields else None) if k)
        return {k: v for k, v in data.items() if k in keep}


class ReplicaEntry(_Record):
    index: int = Field(ge=0, le=255)
    url: str = Field(pattern=r"^https?://[^\s/]+$")
    nodes: list[str] = Field(min_length=1)
    # The replica's own ledger and lock: <state root>/<cluster>. A plain cluster name plus `.r<i>`, so a damaged
    # record can never point a ledger outside the state root (no '/', no '..').
    cluster: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}(\.r[0-9]{1,3})?$")


class CompareMarker(_Record):
    """``compare.json``: a `bench --compare` (or tune) in progress, what its restore brings back (`original`, the
    deployment active when it began) and who runs it (deploy/compare.py writes and reads it; repair checks it)."""

    original: RecordName | None = None
    arm: RecordName | None = None
    since: str
    controller: Controller


class RouterEntry(_Record):
    """Where the router serves; the rest (pid and start time, or a container) is its runtime's, kept as extra keys
    and checked by that runtime when it finds the router again (sparkctl.router.process.RouterProcess.from_dict)."""

    url: str = Field(pattern=r"^https?://[^\s/]+$")
    metrics_url: str | None = Field(None, pattern=r"^https?://[^\s/]+/metrics$")
    runtime: Literal["process", "container"] | None = None
    kind: Literal["process", "container"] | None = None     # `runtime`'s name until 2026-12: read, not written

    @property
    def runs_as(self) -> str:
        """How it runs (`router.launch.recorded_runtime` of the dict): a record from before either was kept is a
        process."""
        return self.runtime or self.kind or "process"

    @model_serializer(mode="wrap")
    def _names_written(self, handler: SerializerFunctionWrapHandler) -> JSONObject:
        """Each of the two names only when the record has it (an old record saved again keeps its keys)."""
        data: JSONObject = handler(self)
        return {k: v for k, v in data.items() if k not in ("runtime", "kind") or v is not None}


class ReplicatedRecord(_Record):
    """The parent cluster's `replicated.json`: K replicas behind SGLang's router (deploy/replicated.py). Read and
    written only through this model, so a file of the wrong shape is a LedgerError, not a KeyError mid-`down`."""

    profile: RecordName | None = None
    profile_data: JSONObject | None = None   # the profile as deployed (what the watcher restarts, never the file)
    endpoint: str | None = None
    status: str | None = None          # updating | active | failed | down
    started: str | None = None
    handed_off: str | None = None
    replicas: list[ReplicaEntry] = Field(default_factory=list)
    router: RouterEntry | None = None
    journal: list[JournalEntry] = Field(default_factory=list)   # the single group's journal model
    controller: Controller | None = None   # the `up` that set status "updating" (alive: in progress; gone: interrupted)
