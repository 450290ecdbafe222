"""benchmarks/bench_real_engine.py and bench_vllm_card.py in their smoke mode (testrig/benchrig.py; the embedded
benchmarks' smoke runs are in tests/bench_smoke/): the cheapest run of each of its parts on the real engine (three
real SGLang boots, one real vLLM boot: minutes, not seconds), its figure lines printed."""
from __future__ import annotations

import pytest

from testrig.benchrig import SMOKES, run_smoke
from testrig.testenv import need_real_engine, need_real_vllm

NAMES = sorted(n for n, s in SMOKES.items() if s.tier == "real_engine")


@pytest.mark.timeout(1900)
# vLLM's smoke in the container tier's worker, beside the loopback real SGLang (the suite's critical path): its one
# TP=1 server binds nothing SGLang's tests hold
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xdist_group("real_engine_cluster")) if "vllm" in n
                                  else n for n in NAMES])
def test_benchmark_smoke_run_prints_its_figures(name, tmp_path):
    need_real_engine()
    if "vllm" in name:         # bench_vllm_card: vLLM's environment too (a skip or CI failure, as for SGLang's)
        need_real_vllm()
    run = run_smoke(name, tmp_path)
    assert run.returncode == 0, run.explain()
    missing = run.missing(SMOKES[name])
    assert not missing, f"figure lines not printed: {missing}\n{run.explain()}"
    print(f"{name} --smoke: {run.seconds:.1f} s")
