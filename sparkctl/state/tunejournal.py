"""A tune's files in the ledger: its journal and the cluster's tune marker, as written and as read back.

``runs/<id>/tune.json`` holds the whole state of one tune (rewritten atomically after every step); ``tune.json``
at the ledger root names the tune in progress, the deployment that ran before it and its controller (pid +
start time). Reading them back is validated here (a damaged file is a LedgerError, exit 6), so `repair` can
check them without importing the tune; settling a tune a kill -9 left is the tune's own (sparkctl/tune/settle.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, StrictBool, StrictInt, TypeAdapter, ValidationError

from sparkctl.errors import ConfigError, LedgerError, SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.state.ledger import Ledger, now_iso, read_json
from sparkctl.state.records import KeysAsWritten, RecordName
from sparkctl.statefiles import write_json_atomic
from sparkctl.untrusted import clean, is_plain_name


@dataclass
class TuneOptions:
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

    def as_dict(self) -> JSONObject:
        return asdict(self)


MARKER = "tune.json"
Progress = Callable[[str], None]


class TuneJournalFile:
    """``runs/<id>/tune.json``: the whole state of one tune, rewritten atomically after every step."""

    def __init__(self, ledger: Ledger, run_id: str, data: JSONObject) -> None:
        self.ledger, self.run_id, self.data = ledger, run_id, data
        self.path = ledger.root / "runs" / run_id / "tune.json"

    @classmethod
    def load(cls, ledger: Ledger, run_id: str) -> TuneJournalFile:
        """The journal of `run_id`: ConfigError when there is none; LedgerError (exit 6) naming the file when it is
        damaged (not JSON, or not of the shape `TuneJournal` describes: the profile is a plain name, never a path,
        the options are `TuneOptions`, every trial has its index, changes and status)."""
        if not is_plain_name(run_id):
            raise ConfigError(f"{clean(repr(run_id), 80)} is not a tune run id", where="--resume",
                              hint="`sparkctl tune --resume RUN` takes the id a tune printed (runs/*/tune.json)")
        path = ledger.root / "runs" / run_id / "tune.json"
        if not path.is_file():
            raise ConfigError(f"no tune run {run_id!r}", where=str(path.parent),
                              hint="`sparkctl tune --resume RUN` takes the id a tune printed (runs/*/tune.json)")
        data = read_json(path)
        validate_journal(data, path, run_id)
        return cls(ledger, run_id, data)

    def save(self) -> None:
        self.data["updated"] = now_iso()
        self.ledger.run_dir(self.run_id)            # created private (0700) on the first write
        write_json_atomic(self.path, self.data)


class TuneTrial(KeysAsWritten):
    """One trial of a tune: the baseline (index 0) or a candidate, and how it ended."""
    index: StrictInt = Field(ge=0)
    changes: JSONObject
    baseline: StrictBool
    status: Literal["pending", "feasible", "infeasible", "skipped"]
    reason: str | None = None
    deployment: RecordName | None = None
    card: str | None = Field(None, description="The run id of the trial's bench card.")
    objective: JSONObject | None = Field(None, description="Summary of the objective's samples (n, median, min, "
                                         "max, samples).")
    elapsed_s: float | None = None
    accept_len: float | None = None
    capacity: JSONObject | None = None
    g6: JSONObject | None = Field(None, description="The trial's G6 sample verdict (sparkctl/tune/g6.py).")

    @property
    def error(self) -> str | None:
        """The error behind an infeasible trial (a key added when it failed, after the others)."""
        value = (self.model_extra or {}).get("error")
        return None if value is None else str(value)


class TuneJournal(KeysAsWritten):
    """A tune: ``runs/<id>/tune.json`` as read back (extra keys kept; what `resume` and `settle` rely on), and what
    `sparkctl.tune.run.tune` returns (`sparkctl tune --json` prints it)."""
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    schema_: Literal["sparkctl.tune/1"] = Field(alias="schema")
    run_id: RecordName
    state: str
    created: str | None = None
    profile: RecordName
    profile_data: JSONObject
    space: list[list[Any]]
    baseline_values: JSONObject
    options: JSONObject
    trials: list[TuneTrial] = Field(min_length=1)
    original: RecordName | None = None
    estimate: JSONObject | None = None
    confirmation: JSONObject | None = None
    winner: JSONObject | None = None
    restore: JSONObject | None = None
    timing: JSONObject = Field(default_factory=dict)

    def as_json(self) -> JSONObject:
        """The journal as its file holds it (keys in the order they were written)."""
        return self.model_dump(by_alias=True)


def validate_journal(data: Any, path: Path, run_id: str) -> None:
    """LedgerError (exit 6) naming `path` and the first field that does not fit, when `data` is not a journal."""
    hint = (f"the journal is damaged; move {path.parent} aside (the trials' cards and deployments stay in the "
            "ledger) and start a new `sparkctl tune`")
    try:
        TuneJournal.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top)"
        raise LedgerError(f"damaged tune journal at {where}: {clean(first['msg'], 200)}", where=str(path),
                          hint=hint) from None
    if data["run_id"] != run_id:
        raise LedgerError(f"damaged tune journal: it names run {data['run_id']}, its directory {run_id}",
                          where=str(path), hint=hint)
    try:
        TypeAdapter(TuneOptions).validate_python(data["options"])
    except (TypeError, ValueError) as exc:            # pydantic's ValidationError is a ValueError
        raise LedgerError(f"damaged tune journal at options: {clean(str(exc), 200)}", where=str(path),
                          hint=hint) from None


def read_marker(ledger: Ledger) -> JSONObject | None:
    """The tune marker, or None when there is none; a marker that is not JSON is None too (as before: the next
    tune's lock and journal speak for it); one of the wrong shape (its run or original not a plain name, its
    controller not an object) is a LedgerError naming it (exit 6)."""
    path = ledger.root / MARKER
    try:
        m = read_json(path) if path.exists() else None
    except SparkctlError:
        return None
    if m is None:
        return None
    if not (isinstance(m, dict) and is_plain_name(m.get("run"))
            and (m.get("original") is None or is_plain_name(m.get("original")))
            and isinstance(m.get("controller") or {}, dict)):
        raise LedgerError("the tune marker is damaged (its run, original or controller is not what a tune writes)",
                          where=str(path), hint=f"look at it, then move {path} aside (no tune runs while it is "
                                                "there) and run the command again")
    return m


def write_marker(ledger: Ledger, run_id: str, original: str | None) -> None:
    from sparkctl.state.controller import this_controller
    write_json_atomic(ledger.root / MARKER, {"run": run_id, "original": original, "since": now_iso(),
                                             "controller": this_controller("tune", now_iso()).model_dump()})


def clear_marker(ledger: Ledger) -> None:
    (ledger.root / MARKER).unlink(missing_ok=True)


def journal_path(ledger: Ledger, run_id: str) -> Path:
    return ledger.root / "runs" / run_id / "tune.json"
