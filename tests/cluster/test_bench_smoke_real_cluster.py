"""benchmarks/bench_real_engine_image.py in its smoke mode (testrig/benchrig.py): on this session's real-engine
cluster (`real_engine_cluster`, the real-engine base loaded by testrig.realengine.base_image), handed over through
testrig.benchrig.cluster_env, in the real engine's worker and after test_real_engine_containers.py
(tests/cluster/conftest.py orders the smoke runs last). No engine boot and no copy of the ~2.7 GB images: the base,
the by-hand build of sparkctl's contexts, its figure lines; seconds."""
from __future__ import annotations

import pytest

from testrig.benchrig import SMOKES, cluster_env, run_smoke
from testrig.cluster import TestCluster
from testrig.realengine.base_image import ensure_real_engine_base
from testrig.testenv import need_real_engine

pytestmark = [pytest.mark.cluster, pytest.mark.real_engine, pytest.mark.xdist_group("real_engine_cluster")]
SHIPPED_D5 = True          # boots no d5: the cluster conftest's d5 fixture stays out of the way
NAMES = sorted(n for n, s in SMOKES.items() if s.tier == "real_engine_cluster")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.timeout(SMOKES[n].timeout_s + 900)) for n in NAMES])
def test_benchmark_smoke_run_prints_its_figures(name: str, tmp_path, real_engine_cluster: TestCluster) -> None:
    need_real_engine()
    ensure_real_engine_base(real_engine_cluster)     # loaded already when test_real_engine_containers.py ran
    run = run_smoke(name, tmp_path, cluster_env(real_engine_cluster))
    assert run.returncode == 0, run.explain()
    missing = run.missing(SMOKES[name])
    assert not missing, f"figure lines not printed: {missing}\n{run.explain()}"
    print(f"{name} --smoke: {run.seconds:.1f} s")
