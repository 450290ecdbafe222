"""A tune's files in the ledger: its journal and the cluster's tune marker, as written and as read back.

``runs/<id>/tune.json`` holds the whole state of one tune (rewritten atomically after every step); ``tune.json``
at the ledger root names the tune in progress, the deployment that ran before it and its controller (pid +
start time). Reading them back is validated here (a damaged file is a LedgerError, exit 6), so `repair` can
check them without importing the tune; settling a tune a kill -9 left is the tune's own (sparkctl/tune/settle.py).
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from sparkctl.errors import ConfigError, LedgerError, SparkctlError
from sparkctl.jsontypes import JSONObject, JSONValue
from sparkctl.state.controller import this_controller
from sparkctl.state.ledger import Ledger, now_iso, read_json
from sparkctl.state.records import Controller, KeysAsWritten, RecordName
from sparkctl.statefiles import write_json_atomic
from sparkctl.untrusted import clean, is_plain_name


class TuneOptions(BaseModel):
    """What a tune searches and how it measures each trial (`sparkctl tune`'s options; the journal's ``options``,
    every key written)."""
    # extra="allow": an option written by a newer sparkctl survives a load/save round trip instead of being dropped.
    model_config = ConfigDict(frozen=True, extra="allow")
    profile: str
    vary: list[str]
    objective: str = "decode"
    budget_s: float | None = None
    trials: int | None = None
    runs: int = 5
    max_tokens: int = 800
    warmup: int = 1
    confirm_rounds: int = 2
    overwrite: bool = False                      # --force: replace a tuned profile file already there
    ttft_sizes: tuple[int, ...] = (4096,)


MARKER = "tune.json"
Progress = Callable[[str], None]


class ObjectiveSummary(KeysAsWritten):
    """The objective's samples of one trial (or one side of the confirmation), summarized."""
    n: StrictInt
    median: float
    min: float
    max: float
    samples: list[float]

    @classmethod
    def of(cls, samples: list[float]) -> ObjectiveSummary | None:
        if not samples:
            return None
        return cls(n=len(samples), median=statistics.median(samples), min=min(samples), max=max(samples),
                   samples=samples)


class G6Sample(KeysAsWritten):
    """A trial's G6 sample verdict (sparkctl/tune/g6.py): the baseline's is the ``reference``; a candidate's is
    ``identical``, ``diverged`` or ``void`` against it, or ``not compared`` when the baseline recorded none."""
    reference: str | None = None
    prompts: list[str] | None = None
    max_tokens: int | None = None
    temperature: int | None = None                # 0: greedy
    n: int | None = None
    identical: int | None = None
    diverged: int | None = None
    void: int | None = None
    verdicts: list[JSONObject] | None = Field(None, description="Per prompt: the losslessness verdict.")
    verdict: str
    detail: str
    elapsed_s: float | None = None


class TuneTrial(KeysAsWritten):
    """One trial of a tune: the baseline (index 0) or a candidate, and how it ended."""
    index: StrictInt = Field(ge=0)
    changes: JSONObject = Field(description="Profile key (dotted) -> the value this trial deploys: any a profile "
                                            "key takes.")
    baseline: StrictBool
    status: Literal["pending", "feasible", "infeasible", "skipped"]
    reason: str | None = None
    deployment: RecordName | None = None
    card: str | None = Field(None, description="The run id of the trial's bench card.")
    objective: ObjectiveSummary | None = None
    elapsed_s: float | None = None
    accept_len: float | None = None
    capacity: JSONObject | None = Field(None, description="What the engine resolved (the up's capacity).")
    g6: G6Sample | None = None
    error: str | None = Field(None, description="The error behind an infeasible trial.")
    g6_outputs: list[JSONObject] | None = Field(None, description="The baseline's greedy outputs: the G6 "
                                                                  "reference of every candidate.")

    @classmethod
    def pending(cls, index: int, changes: JSONObject, baseline: bool) -> TuneTrial:
        """A trial not run yet, with every key a trial always has written (null until known)."""
        return cls(index=index, changes=changes, baseline=baseline, status="pending", reason=None, deployment=None,
                   card=None, objective=None, elapsed_s=None, accept_len=None, capacity=None, g6=None)


class Estimate(KeysAsWritten):
    """The whole tune's time, estimated once after its first trial."""
    after_trial_s: float
    trials: StrictInt
    total_s: float
    formula: str


class Confirmation(KeysAsWritten):
    """The A B A B confirmation of the best candidate against the baseline: each side's samples pooled."""
    candidate: StrictInt
    order: list[Literal["baseline", "winner"]]
    baseline: list[float]
    winner: list[float]
    comparison: JSONObject | None = Field(None, description="sparkctl.bench.diff.compare_summaries(baseline, "
                                                            "winner).")
    verdict: str | None = None
    error: str | None = None


class Winner(KeysAsWritten):
    """What the tune decided: a promoted profile, or why nothing was."""
    promoted: StrictBool
    candidate: StrictInt | None = None
    why: str | None = None
    changes: JSONObject | None = None
    profile: str | None = None
    path: str | None = None
    card: str | None = None
    note: str | None = None


class RestoreReport(KeysAsWritten):
    """How the restore at the tune's end went: `deploy.door.restore`'s report (or settle's "none" when something
    else was deployed since). ``serving`` is what runs, read back from the cluster after it."""
    ok: StrictBool
    action: str | None = Field(None, description="down, or none (nothing restored) when no profile was brought back")
    profile: str | None = Field(None, description="The profile brought back.")
    outcome: str | None = None
    deployment: str | None = None
    endpoint: str | None = None
    reason: str | None = None
    serving: str | None = None
    serving_deployment: str | None = None
    error: str | None = None


