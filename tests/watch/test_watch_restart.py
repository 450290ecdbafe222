"""The watcher brings a failed TP group back as a group, in order, through `up`'s own steps and gates, with no
command typed: a rank killed, a rank SIGSTOPped, every engine gone across a watcher restart (a reboot), and a
watcher killed with -9 in the middle of a restart."""
from __future__ import annotations

import os
import re
import signal

from sparkctl.config.inventory import load_inventory
from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.observe import process_engines
from testrig.handles import pid_of, pids
from testrig.watchrig import (
    alive,
    engine_pid,
    killed_mid_restart,
    ledger_of,
    polls_after,
    serves,
    status,
    up,
    wait_until,
)


def _restarted(run, old: str) -> str:
    """The new deployment id once the watcher says it restarted `old`; checks the group was booted in order."""
    line = run.wait_for(rf"restarted {re.escape(old)} as (\S+)", timeout=90)
    m = re.search(r" as (\S+) ", line)
    assert m, line
    new = m.group(1)
    after = run.stderr[run.stderr.index(f"restarting {old}"):]
    assert after.index("rank 1 started") < after.index("rank 0 started"), after
    for gate in ("health", "models", "settings", "capacity", "workers", "smoke"):
        assert f"PASS {gate}:" in after, after
    return new


def _serving_again(cli, new: str) -> dict:
    code, st = status(cli)
    assert code == 0 and st["healthy"] and st["active"] == new, st
    assert [r["alive"] for r in st["ranks"]] == [True, True]
    assert serves(st["endpoint"])
    return st


def test_rank_1_killed_after_hand_off_the_group_is_restarted_in_order_and_serves(cli, local_cluster, watcher):
    first = up(cli)
    old = first["deployment"]
    rec = ledger_of(local_cluster).load(old)
    run = watcher()
    os.kill(pid_of(rec, 1), signal.SIGKILL)
    # rank-dead (rank 0 still up), or engines-gone if rank 0 already followed its peer (the emulator's peer timeout)
    run.wait_for(rf"detected: {re.escape(old)} is not serving \((rank-dead|engines-gone)\): rank 1 not running")
    new = _restarted(run, old)
    assert "page cache left alone (embedded cluster: nothing is dropped on this machine)" in run.stderr
    st = _serving_again(cli, new)
    assert st["profile"] == "d5"
    w = st["watcher"]
    assert w["running"] and w["pid"] == run.pid and w["restarts"] == 1 and w["failures"] == 0
    assert w["last_action"].startswith(f"restarted {old} as {new}") and w["time_to_recover_s"] > 0
    # the survivor (rank 0 of the old group) was stopped too: the whole group restarted, nothing of it left
    assert not alive(pid_of(rec, 0))
    code, out, _ = cli("status")
    assert f"watcher: running (pid {run.pid}" in out and "restarts 1 (0 failed)" in out


def test_a_sigstopped_rank_counts_as_not_running_and_the_group_is_restarted(cli, local_cluster, watcher):
    old = up(cli)["deployment"]
    rec = ledger_of(local_cluster).load(old)
    stopped = engine_pid(pid_of(rec, 1))
    run = watcher()
    os.kill(stopped, signal.SIGSTOP)
    run.wait_for(rf"\(rank-stopped\): rank 1 stopped \(pid {stopped}, under pid \d+ is in state T")
    new = _restarted(run, old)
    _serving_again(cli, new)
    wait_until(lambda: not alive(stopped), "the stopped engine to be gone (continued, then it took its SIGTERM)", 20)


def test_every_engine_gone_and_a_new_watcher_after_a_reboot_restores_the_deployment(cli, local_cluster, watcher):
    old = up(cli)["deployment"]
    rec = ledger_of(local_cluster).load(old)
    for pid in pids(rec):                       # a reboot: every engine gone, no watcher running
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not any(alive(pid) for pid in pids(rec)), "the engines to be gone", 20)
    code, st = status(cli)
    assert code == 8 and not st["healthy"]
    run = watcher()                             # systemd starts the watcher again at boot
    run.wait_for(rf"detected: {re.escape(old)} is not serving \(engines-gone\)")
    new = _restarted(run, old)
    _serving_again(cli, new)


def test_a_watcher_killed_with_kill_9_mid_restart_and_a_new_one_converges(cli, local_cluster, watcher):
    old, first = killed_mid_restart(cli, local_cluster, watcher)
    first.kill(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL
    code, st = status(cli)
    assert st["watcher"]["running"] is False and st["watcher"]["pid"] == first.pid
    second = watcher()                          # the dead watcher's lock went with it
    polls_after(ledger_of(local_cluster).root, 2)

    def healthy() -> dict | None:
        code, st = status(cli)
        return st if code == 0 and st["healthy"] else None
    st = wait_until(healthy, "the cluster serving again under the second watcher", 90)
    assert st["watcher"]["pid"] == second.pid and st["watcher"]["running"]
    assert serves(st["endpoint"])
    running = process_engines(Cluster(load_inventory(local_cluster)))
    assert sorted(e.handle.rank for e in running) == [0, 1], running     # one group, nothing half-started left
    assert {e.deployment for e in running} == {st["active"]}
