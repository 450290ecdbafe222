"""A dead controller told from a live one: pid + start time + host, and the lock holder, without taking the lock."""
from __future__ import annotations

import json
import os
import socket
import subprocess

from sparkctl.deploy.settle import interrupted
from sparkctl.nodes import procfs
from sparkctl.state.controller import controller_alive, live_lock_holder, this_controller
from sparkctl.state.ledger import Ledger
from sparkctl.state.records import Controller, Status
from tests.unit.test_records import _record


def _gone_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_controller_is_dead_when_its_pid_is_gone_or_recycled():
    me = this_controller("up", "now")
    assert me.pid == os.getpid() and me.start_ticks == procfs.start_ticks(os.getpid()) and controller_alive(me)
    assert me.start_ticks is not None
    assert not controller_alive(me.model_copy(update={"start_ticks": me.start_ticks + 1}))   # recycled pid
    assert not controller_alive(me.model_copy(update={"pid": _gone_pid()}))
    # another host's pid cannot be checked from here: alive until its lock says otherwise
    assert controller_alive(me.model_copy(update={"pid": _gone_pid(), "host": "elsewhere"}))


def test_lock_holder_left_by_a_killed_process_counts_as_free(tmp_path):
    (tmp_path / "lock.holder").write_text(json.dumps({"pid": _gone_pid(), "host": socket.gethostname(),
                                                      "command": "up", "since": "t"}))
    assert live_lock_holder(tmp_path) is None
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "command": "up", "since": "t",
            "start_ticks": procfs.start_ticks(os.getpid())}
    (tmp_path / "lock.holder").write_text(json.dumps(mine))
    assert live_lock_holder(tmp_path) == mine
    (tmp_path / "lock.holder").write_text("[]")
    assert live_lock_holder(tmp_path) is None


def test_interrupted_lists_only_records_in_progress_whose_controller_died(tmp_path):
    ledger = Ledger(tmp_path / "c")
    dead = Controller(pid=_gone_pid(), host=socket.gethostname(), since="t")
    live = subprocess.Popen(["sleep", "60"])
    try:
        alive = Controller(pid=live.pid, host=socket.gethostname(), start_ticks=procfs.start_ticks(live.pid), since="t")
        for dep_id, status, ctl in (("20260101T000000Z-d5-0001", Status.SUCCESSFUL, dead),
                                    ("20260101T000001Z-d5-0002", Status.RUNNING, alive),
                                    ("20260101T000002Z-d5-0003", Status.RUNNING, dead)):
            ledger.save(_record(dep_id, status=status, controller=ctl))
            ledger.add_to_history(dep_id)
        assert [r.id for r in interrupted(ledger, locked=False)] == ["20260101T000002Z-d5-0003"]
        # under the lock every in-progress record but the caller's own is dead
        assert [r.id for r in interrupted(ledger, locked=True)] == ["20260101T000002Z-d5-0003",
                                                                     "20260101T000001Z-d5-0002"]
    finally:
        live.kill()
        live.wait()