class TuneTiming(KeysAsWritten):
    """Where a tune's time went, in seconds (each written once known)."""
    elapsed_before_s: float | None = Field(None, description="Time spent before the last save (a resume goes on "
                                                             "from it).")
    confirm_s: float | None = None
    trials_sum_s: float | None = None
    restore_s: float | None = None
    total_s: float | None = None


class TuneJournal(KeysAsWritten):
    """A tune: ``runs/<id>/tune.json`` in memory, from its load to its save (extra keys kept), and what
    `sparkctl.tune.run.tune` returns (`sparkctl tune --json` prints it)."""
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    schema_: Literal["sparkctl.tune/1"] = Field(alias="schema")
    run_id: RecordName
    state: str
    created: str | None = None
    profile: RecordName
    profile_data: JSONObject = Field(description="The baseline profile as it was when the tune began (a "
                                                 "`Profile` dump).")
    space: list[tuple[str, list[JSONValue]]] = Field(description="Each --vary: profile key, its values.")
    baseline_values: JSONObject
    options: TuneOptions
    trials: list[TuneTrial] = Field(min_length=1)
    original: RecordName | None = None
    estimate: Estimate | None = None
    confirmation: Confirmation | None = None
    winner: Winner | None = None
    restore: RestoreReport | None = None
    timing: TuneTiming = Field(default_factory=TuneTiming)
    began: str | None = None
    updated: str | None = None
    settled_at: str | None = None

    def as_json(self) -> JSONObject:
        """The journal as its file holds it (keys in the order they were written)."""
        return self.model_dump(mode="json", by_alias=True)


class TuneJournalFile:
    """``runs/<id>/tune.json``: the whole state of one tune, rewritten atomically after every step."""

    def __init__(self, ledger: Ledger, doc: TuneJournal) -> None:
        self.ledger, self.doc, self.run_id = ledger, doc, doc.run_id
        self.path = journal_path(ledger, doc.run_id)

    @classmethod
    def load(cls, ledger: Ledger, run_id: str) -> TuneJournalFile:
        """The journal of `run_id`: ConfigError when there is none; LedgerError (exit 6) naming the file when it is
        damaged (not JSON, or not of the shape `TuneJournal` describes: the profile is a plain name, never a path,
        the options are `TuneOptions`, every trial has its index, changes and status)."""
        if not is_plain_name(run_id):
            raise ConfigError(f"{clean(repr(run_id), 80)} is not a tune run id", where="--resume",
                              hint="`sparkctl tune --resume RUN` takes the id a tune printed (runs/*/tune.json)")
        path = journal_path(ledger, run_id)
        if not path.is_file():
            raise ConfigError(f"no tune run {run_id!r}", where=str(path.parent),
                              hint="`sparkctl tune --resume RUN` takes the id a tune printed (runs/*/tune.json)")
        return cls(ledger, parse_journal(read_json(path), path, run_id))

    def save(self) -> None:
        self.doc.updated = now_iso()
        self.ledger.run_dir(self.run_id)            # created private (0700) on the first write
        write_json_atomic(self.path, self.doc.as_json())


def parse_journal(data: JSONValue, path: Path, run_id: str) -> TuneJournal:
    """`data` as a `TuneJournal`; LedgerError (exit 6) naming `path` and the first field that does not fit."""
    hint = (f"the journal is damaged; move {path.parent} aside (the trials' cards and deployments stay in the "
            "ledger) and start a new `sparkctl tune`")
    try:
        doc = TuneJournal.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top)"
        raise LedgerError(f"damaged tune journal at {where}: {clean(first['msg'], 200)}", where=str(path),
                          hint=hint) from None
    if doc.run_id != run_id:
        raise LedgerError(f"damaged tune journal: it names run {doc.run_id}, its directory {run_id}",
                          where=str(path), hint=hint)
    return doc


class TuneMarker(KeysAsWritten):
    """``tune.json`` at the ledger root: the tune in progress, what ran before it, and its controller."""
    run: RecordName
    original: RecordName | None = None
    since: str | None = None
    controller: Controller | None = None


def read_marker(ledger: Ledger) -> TuneMarker | None:
    """The tune marker, or None when there is none; a marker that is not JSON is None too (as before: the next
    tune's lock and journal speak for it); one of the wrong shape (its run or original not a plain name, its
    controller not what a tune writes) is a LedgerError naming it (exit 6)."""
    path = ledger.root / MARKER
    try:
        m = read_json(path) if path.exists() else None
    except SparkctlError:
        return None
    if m is None:
        return None
    try:
        return TuneMarker.model_validate(m)
    except ValidationError:
        raise LedgerError("the tune marker is damaged (its run, original or controller is not what a tune writes)",
                          where=str(path), hint=f"look at it, then move {path} aside (no tune runs while it is "
                                                "there) and run the command again") from None


def write_marker(ledger: Ledger, run_id: str, original: str | None) -> None:
    marker = TuneMarker(run=run_id, original=original, since=now_iso(), controller=this_controller("tune", now_iso()))
    write_json_atomic(ledger.root / MARKER, marker.model_dump(mode="json"))


def clear_marker(ledger: Ledger) -> None:
    (ledger.root / MARKER).unlink(missing_ok=True)


def journal_path(ledger: Ledger, run_id: str) -> Path:
    return ledger.root / "runs" / run_id / "tune.json"
