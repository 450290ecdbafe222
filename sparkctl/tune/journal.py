"""The tune's journal and its cluster marker: what a kill -9 leaves behind, and how the next command settles it.

``runs/<id>/tune.json`` holds the whole state of one tune (rewritten atomically after every step); ``tune.json``
at the ledger root names the tune in progress, the deployment that ran before it and its controller (pid +
start time). A marker whose controller is dead is settled by the next ``sparkctl tune``: ``--resume`` of that
run continues it; any other tune first restores what ran before and marks the old journal ``interrupted``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from sparkctl.errors import ConfigError, SparkctlError
from sparkctl.state.files import write_json_atomic
from sparkctl.state.ledger import Ledger, now_iso, read_json

MARKER = "tune.json"
Progress = Callable[[str], None]


class Journal:
    """``runs/<id>/tune.json``: the whole state of one tune, rewritten atomically after every step."""

    def __init__(self, ledger: Ledger, run_id: str, data: dict[str, Any]) -> None:
        self.ledger, self.run_id, self.data = ledger, run_id, data
        self.path = ledger.root / "runs" / run_id / "tune.json"

    @classmethod
    def load(cls, ledger: Ledger, run_id: str) -> "Journal":
        path = ledger.root / "runs" / run_id / "tune.json"
        if not path.is_file():
            raise ConfigError(f"no tune run {run_id!r}", where=str(path.parent),
                              hint="`sparkctl tune --resume RUN` takes the id a tune printed (runs/*/tune.json)")
        return cls(ledger, run_id, read_json(path))

    def save(self) -> None:
        self.data["updated"] = now_iso()
        self.ledger.run_dir(self.run_id)            # created private (0700) on the first write
        write_json_atomic(self.path, self.data)


def read_marker(ledger: Ledger) -> dict[str, Any] | None:
    path = ledger.root / MARKER
    try:
        return read_json(path) if path.exists() else None
    except SparkctlError:
        return None


def write_marker(ledger: Ledger, run_id: str, original: str | None) -> None:
    from sparkctl.state.controller import this_controller
    write_json_atomic(ledger.root / MARKER, {"run": run_id, "original": original, "since": now_iso(),
                                             "controller": this_controller("tune", now_iso()).model_dump()})


def clear_marker(ledger: Ledger) -> None:
    (ledger.root / MARKER).unlink(missing_ok=True)


def restore(deployer: Any, original: str | None, progress: Progress) -> dict[str, Any]:
    from sparkctl.config.profile import Profile
    from sparkctl.deploy.lifecycle import UpOptions
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


def settle(deployer: Any, progress: Progress, *, resuming: str | None = None) -> dict[str, Any] | None:
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
