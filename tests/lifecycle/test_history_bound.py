"""What a command reads does not grow with the ledger's history times the machine's processes.

The ledger keeps every deployment ever made (the watcher adds one per restart, unattended, for weeks), and the look
for processes that outlived their engine (`deploy.observe.leftovers`: `status`, `down`, `doctor`, settle and
preflight of every `up`) asks about every handle of every record. It read all of /proc once per dead handle and
validated every record whole: 300 records made `status` 4 s instead of 1 s on a machine of 73 processes (a Spark's
desktop runs several hundred). Now one pass over /proc serves every handle (`procfs.sessions`), and the history is
read for its handles alone (`Ledger.handles`).

Generated over the history's length: the same commands on histories of 0, 60 and 200 dead deployments (copies of a
real record, each with handles of its own), counting the full passes over /proc and the whole-record loads. Neither
may grow with the history; a leftover that really runs is still found among them (tests/lifecycle/test_leftovers.py
proves the finding itself against a hostile engine).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.doctor.collect import LOOKBACK
from sparkctl.nodes import procfs
from sparkctl.state.ledger import Ledger
from testrig.history import PID_ABOVE_ANY, add_history

HISTORIES = (0, 60, 200)     # the longer two past the doctor's look back (LOOKBACK, 50)
COMMANDS: tuple[tuple[str, ...], ...] = (
    ("status", "--json"), ("down", "--dry-run"), ("doctor", "--json", "--no-kernel-log"),
    ("up", "--profile", "PROFILE", "--yes", "--json"))


def test_no_command_reads_more_for_a_longer_history(cli, local_cluster, monkeypatch):
    """A history of up/down cycles (each old record a copy of one a real `down` wrote), then an active one."""
    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
    assert code == 0, err
    inv = load_inventory(local_cluster)
    ledger = Ledger.for_cluster(inv.cluster.name)
    downed = json.loads(out)["deployment"]
    code, out, err = cli("down", "--yes")
    assert code == 0, err
    template = json.loads(ledger.deployment_path(downed).read_text())
    assert template["handles"] and all(h["runtime"] == "process" for h in template["handles"])
    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
    assert code == 0, err

    counts = {"scans": 0, "loads": 0}
    real_pids, real_load = procfs.pids, Ledger.load

    def pids() -> list[int]:
        counts["scans"] += 1
        return real_pids()

    def load(self: Ledger, dep_id: str):
        counts["loads"] += 1
        return real_load(self, dep_id)
    monkeypatch.setattr(procfs, "pids", pids)
    monkeypatch.setattr(Ledger, "load", load)

    seen: dict[tuple[str, ...], list[tuple[int, int, int]]] = {c: [] for c in COMMANDS}
    added = 0
    for n in HISTORIES:
        add_history(ledger, template, added, n - added)
        added = n
        assert len(ledger.record_ids()) == n + 2 + HISTORIES.index(n)     # + one per `up` of this test
        for command in COMMANDS:
            counts.update(scans=0, loads=0)
            # each `up` a real change (settle, preflight, boot, hand-off, the superseded one kept): d5 <-> dflash-off
            profile = "dflash-off" if HISTORIES.index(n) % 2 == 0 else "d5"
            code, out, err = cli(*(profile if a == "PROFILE" else a for a in command))
            assert code in (0, 8), f"{command} with {n} old records: exit {code}: {err[-2000:]}"
            seen[command].append((n, counts["scans"], counts["loads"]))
    for command, rows in seen.items():
        print(f"{' '.join(command)}: (history, passes over /proc, whole-record loads) {rows}")
        # no history, then one of 60 and one of 200: the first older deployments may add a constant (one pass for
        # what outlived them, the doctor's look back for a failure), the 140 after them nothing
        # (an `up`'s passes over /proc are mostly its stops' waits for the old engines' processes to be gone, a
        # pass every 50 ms until they are: timing, not history; its loads are compared)
        if command[0] == "up":
            rows = [(n, 0, loads) for n, _, loads in rows]
        (_, scans0, loads0), *longer = rows
        assert len({r[1:] for r in longer}) == 1, f"`{' '.join(command)}` reads more for a longer history: {rows}"
        assert longer[0][1] <= scans0 + 1 and longer[0][2] <= loads0 + LOOKBACK, f"`{' '.join(command)}`: {rows}"


def test_a_leftover_among_a_long_history_is_still_found(local_cluster):
    """The one pass over /proc still finds what runs in a dead engine's session, among 60 dead deployments: a
    session leader (standing in for a log pipe) starts a child and exits; its record's handle names the leader."""
    from sparkctl.deploy.cluster import Cluster
    from sparkctl.deploy.observe import leftovers
    from sparkctl.state.records import DeploymentRecord

    cluster = Cluster(load_inventory(local_cluster))
    ledger = cluster.ledger
    leader = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; print(subprocess.Popen([sys.executable, "
                               "'-c', 'import time; time.sleep(120)']).pid, flush=True)"],
                              start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        ticks = procfs.start_ticks(leader.pid)
        assert leader.stdout is not None
        child = int(leader.stdout.readline())
        leader.wait(timeout=30)           # reaped: the session's leader is gone, its child runs on in the session
        assert procfs.session_and_ticks(child) == (leader.pid, procfs.start_ticks(child))
        template = {"profile": "d5", "profile_data": {}, "cluster": cluster.name, "identity": "x",
                    "created": "2026-01-01T00:00:00Z", "endpoint": "http://127.0.0.1:1", "status": "stopped"}
        handle = {"node": cluster.inventory.nodes[0].name, "rank": 0, "runtime": "process", "log": "/nonexistent"}
        for i in range(60):
            rid = f"20260101T{i:06d}Z-old-{i:04x}"
            ledger.save(DeploymentRecord.model_validate({**template, "id": rid, "handles": [
                {**handle, "deployment": rid, "pid": PID_ABOVE_ANY + i, "start_ticks": 1}]}))
        mine = "20260102T000000Z-mine-0000"
        ledger.save(DeploymentRecord.model_validate({**template, "id": mine, "handles": [
            {**handle, "deployment": mine, "pid": leader.pid, "start_ticks": ticks}]}))
        left = leftovers(cluster)
        assert [(lo.deployment, [m.pid for m in lo.members]) for lo in left] == [(mine, [child])], \
            [lo.describe() for lo in left]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader.pid, signal.SIGKILL)


def _superseded_then_active(cli) -> tuple[str, str]:
    """`up` d5, then `up` dflash-off: (the superseded d5, kept for a quick rollback; the active dflash-off)."""
    ids = []
    for profile in ("d5", "dflash-off"):
        code, out, err = cli("up", "--profile", profile, "--yes", "--json")
        assert code == 0, err
        ids.append(json.loads(out)["deployment"])
    return ids[0], ids[1]


def test_down_removes_what_was_kept_for_rollback_before_it_marks_the_walks_stop(cli, local_cluster):
    """The mark that stops the walk back for kept engines (`engines_removed` on the deployment `down` stopped) is
    written only after every older kept one is removed: written first, it hid the superseded deployment kept for a
    quick rollback from that very walk, and its stopped containers outlived `down` (found on the real engine in
    containers, tests/cluster/test_real_engine_containers.py). Then a later walk stops there, reading nothing older."""
    from sparkctl.deploy.cluster import Cluster
    from sparkctl.deploy.engines import kept_for_rollback

    first, second = _superseded_then_active(cli)
    cluster = Cluster(load_inventory(local_cluster))
    assert [r.id for r in kept_for_rollback(cluster)] == [first]       # superseded, kept for a quick rollback
    code, out, err = cli("down", "--yes")
    assert code == 0, err
    assert f"removed the stopped engines of {first} kept for rollback" in err, err
    assert cluster.ledger.load(first).engines_removed and cluster.ledger.load(second).engines_removed
    assert kept_for_rollback(cluster) == []


@pytest.mark.parametrize("full_from", [2, 3], ids=["the-kept-ones-mark", "downs-own-mark"])
def test_a_full_disk_at_downs_marks_never_stops_it(cli, local_cluster, full_from):
    """The state directory fills up at `down`'s later record writes (SPARKCTL_FULL_FROM_WRITE: the 1st is the stopped
    deployment's status; the 2nd the kept one's removal mark, the 3rd `down`'s own mark): every engine is still
    stopped, `down` exits 0, and a mark that was not written is simply absent (the next walk reads further)."""
    from sparkctl.deploy.cluster import Cluster
    from sparkctl.deploy.observe import process_engines
    from sparkctl.state.ledger import WRITE_FAULT_ENV

    first, second = _superseded_then_active(cli)
    p = subprocess.run([sys.executable, "-m", "sparkctl", "down", "--yes"], capture_output=True, text=True,
                       env={**os.environ, WRITE_FAULT_ENV: str(full_from)}, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    cluster = Cluster(load_inventory(local_cluster))
    assert process_engines(cluster) == []
    assert cluster.ledger.load(second).status == "stopped" and cluster.ledger.load(second).engines_removed is None
    assert bool(cluster.ledger.load(first).engines_removed) == (full_from > 2)
