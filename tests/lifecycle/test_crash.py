"""The controller itself dies: SIGKILL of `sparkctl up` in boot, warm-up and restore; SIGTERM like SIGINT.

After a SIGKILL, `status` tells the truth (exit 8, "interrupted (controller pid N gone)", the ranks alive),
the next `up --profile d5` settles what was left and deploys, and `down` leaves no engine (no process writing
to this ledger's rank logs, API ports free). Waits follow the killed command's progress on stderr.
"""
from __future__ import annotations

import json
import signal
import subprocess

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.observe import process_engines
from sparkctl.nodes.process import local_port_free
from sparkctl.state.ledger import Ledger
from sparkctl.state.records import Status
from testrig.controller import SLOW_PREFILL_TPS, SLOW_WARM_UP, SparkctlProcess, assert_status_interrupted, kill_up_at

SLOW = 60.0   # emulated boot / prefill seconds: far longer than the test needs to kill the controller in it


def _ledger(inv) -> Ledger:
    return Ledger.for_cluster(load_inventory(inv).cluster.name)


def _up_ok(cli, profile: str = "d5") -> dict:
    code, out, err = cli("up", "--profile", profile, "--yes", "--json")
    assert code == 0, err
    return json.loads(out)


def _newest(ledger: Ledger):
    return ledger.load(ledger.index()["history"][-1])


def _settle_and_clean(cli, local_cluster, dead_id: str) -> None:
    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
    assert code == 0, err
    assert f"of {dead_id}: deployment {dead_id} was interrupted" in err and "stopped rank 1" in err, err
    ledger = _ledger(local_cluster)
    dead = ledger.load(dead_id)
    assert dead.status == "interrupted" and not dead.known_good and dead.settled, dead
    code, out, err = cli("status")
    assert code == 0 and "healthy" in out and "interrupted" not in out, out
    code, out, err = cli("down", "--yes")
    assert code == 0 and "stopped rank 1" in out, out
    _no_engine(local_cluster)


def _no_engine(local_cluster) -> None:
    inv = load_inventory(local_cluster)
    assert process_engines(Cluster(inv)) == []
    assert all(local_port_free(n.api_bind, 30000) for n in inv.nodes)


def test_sigkill_during_boot(cli, local_cluster, faulty_profile):
    prev = _up_ok(cli)
    pid = kill_up_at(r"rank 0 started", faulty_profile({"boot_s": SLOW}), cli=cli)
    ledger = _ledger(local_cluster)
    dead = _newest(ledger)
    # What the dead controller wrote before each start: intent, then pid + start time; and who it was.
    assert dead.status == "running" and dead.controller.pid == pid and dead.controller.start_ticks
    assert [i.rank for i in dead.intents] == [1, 0] and all(i.engine.startswith("pid ") for i in dead.intents)
    assert_status_interrupted(cli, pid, "boot")
    _settle_and_clean(cli, local_cluster, dead.id)
    assert ledger.load(prev["deployment"]).known_good      # the good d5 was never marked failed


def test_sigkill_during_warm_up(cli, local_cluster, faulty_profile):
    pid = kill_up_at(r"\] warm-up ", faulty_profile({"prefill_tps": SLOW_PREFILL_TPS}, extra=SLOW_WARM_UP))
    dead = _newest(_ledger(local_cluster))
    assert_status_interrupted(cli, pid, "warm-up")
    _settle_and_clean(cli, local_cluster, dead.id)


def test_sigkill_during_restore(cli, local_cluster, faulty_profile, profiles_dir, tmp_path):
    prev = _up_ok(cli, faulty_profile({}))     # boots clean; its fault file is read again when it is restored
    (tmp_path / "sim-faults.json").write_text(json.dumps({"boot_s": SLOW}))
    bad = tmp_path / "bad-faults.json"
    bad.write_text(json.dumps({"ranks": {"1": {"crash_after_s": 0.3, "boot_s": 3.0}}}))
    (profiles_dir / "bad.yml").write_text(f"extends: dflash-off\nenv: {{SPARKCTL_SIM_CONFIG: '{bad}'}}\n")
    pid = kill_up_at(r"rank 0 started", "bad", after=r"restoring " + prev["deployment"])
    ledger = _ledger(local_cluster)
    failed = _newest(ledger)
    assert failed.status == "failed" and failed.restoring == prev["deployment"]
    assert_status_interrupted(cli, pid, f"restore of {prev['deployment']}")
    code, out, err = cli("up", "--profile", "d5", "--yes")
    assert code == 0, err
    assert f"restarted by the interrupted restore of {prev['deployment']}" in err, err
    failed = ledger.load(failed.id)
    assert failed.status == "failed" and failed.restoring is None and failed.restore_error is not None
    assert "restore interrupted" in failed.restore_error
    assert ledger.load(prev["deployment"]).known_good   # its restore was cut short, it did not fail
    code, out, err = cli("down", "--yes")
    assert code == 0, err
    _no_engine(local_cluster)


def test_a_verified_deployment_whose_controller_died_at_hand_off_is_adopted(cli, local_cluster):
    first = _up_ok(cli)
    second = _up_ok(cli, "dflash-off")
    ledger = _ledger(local_cluster)
    # As if the controller died between the last gate and the hand-off: record running, active still the old.
    assert subprocess.run(["true"]).returncode == 0
    gone = subprocess.Popen(["true"])
    gone.wait()
    rec = ledger.load(second["deployment"])
    rec.status, rec.handed_off = Status.RUNNING, None
    assert rec.controller is not None
    rec.controller = rec.controller.model_copy(update={"pid": gone.pid, "start_ticks": 1})
    ledger.save(rec)
    old = ledger.load(first["deployment"])
    old.status = Status.SUCCESSFUL
    ledger.save(old)
    ledger.set_active(first["deployment"])
    code, out, err = cli("up", "--profile", "dflash-off", "--yes", "--json")
    assert code == 0 and json.loads(out)["outcome"] == "unchanged", err
    assert f"adopted {second['deployment']} (dflash-off): its controller pid {gone.pid}" in err, err
    assert ledger.index()["active"] == second["deployment"]
    assert ledger.load(second["deployment"]).status == "successful"
    assert ledger.load(first["deployment"]).status == "superseded"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_are_handled_like_sigint(local_cluster, faulty_profile, sig):
    with SparkctlProcess(["up", "--profile", faulty_profile({"boot_s": SLOW}), "--yes"]) as run:
        run.wait_for("rank 0 started")
        run.kill(sig)
        code = run.wait()
    assert code == 128 + sig, run.stderr
    assert f"interrupted ({sig.name})" in run.stderr
    ledger = _ledger(local_cluster)
    rec = _newest(ledger)
    assert rec.status == "canceled" and rec.failure.message == f"interrupted ({sig.name})"
    assert rec.failure.step == "boot"
    _no_engine(local_cluster)
    with ledger.lock("check"):  # the lock is free again
        pass
