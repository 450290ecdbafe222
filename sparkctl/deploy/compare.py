"""`bench --compare` as a transaction: before the comparison arm changes anything, `compare.json` in the state
directory records what it will restore (the deployment active then) and who runs the comparison; the restore
clears it. A controller killed in between leaves the marker: `status` says so (exit 8), and the next `up`,
`rollback`, `down` or `bench` settles it. The arm (command bench-compare) is never a rollback target
(`Ledger.known_good(rollback=True)`), so a plain `rollback` goes to what ran before the comparison.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.steps import COMPARE_BEGIN, COMPARE_COMMAND, COMPARE_END, boundary
from sparkctl.state.controller import controller_alive, this_controller
from sparkctl.state.ledger import now_iso
from sparkctl.state.records import Controller
from sparkctl.statefiles import write_json_atomic

NAME = "compare.json"


@dataclass(frozen=True)
class Unfinished:
    original: str | None
    arm: str | None
    since: str

    def describe(self) -> str:
        return (f"a `bench --compare` started {self.since} did not finish: its arm {self.arm or '?'} replaced "
                f"{self.original or 'nothing'}, which was not restored")


def begin(c: Cluster, arm_id: str) -> None:
    """Record what the comparison will restore (the active deployment now), before the arm changes anything."""
    path = c.ledger.root / NAME
    if path.exists():
        return
    boundary(COMPARE_COMMAND, COMPARE_BEGIN, "before")
    write_json_atomic(path, {"original": c.ledger.active_id(), "arm": arm_id, "since": now_iso(),
                             "controller": this_controller("bench --compare", now_iso()).model_dump()})
    boundary(COMPARE_COMMAND, COMPARE_BEGIN, "after")


def end(c: Cluster) -> None:
    path = c.ledger.root / NAME
    if not path.exists():
        return
    boundary(COMPARE_COMMAND, COMPARE_END, "before")
    path.unlink(missing_ok=True)
    boundary(COMPARE_COMMAND, COMPARE_END, "after")


def unfinished(c: Cluster) -> Unfinished | None:
    """The marker of a comparison whose controller is gone, or None (none, or it still runs)."""
    try:
        data = json.loads((c.ledger.root / NAME).read_text())
        ctl = Controller.model_validate(data["controller"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if controller_alive(ctl):
        return None
    from sparkctl.untrusted import is_plain_name
    if not all(data.get(k) is None or is_plain_name(data.get(k)) for k in ("original", "arm")):
        return None                      # not ids sparkctl wrote: `sparkctl repair` moves the marker aside
    return Unfinished(data.get("original"), data.get("arm"), str(data.get("since")))
