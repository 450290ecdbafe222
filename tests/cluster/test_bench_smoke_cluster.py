"""The benchmarks that need root and the test cluster, in their smoke mode (testrig/benchrig.py; the embedded ones'
are in tests/bench_smoke/): each on this session's cluster (`test_cluster`, or `test_cluster4` for the four-node
fan-out), handed over through testrig.benchrig.cluster_env instead of a cluster of its own, and left as it found it
(the image benchmarks smoke on a tiny base and remove only their own images; prepare restored). They run after every
other test of the tier (tests/cluster/conftest.py), so no other test sees a cluster a benchmark has been through.
bench_ssh_run needs root and sshd only (a loopback sshd of its own)."""
from __future__ import annotations

import os
import shutil

import pytest

from testrig.benchrig import SMOKES, cluster_env, run_smoke
from testrig.testenv import in_ci

NAMES = sorted(n for n, s in SMOKES.items() if s.tier == "cluster")
FIXTURE = {"bench_cluster_up": "test_cluster", "bench_image_pipeline": "test_cluster", "bench_prepare": "test_cluster",
           "bench_image_fanout": "test_cluster4"}


def _root_and_sshd() -> None:
    missing = ([] if os.geteuid() == 0 else ["not root"]) + ([] if shutil.which("sshd") or os.path.exists(
        "/usr/sbin/sshd") else ["no sshd"])
    if missing:
        if in_ci():
            pytest.fail(f"bench_ssh_run's prerequisites missing under CI: {', '.join(missing)}", pytrace=False)
        pytest.skip(f"bench_ssh_run needs root and sshd: {', '.join(missing)}")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.timeout(SMOKES[n].timeout_s + 900)) for n in NAMES])
def test_benchmark_smoke_run_prints_its_figures(name, tmp_path, request):
    env: dict[str, str] = {}
    if name in FIXTURE:
        env = cluster_env(request.getfixturevalue(FIXTURE[name]))
    else:
        _root_and_sshd()
    run = run_smoke(name, tmp_path, env)
    assert run.returncode == 0, run.explain()
    missing = run.missing(SMOKES[name])
    assert not missing, f"figure lines not printed: {missing}\n{run.explain()}"
    print(f"{name} --smoke: {run.seconds:.1f} s")


def test_every_cluster_benchmark_runs_here_on_a_session_cluster():
    """Every cluster-tier smoke run but bench_ssh_run (its own loopback sshd) gets a session cluster: a new one
    would otherwise bring up a cluster of its own beside the session's."""
    assert set(NAMES) - set(FIXTURE) == {"bench_ssh_run"}, NAMES
