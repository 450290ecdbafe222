"""Every benchmark runs in its smoke mode (`--smoke`: one short round of its real code path) and prints its figures,
so none rots until someone runs it by hand (one died with a TypeError after its measurements once).

The list is generated from benchmarks/: a new `bench_*.py` is a test here at once, failing until testrig/benchrig.py
says what its smoke run prints (SMOKES) or why it has none (EXCLUDED). The embedded ones run here; those needing
the test cluster in tests/cluster/test_bench_smoke_cluster.py, the real engine's in
tests/realengine/test_bench_smoke_real.py, the real engine's in containers in
tests/cluster/test_bench_smoke_real_cluster.py (each with its tier's fixtures, markers and xdist group).
"""
from __future__ import annotations

import pytest

from testrig.benchrig import EXCLUDED, SMOKES, benchmark_names, run_smoke

TIERS_ELSEWHERE = {"cluster": "tests/cluster/test_bench_smoke_cluster.py",
                   "real_engine": "tests/realengine/test_bench_smoke_real.py",
                   "real_engine_cluster": "tests/cluster/test_bench_smoke_real_cluster.py"}


def _params() -> list:
    out = []
    for name in benchmark_names():
        if name in EXCLUDED:
            out.append(pytest.param(name, id=name, marks=pytest.mark.skip(reason=EXCLUDED[name])))
        elif name not in SMOKES or SMOKES[name].tier not in TIERS_ELSEWHERE:
            out.append(pytest.param(name, id=name))
    return out


def test_every_benchmark_has_a_smoke_run_or_a_reason():
    names = set(benchmark_names())
    assert len(names) >= 15, sorted(names)
    missing = sorted(names - SMOKES.keys() - EXCLUDED.keys())
    assert not missing, f"benchmarks without a smoke run: {missing}: give each `--smoke` and an entry in " \
                        "testrig/benchrig.py SMOKES (or EXCLUDED with the reason)"
    assert not (SMOKES.keys() | EXCLUDED.keys()) - names, "smoke entries for benchmarks that are gone"
    assert not SMOKES.keys() & EXCLUDED.keys()
    assert {s.tier for s in SMOKES.values()} <= {"embedded", *TIERS_ELSEWHERE}


@pytest.mark.parametrize("name", _params())
def test_benchmark_smoke_run_prints_its_figures(name, tmp_path):
    assert name in SMOKES, f"benchmarks/{name}.py has no smoke run: give it `--smoke` and an entry in " \
                           "testrig/benchrig.py SMOKES (or EXCLUDED with the reason)"
    run = run_smoke(name, tmp_path)
    assert run.returncode == 0, run.explain()
    missing = run.missing(SMOKES[name])
    assert not missing, f"figure lines not printed: {missing}\n{run.explain()}"
    print(f"{name} --smoke: {run.seconds:.1f} s")
