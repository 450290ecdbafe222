"""SIGKILL of `sparkctl up` over SSH + Docker on the two-node test cluster: in boot, warm-up and restore.

After each kill, `status` exits 8 naming the dead controller and the live ranks; the next `up --profile d5`
stops what was left (found by label) and deploys; `down` leaves no engine container running
(`docker ps --filter label=sparkctl.cluster=...` on both nodes). Slow phases come from the emulator's knobs in
the profile's env (SPARKCTL_SIM_<KNOB> in the container), waits from the killed command's stderr.
"""
from __future__ import annotations

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.state.ledger import Ledger
from testrig.controller import SLOW_PREFILL_TPS, SLOW_WARM_UP, assert_status_interrupted, kill_up_at
from testrig.handles import docker_handles
from tests.cluster.test_cluster_lifecycle import _running, _up, cluster_env  # noqa: F401 (fixture)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


def _profile(profiles_dir, name: str, base: str, extra: str = "", **knobs: float) -> str:
    env = ", ".join(f"SPARKCTL_SIM_{k.upper()}: '{v}'" for k, v in knobs.items())
    (profiles_dir / f"{name}.yml").write_text(f"extends: {base}\nenv: {{{env}}}\n{extra}")
    return name


def _settle_deploy_down(cli, test_cluster, inv, dead_id: str) -> None:
    code, out, err = _up(cli, "--profile", "d5")
    assert code == 0 and out is not None and out["outcome"] == "deployed", err
    assert f"of {dead_id}: deployment {dead_id} was interrupted" in err and "stopped rank 1 (container" in err, err
    ledger = Ledger.for_cluster(load_inventory(inv).cluster.name)
    assert ledger.load(dead_id).status == "interrupted"
    code, st, err = cli("status")
    assert code == 0 and "healthy" in st, st + err
    code, out, err = cli("down", "--yes")
    assert code == 0, err
    cluster = load_inventory(inv).cluster.name
    assert _running(test_cluster, "spark-a", cluster) == [] and _running(test_cluster, "spark-b", cluster) == []


def test_sigkill_during_boot_and_warm_up(cli, test_cluster, cluster_env, profiles_dir):  # noqa: F811 (fixture)
    ledger = Ledger.for_cluster(load_inventory(cluster_env).cluster.name)
    pid = kill_up_at(r"\[spark-a\] rank 0 started", _profile(profiles_dir, "slowboot", "d5", boot_s=60), cli=cli)
    dead = ledger.load(ledger.index()["history"][-1])
    assert [i.engine for i in dead.intents] == [f"container {h.container}" for h in docker_handles(dead)]
    assert_status_interrupted(cli, pid, "boot")
    _settle_deploy_down(cli, test_cluster, cluster_env, dead.id)

    # warm-up: this time `down` settles it (it reconciles too) and leaves nothing running
    pid = kill_up_at(r"\] warm-up ", _profile(profiles_dir, "slowwarm", "dflash-off", SLOW_WARM_UP,
                                                    prefill_tps=SLOW_PREFILL_TPS))
    dead_id = ledger.index()["history"][-1]
    assert_status_interrupted(cli, pid, "warm-up")
    code, out, err = cli("down", "--yes")
    assert code == 0 and "stopped rank 1 (container" in out and f"deployment {dead_id} was interrupted" in err, err
    assert ledger.load(dead_id).status == "interrupted"
    cluster = load_inventory(cluster_env).cluster.name
    assert _running(test_cluster, "spark-a", cluster) == [] and _running(test_cluster, "spark-b", cluster) == []


def test_sigkill_during_restore(cli, test_cluster, cluster_env, profiles_dir):  # noqa: F811 (fixture)
    code, prev, err = _up(cli, "--profile", _profile(profiles_dir, "slowish", "dflash-off", boot_s=8))
    assert code == 0 and prev is not None, err
    bad = _profile(profiles_dir, "crashy", "d5", crash_after_s=0.5)
    pid = kill_up_at(r"\[spark-a\] rank 0 started", bad, after="restoring " + prev["deployment"])
    ledger = Ledger.for_cluster(load_inventory(cluster_env).cluster.name)
    failed = ledger.load(ledger.index()["history"][-1])
    assert failed.restoring == prev["deployment"]
    assert_status_interrupted(cli, pid, f"restore of {prev['deployment']}")
    code, out, err = _up(cli, "--profile", "d5")
    assert code == 0 and out is not None, err
    assert f"restarted by the interrupted restore of {prev['deployment']}" in err, err
    assert ledger.load(prev["deployment"]).known_good
    code, _, err = cli("down", "--yes")
    cluster = load_inventory(cluster_env).cluster.name
    assert code == 0 and _running(test_cluster, "spark-a", cluster) == [] == _running(test_cluster, "spark-b", cluster)


@pytest.mark.parametrize("point,profile", [("up:boot:after", "dflash-off"), ("up:hand-off:before", "dflash-off"),
                                           ("up:hand-off:after", "dflash-off"), ("up:restore-boot:after", "crashy")])
def test_sigkill_at_step_boundaries_over_ssh_and_docker(cli, test_cluster, cluster_env,  # noqa: F811 (fixture)
                                                        profiles_dir, point, profile):
    """A subset of the embedded crash matrix (tests/lifecycle/test_crash_matrix.py) on real containers: the
    controller SIGKILLs itself at the boundary (SPARKCTL_CRASH_AT, from deploy/steps.py); `status` exits 0 only
    when the active deployment serves; the next `up` converges; `down` leaves no container."""
    import json
    import os
    import signal

    from sparkctl.deploy.steps import CRASH_ENV
    from testrig.controller import SparkctlProcess

    _profile(profiles_dir, "crashy", "d5", crash_after_s=0.5)
    code, prev, err = _up(cli, "--profile", "d5")
    assert code == 0 and prev is not None, err
    with SparkctlProcess(["up", "--profile", profile, "--yes"], env={**os.environ, CRASH_ENV: point}) as run:
        assert run.wait(timeout=400) == -signal.SIGKILL, run.stderr
    code, out, err = cli("status", "--json")
    st = json.loads(out)
    assert code in (0, 8), err
    if code == 0:
        assert st["healthy"] and st["active"], out
    code, out, err = _up(cli, "--profile", "d5")
    assert code == 0 and out is not None and out["outcome"] in ("deployed", "unchanged"), err
    code, st, err = cli("status")
    assert code == 0 and "healthy" in st, st + err
    code, out, err = cli("down", "--yes")
    assert code == 0, err
    cluster = load_inventory(cluster_env).cluster.name
    assert _running(test_cluster, "spark-a", cluster) == [] == _running(test_cluster, "spark-b", cluster)
