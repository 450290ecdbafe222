"""SIGKILL of one engine (not the controller) at boot, during warm-up and after hand-off: the failed `up` restores
the previous deployment; after hand-off `status` says UNHEALTHY (exit 8) and the next `up` of the same profile
redeploys instead of saying "unchanged"."""
from __future__ import annotations

import contextlib
import json
import os
import signal

from sparkctl.config.inventory import load_inventory
from sparkctl.state.ledger import Ledger
from testrig.controller import SLOW_PREFILL_TPS, SLOW_WARM_UP, SparkctlProcess
from testrig.handles import pid_of
from testrig.testenv import signal_and_settle

SLOW = 30.0


def _ledger(inv) -> Ledger:
    return Ledger.for_cluster(load_inventory(inv).cluster.name)


def _up(cli, profile="d5") -> dict:
    code, out, err = cli("up", "--profile", profile, "--yes", "--json")
    assert code == 0, err
    return json.loads(out)


def _kill_rank_during(cli, local_cluster, profile: str, marker: str, rank: int) -> tuple[int, str]:
    ledger = _ledger(local_cluster)
    with SparkctlProcess(["up", "--profile", profile, "--yes"]) as run:
        run.wait_for(marker)
        rec = ledger.load(ledger.history()[-1])
        os.kill(pid_of(rec, rank), signal.SIGKILL)
        code = run.wait()
    return code, run.stderr


def _restored(cli, prev: dict, err: str) -> None:
    assert f"restored {prev['deployment']}" in err, err
    code, out, _ = cli("status", "--json")
    st = json.loads(out)
    assert code == 0 and st["healthy"] and st["active"] == prev["deployment"], out


def test_an_engine_killed_at_boot_fails_the_up_and_the_previous_one_is_restored(cli, local_cluster, faulty_profile):
    prev = _up(cli)
    code, err = _kill_rank_during(cli, local_cluster, faulty_profile({"boot_s": SLOW}, base="dflash-off"),
                                  r"rank 0 started", 1)
    assert code == 4 and "boot failed on rank 1" in err and "died" in err, err
    _restored(cli, prev, err)


def test_an_engine_killed_during_warm_up_fails_the_up_and_the_previous_one_is_restored(cli, local_cluster,
                                                                                       faulty_profile):
    prev = _up(cli)
    profile = faulty_profile({"prefill_tps": SLOW_PREFILL_TPS}, base="dflash-off", extra=SLOW_WARM_UP)
    code, err = _kill_rank_during(cli, local_cluster, profile, r"\] warm-up ", 0)
    assert code == 4 and "warm-up" in err, err
    _restored(cli, prev, err)


def test_an_engine_killed_after_hand_off_is_unhealthy_and_the_next_up_redeploys(cli, local_cluster):
    first = _up(cli)
    rec = _ledger(local_cluster).load(first["deployment"])
    os.kill(pid_of(rec, 1), signal.SIGKILL)
    code, out, err = cli("status")
    assert code == 8 and "UNHEALTHY" in out, out
    again = _up(cli)
    assert again["outcome"] == "deployed" and again["deployment"] != first["deployment"], again
    code, out, _ = cli("status", "--json")
    assert code == 0 and json.loads(out)["healthy"]
    code, out, err = cli("down", "--yes")
    assert code == 0, err


def test_a_stopped_engine_is_not_running_in_status_and_the_next_up_replaces_it(cli, local_cluster):
    """SIGSTOP of rank 1's engine (behind its live log pipe): the PID exists and holds its port, yet it serves
    nothing. `status` says it is stopped and how to resume it (exit 8), an `up` of the same profile replaces the
    pair; SIGCONT of a stopped engine makes `status` healthy again."""
    from sparkctl.nodes import procfs

    first = _up(cli)
    pipe = pid_of(_ledger(local_cluster).load(first["deployment"]), 1)
    engine = procfs.descendants(pipe)[0]
    signal_and_settle(engine, signal.SIGSTOP)
    try:
        code, out, err = cli("status", "--json")
        data = json.loads(out)
        assert code == 8 and not data["healthy"], out
        rank1 = next(r for r in data["ranks"] if r["rank"] == 1)
        assert not rank1["alive"] and f"pid {engine}" in rank1["state"] and "state T" in rank1["state"], rank1
        assert f"kill -CONT {engine}" in rank1["state"], rank1
        signal_and_settle(engine, signal.SIGCONT)
        code, out, _ = cli("status", "--json")
        assert code == 0 and json.loads(out)["healthy"], out
        os.kill(engine, signal.SIGSTOP)
        again = _up(cli)
        assert again["outcome"] == "deployed" and again["deployment"] != first["deployment"], again
        assert not procfs.running(engine, None) or procfs.proc_stat(engine) is None, "the stopped engine was left"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(engine, signal.SIGCONT)
    code, out, _ = cli("status", "--json")
    assert code == 0 and json.loads(out)["healthy"]
    code, out, err = cli("down", "--yes")
    assert code == 0, err
