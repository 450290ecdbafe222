"""The tune's journal and its cluster marker: what a kill -9 leaves behind, and how the next command settles it.

``runs/<id>/tune.json`` holds the whole state of one tune (rewritten atomically after every step); ``tune.json``
at the ledger root names the tune in progress, the deployment that ran before it and its controller (pid +
start time). A marker whose controller is dead is settled by the next ``sparkctl tune``: ``--resume`` of that
run continues it; any other tune first restores what ran before and marks the old journal ``interrupted``.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, TypeAdapter, ValidationError

from sparkctl.errors import ConfigError, LedgerError, SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.state.files import write_json_atomic
from sparkctl.state.ledger import Ledger, now_iso, read_json
from sparkctl.state.records import RecordName
from sparkctl.untrusted import clean, is_plain_name

if TYPE_CHECKING:
    from sparkctl.deploy.commands import Deployer

MARKER = "tune.json"
Progress = Callable[[str], None]


class Journal:
    """``runs/<id>/tune.json``: the whole state of one tune, rewritten atomically after every step."""

    def __init__(self, ledger: Ledger, run_id: str, data: JSONObject) -> None:
        self.ledger, self.run_id, self.data = ledger, run_id, data
        self.path = ledger.root / "runs" / run_id / "tune.json"

    @classmethod
    def load(cls, ledger: Ledger, run_id: str) -> Journal:
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


class _Trial(BaseModel):
    model_config = ConfigDict(extra="allow")
    index: StrictInt = Field(ge=0)
    changes: JSONObject
    baseline: StrictBool
    status: Literal["pending", "feasible", "infeasible", "skipped"]
    reason: str | None = None
    deployment: RecordName | None = None
    card: str | None = None
    objective: JSONObject | None = None
    elapsed_s: float | None = None


class TuneJournal(BaseModel):
    """The shape of ``runs/<id>/tune.json`` as read back (extra keys kept): what `resume` and `settle` rely on."""
    model_config = ConfigDict(extra="allow")
    schema_: Literal["sparkctl.tune/1"] = Field(alias="schema")
    run_id: RecordName
    state: str
    profile: RecordName
    profile_data: JSONObject
    space: list[list[Any]]
    baseline_values: JSONObject
    options: JSONObject
    trials: list[_Trial] = Field(min_length=1)
    original: RecordName | None = None
    estimate: JSONObject | None = None
    confirmation: JSONObject | None = None
    winner: JSONObject | None = None
    restore: JSONObject | None = None
    timing: JSONObject = Field(default_factory=dict)


def validate_journal(data: Any, path: Path, run_id: str) -> None:
    """LedgerError (exit 6) naming `path` and the first field that does not fit, when `data` is not a journal."""
    from sparkctl.tune.run import TuneOptions
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


def restore(deployer: Deployer, original: str | None, progress: Progress) -> JSONObject:
    from sparkctl.config.profile import Profile
    from sparkctl.deploy.commands import UpOptions
    if original is None:
        progress("nothing ran before the tune: bringing the trial deployment down")
        try:
            deployer.down()
            return {"ok": True, "action": "down"}
        except SparkctlError as exc:
            return {"ok": False, "action": "down", "error": exc.render()}
    rec = deployer.ledger.load(original)
    progress(f"restoring the deployment that ran before the tune ({rec.profile}, {original})")
    try:
        up = deployer.up(Profile.model_validate(rec.profile_data), UpOptions(), kind="bench-restore")
    except SparkctlError as exc:
        progress(f"restore FAILED: {exc.message}")
        return {"ok": False, "profile": rec.profile, "error": exc.render()}
    return {"ok": True, "profile": rec.profile, "outcome": str(up.get("outcome")), "deployment": up.get("deployment")}


def _deployed_since(ledger: Ledger, marker: JSONObject) -> str | None:
    """What was deployed since the tune in `marker` began, when it was not the tune: None while the cluster is
    still the tune's (nothing active: a trial's boot was cut; one of the tune's trial arms, made since it began;
    or what ran before it), else "deployment X (profile P) was deployed"."""
    original, since = marker.get("original"), str(marker.get("since") or "")
    try:
        active = ledger.active()
    except LedgerError:
        return None                  # unreadable: the restore's own `up` reports it
    if active is None or active.id == original or (active.kind == "bench-compare" and active.created >= since):
        return None
    return f"deployment {active.id} (profile {active.profile}) was deployed"


def settle(deployer: Deployer, progress: Progress, *, resuming: str | None = None) -> JSONObject | None:
    """A tune whose controller died (kill -9): returns its marker when `resuming` names it; otherwise restores
    what ran before it, marks its journal interrupted, and clears the marker. None when there is nothing."""
    from sparkctl.state.controller import controller_alive
    m = read_marker(deployer.ledger)
    if m is None:
        return None
    if controller_alive(m.get("controller") or {}):
        return m             # a live tune holds the lock too: the caller's lock attempt names it
    if resuming and m.get("run") == resuming:
        return m
    theirs = _deployed_since(deployer.ledger, m)
    if theirs is not None:        # anything deployed since the tune died wins: its restore would take it down
        progress(f"tune {m.get('run')} was interrupted (controller gone); {theirs} since, so what ran before the "
                 f"tune is not restored (what runs now wins)")
        result: dict[str, Any] = {"ok": True, "action": "none", "reason": f"{theirs} since the tune"}
    else:
        progress(f"tune {m.get('run')} was interrupted (controller gone); restoring what ran before it")
        result = restore(deployer, m.get("original"), progress)
    try:
        j = Journal.load(deployer.ledger, str(m.get("run")))
        j.data.update(state="interrupted", restore=result, settled_at=now_iso())
        j.save()
    except SparkctlError:
        pass
    if result.get("ok"):
        clear_marker(deployer.ledger)
    return None


def journal_path(ledger: Ledger, run_id: str) -> Path:
    return ledger.root / "runs" / run_id / "tune.json"
