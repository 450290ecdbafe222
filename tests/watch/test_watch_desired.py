"""The watcher never fights a person: a user's `down` or `up` becomes its desired state, a profile that can no longer
boot ends in a rollback and a watcher that stops acting (and says why), one watcher per cluster, and SIGTERM in
the middle of a restart leaves a whole group (restored), never half of one."""
from __future__ import annotations

import json
import os
import re
import signal

from sparkctl.config.inventory import load_inventory
from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.observe import process_engines
from testrig.controller import SparkctlProcess
from testrig.handles import pid_of
from testrig.watchrig import alive, killed_mid_restart, ledger_of, polls_after, serves, status, up, watch_state


def _engines(inv) -> list:
    return process_engines(Cluster(load_inventory(inv)))


def test_down_while_watching_stays_down(cli, local_cluster, watcher):
    old = up(cli)["deployment"]
    run = watcher()
    code, _, err = cli("down", "--yes")
    assert code == 0, err
    run.wait_for(rf"followed a command: desired state {re.escape(old)} -> down")
    polls_after(ledger_of(local_cluster).root, 5)
    assert _engines(local_cluster) == []
    code, st = status(cli)
    assert code == 0 and st["active"] is None
    assert st["watcher"]["desired"] == "down" and st["watcher"]["restarts"] == 0 and st["watcher"]["running"]
    assert "restarting" not in run.stderr


def test_up_of_another_profile_while_watching_is_followed(cli, local_cluster, watcher):
    first = up(cli)["deployment"]
    run = watcher()
    off = up(cli, "dflash-off")["deployment"]
    run.wait_for(rf"followed a command: desired state {re.escape(first)} -> {re.escape(off)}")
    rec = ledger_of(local_cluster).load(off)
    os.kill(pid_of(rec, 1), signal.SIGKILL)
    line = run.wait_for(rf"restarted {re.escape(off)} as (\S+)", timeout=90)
    m = re.search(r" as (\S+) ", line)
    assert m, line
    new = m.group(1)
    code, st = status(cli)
    assert code == 0 and st["healthy"] and st["active"] == new and st["profile"] == "dflash-off", st
    assert st["speculative_algorithm"] is None           # it kept the user's choice, not the first profile
    assert serves(st["endpoint"])


def test_a_users_up_in_progress_is_waited_for_never_fought(cli, local_cluster, watcher, fault_profile):
    first = up(cli)["deployment"]
    run = watcher()
    name, _ = fault_profile("slowboot", {"boot_s": 4.0})
    with SparkctlProcess(["up", "--profile", name, "--yes", "--json"]) as user:
        user.wait_for("rank 1 started")                    # the old group is stopped: nothing serves now
        run.wait_for(rf"waiting: `sparkctl up` \(pid {user.pid} on ")
        assert user.wait(timeout=120) == 0, user.stderr
        new = json.loads(user.stdout)["deployment"]
    run.wait_for(rf"followed a command: desired state {re.escape(first)} -> {re.escape(new)}")
    polls_after(ledger_of(local_cluster).root, 3)
    assert "restarting" not in run.stderr
    code, st = status(cli)
    assert code == 0 and st["healthy"] and st["active"] == new and st["watcher"]["restarts"] == 0


def test_a_profile_that_can_no_longer_boot_hits_the_crash_loop_limit_rolls_back_and_stops_acting(
        cli, local_cluster, watcher, fault_profile):
    good = up(cli)["deployment"]                          # d5: the last known-good before the broken one
    name, faults = fault_profile("brittle", {})
    broken = up(cli, name)["deployment"]                  # boots clean now
    faults.write_text(json.dumps({"fail_load_oom": True}))   # ... and never again
    run = watcher("--max-failures", "2", "--window", "600")
    os.kill(pid_of(ledger_of(local_cluster).load(broken), 1), signal.SIGKILL)
    line = run.wait_for(r"gave up: crash loop: 2 failed restarts of", timeout=120)
    assert "restart of" in run.stderr and "failed" in run.stderr
    assert "next attempt in" in run.stderr                 # backoff between the two attempts
    assert "rolled back to" in line and "(d5)" in line and "no longer acts" in line, line
    code, st = status(cli)
    assert code == 0 and st["healthy"] and st["profile"] == "d5" and st["active"] != good, st   # a new d5 deployment
    w = st["watcher"]
    assert w["running"] and w["gave_up"] and w["failures"] == 2 and w["rollbacks"] == 1, w
    code, out, _ = cli("status")
    assert "watcher gave up: crash loop" in out
    # It stopped acting: a rank killed now is seen and reported, never restarted.
    rolled = st["active"]
    os.kill(pid_of(ledger_of(local_cluster).load(rolled), 1), signal.SIGKILL)
    run.wait_for(rf"detected: {re.escape(rolled)} is not serving", after=r"gave up")
    run.wait_for(r"not acting: crash loop", after=r"gave up")
    polls_after(ledger_of(local_cluster).root, 5)
    assert watch_state(ledger_of(local_cluster).root).restarts == w["restarts"]
    assert "restarting" not in run.stderr[run.stderr.index("gave up"):]
    # A user's command is a new desired state: the watcher acts again.
    up(cli)
    run.wait_for(r"a command changed the cluster after the watcher gave up: acting again")
    assert watch_state(ledger_of(local_cluster).root).gave_up is None


def test_a_second_watcher_of_the_same_cluster_is_refused(cli, local_cluster, watcher):
    up(cli)
    first = watcher()
    code, out, err = cli("watch", "--interval", "0.3")
    assert code == 5, err
    assert f"already watched by pid {first.pid}" in err and "fix:" in err and "one watcher per cluster" in err
    assert first.proc.poll() is None                       # the first one goes on
    first.kill(signal.SIGINT)                              # Ctrl-C between checks: it ends at once, cleanly
    assert first.wait(timeout=30) == 130 and "watch      watcher stopped" in first.stderr
    code, out, _ = cli("status")
    assert code == 0 and f"watcher: not running (last: pid {first.pid} on" in out and ", stopped 20" in out, out


def test_sigterm_during_a_restart_finishes_or_restores_the_group_never_half(cli, local_cluster, watcher):
    _, run = killed_mid_restart(cli, local_cluster, watcher)
    run.kill(signal.SIGTERM)
    assert run.wait() == 143, run.stderr
    assert "sparkctl: interrupted (SIGTERM)" in run.stderr
    code, st = status(cli)
    assert code == 0 and st["healthy"], st                 # the previous deployment restored, whole
    running = _engines(local_cluster)
    assert sorted(e.handle.rank for e in running) == [0, 1] and {e.deployment for e in running} == {st["active"]}
    assert st["watcher"]["running"] is False and st["watcher"]["stopped"]
    assert not alive(run.pid)


def test_a_damaged_ledger_is_reported_and_nothing_is_decided_from_it(cli, local_cluster, watcher):
    dep = up(cli)["deployment"]
    ledger = ledger_of(local_cluster)
    run = watcher()
    path = ledger.deployment_path(dep)
    good = path.read_bytes()
    path.write_text("[]")                                  # damaged: never read as "nothing deployed"
    run.wait_for(r"cannot check the cluster now: .*" + re.escape(str(path)))
    assert "repair" in run.stderr
    polls_after(ledger.root, 3)
    assert run.proc.poll() is None and "restarting" not in run.stderr and "followed a command" not in run.stderr
    path.write_bytes(good)
    run.wait_for(r"watch +checking again")
    code, st = status(cli)
    assert code == 0 and st["healthy"] and st["watcher"]["restarts"] == 0
