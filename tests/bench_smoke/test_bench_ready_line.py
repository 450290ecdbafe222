"""benchmarks/bench_real_engine.py times each engine's boot to rank 0's ready line as sparkctl's own log dialect reads
it: SGLang's "fired up" line, vLLM's uvicorn "Application startup complete.". Its smoke run (tests/realengine) takes
the SGLang path on the real engine; this holds the line each engine's timing waits for to real captured logs, read
whole and cut at that line (every line before it: not ready)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
LOGS = {"sglang": FIXTURES / "real-engine" / "0.5.23" / "tp2" / "server-rank0.log",
        "vllm": FIXTURES / "captures" / "vllm-0.32.0-cpu" / "tp2-rank0.log"}
READY = {"sglang": "The server is fired up and ready to roll!", "vllm": "Application startup complete."}


def _bench():
    spec = importlib.util.spec_from_file_location("bench_real_engine", ROOT / "benchmarks" / "bench_real_engine.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("engine", sorted(LOGS))
def test_the_benchmark_waits_for_each_engines_own_ready_line(engine: str) -> None:
    ready = _bench()._is_ready_line(engine)
    text = LOGS[engine].read_text(encoding="utf-8", errors="replace")
    at = text.index(READY[engine])
    assert ready(text) and ready(text[text.rfind("\n", 0, at) + 1:])
    assert not ready(text[:text.rfind("\n", 0, at) + 1]), "a line before the ready line was read as ready"
    other = "vllm" if engine == "sglang" else "sglang"
    assert not _bench()._is_ready_line(other)(text[:text.rfind("\n", 0, at) + 1])
