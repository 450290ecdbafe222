"""Settling a tune a kill -9 left behind (its journal and marker: sparkctl/state/tunejournal.py).

``runs/<id>/tune.json`` holds the whole state of one tune (rewritten atomically after every step); ``tune.json``
at the ledger root names the tune in progress, the deployment that ran before it and its controller (pid +
start time). A marker whose controller is dead is settled by the next ``sparkctl tune``: ``--resume`` of that
run continues it; any other tune first restores what ran before and marks the old journal ``interrupted``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sparkctl.deploy import door
from sparkctl.deploy.steps import ARM_COMMAND
from sparkctl.errors import LedgerError, SparkctlError
from sparkctl.state.controller import controller_alive
from sparkctl.state.ledger import Ledger, now_iso
from sparkctl.state.tunejournal import (
    RestoreReport,
    TuneJournal,
    TuneJournalFile,
    TuneMarker,
    clear_marker,
    read_marker,
)

if TYPE_CHECKING:
    from sparkctl.deploy.commands import Deployer

Progress = Callable[[str], None]


def restore(deployer: Deployer, original: str | None, progress: Progress) -> RestoreReport:
    """What ran before the tune, back (`deploy.door.restore`: the compare transaction's one restore)."""
    say = "restoring the deployment that ran before the tune ({profile}, {id})"
    return RestoreReport.model_validate(door.restore(deployer, original, progress=progress, say=say))


def _deployed_since(ledger: Ledger, marker: TuneMarker) -> str | None:
    """What was deployed since the tune in `marker` began, when it was not the tune: None while the cluster is
    still the tune's (nothing active: a trial's boot was cut; one of the tune's trial arms, made since it began;
    or what ran before it), else "deployment X (profile P) was deployed"."""
    original, since = marker.original, marker.since or ""
    try:
        active = ledger.active()
    except LedgerError:
        return None                  # unreadable: the restore's own `up` reports it
    if active is None or active.id == original or (active.command == ARM_COMMAND and active.created >= since):
        return None
    return f"deployment {active.id} (profile {active.profile}) was deployed"


def settle(deployer: Deployer, progress: Progress, *, resuming: str | None = None) -> TuneMarker | None:
    """A tune whose controller died (kill -9): returns its marker when `resuming` names it; otherwise restores
    what ran before it, marks its journal interrupted, and clears the marker. None when there is nothing."""
    m = read_marker(deployer.ledger)
    if m is None:
        return None
    if m.controller is None or controller_alive(m.controller):
        return m             # a live tune holds the lock too (one whose controller is not known: the lock decides)
    if resuming and m.run == resuming:
        return m
    theirs = _deployed_since(deployer.ledger, m)
    if theirs is not None:        # anything deployed since the tune died wins: its restore would take it down
        progress(f"tune {m.run} was interrupted (controller gone); {theirs} since, so what ran before the "
                 f"tune is not restored (what runs now wins)")
        result = RestoreReport.model_validate({"ok": True, "action": "none", "reason": f"{theirs} since the tune"})
    else:
        progress(f"tune {m.run} was interrupted (controller gone); restoring what ran before it")
        result = restore(deployer, m.original, progress)
    try:
        j = TuneJournalFile.load(deployer.ledger, m.run)
        j.doc.state, j.doc.restore, j.doc.settled_at = "interrupted", result, now_iso()
        j.save()
    except SparkctlError:
        pass
    if result.ok:
        clear_marker(deployer.ledger)
    return None


def resume_target(ledger: Ledger, doc: TuneJournal, marker: TuneMarker | None, progress: Progress) -> None:
    """What a resumed tune restores at its end, decided from what runs now, not from the journal's snapshot of
    what ran before the tune began: a deployment the user made since the tune stopped (not one of its arms)
    becomes its `original`; nothing running once the tune's own restore had ended (no marker: the user took it
    down since) makes it None (the resumed tune ends with nothing running, as the user left it)."""
    try:
        active = ledger.active()
    except LedgerError:
        return                       # unreadable: the trials' own `up` reports it
    original, began = doc.original, doc.began or ""
    if active is None:
        if marker is None and original is not None:
            progress(f"nothing runs since the tune stopped (its restore of {original} ended, then it was taken "
                     "down): the resumed tune ends with nothing running")
            doc.original = None
        return
    if active.id == original or (active.command == ARM_COMMAND and active.created >= began):
        return
    progress(f"deployment {active.id} (profile {active.profile}) was deployed since the tune stopped: the resumed "
             f"tune restores it at its end (not {original or 'nothing'})")
    doc.original = active.id
