"""A long ledger history, made fast: copies of one real record as older deployments, each with process handles of
its own whose processes are long gone (what weeks of up/down cycles or a watcher's restarts leave). Used by
tests/lifecycle/test_history_bound.py and benchmarks/bench_history.py."""
from __future__ import annotations

import json
import os

from sparkctl.state.ledger import Ledger
from sparkctl.statefiles import write_json_atomic

OLD_PREFIX = "20260101T"         # the copies' ids: older than any record a test makes today
PID_ABOVE_ANY = 2 ** 22 + 1      # above Linux's largest pid_max: never a running process


def add_history(ledger: Ledger, template: dict, start: int, n: int) -> None:
    """Copies `start` .. `start + n - 1` of record `template` (a JSON document), ordered in the ledger's index
    before every other record, as a ledger that made them in turn orders them (oldest first)."""
    for i in range(start, start + n):
        rid = f"{OLD_PREFIX}{i:06d}Z-old-{i:04x}"
        doc = json.loads(json.dumps(template))
        doc.update(id=rid, controller=None)
        for rank, h in enumerate(doc["handles"]):
            h.update(deployment=rid, pid=PID_ABOVE_ANY + 2 * i + rank, start_ticks=1000 + i, cgroup=None)
        path = ledger.deployment_path(rid)
        path.write_text(json.dumps(doc))
        os.chmod(path, 0o600)
    index = ledger.index()
    real = [rid for rid in index["history"] if not rid.startswith(OLD_PREFIX)]
    old = sorted(rid for rid in index["history"] if rid.startswith(OLD_PREFIX))
    write_json_atomic(ledger.index_path, {**index, "history": [*old, *real]})
