"""The record of a replicated deployment (`replicas: K`): `replicated.json` in the parent cluster's state directory
(mode 0600, written atomically, checked against `state.records.ReplicatedRecord` on every read and write), with its
journal (the lifecycle's `JournalEntry`, one per step boundary of a replicated `up`) and what it says of the `up`
that wrote it: in progress, interrupted (its controller gone), or settled. `deploy.replicated` runs the deployment;
this is only what it keeps on disk.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from sparkctl.errors import LedgerError
from sparkctl.jsontypes import JSONObject
from sparkctl.state.controller import controller_alive
from sparkctl.state.ledger import now_iso
from sparkctl.state.records import JournalEntry, ReplicatedRecord
from sparkctl.statefiles import open_state_file, private_dir, state_dir_error, write_json_atomic

RECORD = "replicated.json"


@dataclass
class Record:
    """What the parent cluster's state directory holds for a replicated deployment: `doc`, the typed record from
    load to save (assign its fields rather than mutate them in place: `empty` reads which were ever set)."""
    path: Path
    doc: ReplicatedRecord = field(default_factory=ReplicatedRecord)

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def load(cls, root: Path) -> Record:
        """The record, checked against `ReplicatedRecord` (a wrong shape is a LedgerError naming the file)."""
        path = root / RECORD
        hint = "run `sparkctl repair`, or move the file aside if no replica runs"
        try:
            with os.fdopen(open_state_file(path, os.O_RDONLY), "rb") as fh:   # never through a planted symlink
                data = json.loads(fh.read())
        except FileNotFoundError:
            return cls(path)
        except RecursionError:
            raise LedgerError("the replicated deployment's record is corrupt: nested too deep", where=str(path),
                              hint=hint) from None
        except OSError as exc:           # not a directory, unreadable: the state directory's error (exit 6)
            raise state_dir_error(root, exc) from None
        except ValueError as exc:
            raise LedgerError(f"the replicated deployment's record is corrupt: {exc}", where=str(path),
                              hint=hint) from None
        if not isinstance(data, dict):
            raise LedgerError("the replicated deployment's record is not a JSON object", where=str(path), hint=hint)
        try:
            return cls(path, ReplicatedRecord.model_validate(data))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "(top)"
            raise LedgerError(f"the replicated deployment's record has the wrong shape at {where}: {first['msg']}",
                              where=str(path), hint=hint) from None

    def save(self) -> None:
        """Written only as a valid `ReplicatedRecord` (atomic, mode 0600); one writer at a time (parallel replicas)."""
        with self._lock:
            doc = ReplicatedRecord.model_validate(self.doc.model_dump(mode="json")).model_dump(mode="json")
            if doc.get("profile_data") is None:      # a record from before it was kept stays as it was written
                doc.pop("profile_data", None)
            private_dir(self.path.parent)
            write_json_atomic(self.path, doc)

    def journal(self, step: str, phase: str, what: str, replica: int | None = None, detail: str | None = None) -> None:
        with self._lock:
            entry = JournalEntry(step=step, phase=phase, at=now_iso(), what=what, replica=replica, detail=detail)
            self.doc.journal = [*self.doc.journal, entry]
        self.save()

    @property
    def empty(self) -> bool:
        """No record on disk (or nothing in it): no field of it was ever set."""
        return not self.doc.model_fields_set and not self.doc.model_extra

    @property
    def active(self) -> bool:
        return self.doc.status in ("active", "updating", "failed")   # failed: its replicas still run

    def router_entry(self) -> JSONObject | None:
        """The recorded router as its runtime reads it (`router.launch.from_record`), or None."""
        return self.doc.router.model_dump(mode="json") if self.doc.router is not None else None

    def progress(self) -> str | None:
        """"`sparkctl up` in progress (pid P on H, since T)" while the `up` that set status "updating" lives;
        "interrupted: ..." once its controller is gone; None when the record is settled."""
        ctl = self.doc.controller
        if self.doc.status != "updating" or ctl is None:
            return None
        who = f"pid {ctl.pid} on {ctl.host}, since {ctl.since}"
        if controller_alive(ctl):
            return f"`sparkctl up` in progress ({who})"
        return (f"interrupted: the `sparkctl up` that was updating it is gone ({who}); the next `sparkctl up` "
                f"converges, `sparkctl down` stops it")

    def dead_controller(self) -> str | None:
        """"controller pid P on H gone" when the `up` that set status "updating" died (None: settled, or alive)."""
        ctl = self.doc.controller
        if self.doc.status != "updating" or ctl is None or controller_alive(ctl):
            return None
        return f"controller pid {ctl.pid} on {ctl.host} gone"

    def recorded_name(self, index: int) -> str | None:
        """The name a replica was deployed under (kept: its ledger and engines are there)."""
        return next((r.cluster for r in self.doc.replicas if r.index == index), None)
