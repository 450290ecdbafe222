"""Fault knobs: each one shows up the way the real failure does in the captures."""
from __future__ import annotations

import time

import httpx


def test_fail_load_oom(sim):
    p = sim(knobs={"fail_load_oom": True})
    assert p.wait_exit(10) != 0
    text = p.text
    assert "Load weight begin." in text and "Load weight end." not in text
    assert "Scheduler hit an exception: Traceback (most recent call last):" in text
    assert "torch.OutOfMemoryError: CUDA out of memory." in text
    assert "Rank 0 scheduler is dead. Please check if there are relevant logs." in text
    assert "fired up" not in text


def test_hang_at_init_single_node(sim):
    p = sim(knobs={"hang_at_init": True})
    p.wait_for("Init torch distributed begin.")
    time.sleep(1.0)
    assert p.proc.poll() is None and "Load weight begin" not in p.text


def test_crash_after_s(sim):
    # crash_after_s counts from process start: at load 13 the boot took longer than 1 s and the crash came first.
    p = sim(knobs={"crash_after_ready_s": 0.3})
    p.wait_ready()
    assert p.wait_exit(10) != 0
    assert "Scheduler hit an exception: Traceback (most recent call last):" in p.text
    assert "Received sigquit from a child process. It usually means the child failed." in p.text


def test_crash_during_boot_has_launcher_tail(sim):
    p = sim(knobs={"crash_after_s": 0.2, "boot_s": 2.0})
    assert p.wait_exit(10) != 0
    assert "Rank 0 scheduler is dead" in p.text and "EOFError" in p.text and "fired up" not in p.text


def test_never_healthy(sim):
    p = sim(knobs={"never_healthy": True})
    p.wait_for("Uvicorn running on")
    time.sleep(0.5)
    assert httpx.get(p.url("/health")).status_code == 503
    assert httpx.get(p.url("/health_generate")).status_code == 503
    assert httpx.get(p.url("/v1/models")).status_code == 200
    assert "fired up" not in p.text
    assert '"GET /health HTTP/1.1" 503 Service Unavailable' in p.text


def test_slow_boot(sim):
    t0 = time.monotonic()
    p = sim(knobs={"boot_s": 1.5})
    p.wait_ready(10)
    assert time.monotonic() - t0 > 1.2
