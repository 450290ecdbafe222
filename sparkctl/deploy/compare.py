"""`bench --compare` as a transaction: before the comparison arm changes anything, `compare.json` in the state
directory records what it will restore (the deployment active then) and who runs the comparison; the restore
clears it. A controller killed in between leaves the marker: `status` says so (exit 8), and the next `up`,
`rollback`, `down` or `bench` settles it. The arm (command bench-compare) is never a rollback target
(`Ledger.known_good(rollback=True)`), so a plain `rollback` goes to what ran before the comparison.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.steps import COMPARE_BEGIN, COMPARE_COMMAND, COMPARE_END, boundary
from sparkctl.errors import SparkctlError
from sparkctl.state.controller import controller_alive, this_controller
from sparkctl.state.ledger import now_iso, read_json
from sparkctl.state.records import CompareMarker
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
    marker = CompareMarker(original=c.ledger.active_id(), arm=arm_id, since=now_iso(),
                           controller=this_controller("bench --compare", now_iso()))
    write_json_atomic(path, marker.model_dump(mode="json"))
    boundary(COMPARE_COMMAND, COMPARE_BEGIN, "after")


def end(c: Cluster) -> None:
    path = c.ledger.root / NAME
    if not path.exists():
        return
    boundary(COMPARE_COMMAND, COMPARE_END, "before")
    path.unlink(missing_ok=True)
    boundary(COMPARE_COMMAND, COMPARE_END, "after")


def read_marker(path: Path) -> CompareMarker:
    """The marker at `path`, read without following a link: SparkctlError when it cannot be read or is not JSON,
    ValueError (pydantic's) when it is not what sparkctl writes (an original or arm that is not a deployment id,
    a damaged controller)."""
    return CompareMarker.model_validate(read_json(path))


def unfinished(c: Cluster) -> Unfinished | None:
    """The marker of a comparison whose controller is gone, or None (none, it still runs, or it is not what
    sparkctl wrote: `sparkctl repair` moves such a marker aside)."""
    path = c.ledger.root / NAME
    if not path.exists():
        return None
    try:
        m = read_marker(path)
    except (SparkctlError, ValueError):
        return None
    if controller_alive(m.controller):
        return None
    return Unfinished(m.original, m.arm, m.since)
