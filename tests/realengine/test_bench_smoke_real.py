"""benchmarks/bench_real_engine.py and bench_vllm_card.py in their smoke mode (testrig/benchrig.py; the embedded
benchmarks' smoke runs are in tests/bench_smoke/): the cheapest run of each of its parts on the real engine (three
real SGLang boots, one real vLLM boot: minutes, not seconds), its figure lines printed."""
from __future__ import annotations

import pytest

from testrig.benchrig import SMOKES, run_smoke
from testrig.testenv import need_real_engine, need_real_vllm

NAMES = sorted(n for n, s in SMOKES.items() if s.tier == "real_engine")


@pytest.mark.timeout(1900)
@pytest.mark.parametrize("name", NAMES)
def test_benchmark_smoke_run_prints_its_figures(name, tmp_path):
    need_real_engine()
    if "vllm" in name:         # bench_vllm_card: vLLM's environment too (a skip or CI failure, as for SGLang's)
        need_real_vllm()
    run = run_smoke(name, tmp_path)
    assert run.returncode == 0, run.explain()
    missing = run.missing(SMOKES[name])
    assert not missing, f"figure lines not printed: {missing}\n{run.explain()}"
    print(f"{name} --smoke: {run.seconds:.1f} s")
