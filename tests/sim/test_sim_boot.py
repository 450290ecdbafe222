"""Single-node boot: milestones in order, health, argv rejection, clean shutdown."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

import httpx

from testrig.simproc import REPO

HYBRID = ["--mamba-full-memory-ratio", "2", "--context-length", "65536", "--kv-cache-dtype", "bf16"]


def test_boot_prints_milestones_in_order(sim):
    p = sim(HYBRID + ["--max-total-tokens", "131072"])
    p.wait_ready()
    text = p.text
    milestones = [
        "this is the sparkctl SGLang emulator",
        "server_args={'model_path': ",   # 0.5.23 prints a dict (the real engine's log)
        "Init torch distributed begin.",
        "Load weight begin. avail mem=",
        "Load weight end. elapsed=",
        "Mamba Cache is allocated. max_mamba_cache_size: 3, conv_state size: ",
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 64832, K size: ",
        "max_running_requests is capped to 1 by the mamba state cache",
        "max_total_num_tokens=64832, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=1, context_len=65536, available_gpu_mem=",
        "INFO:     Uvicorn running on http://127.0.0.1:",
        "The server is fired up and ready to roll!",
    ]
    pos = [text.find(m) for m in milestones]
    assert all(i >= 0 for i in pos), dict(zip(milestones, pos))
    assert pos == sorted(pos)
    assert "CustomAllreduce is disabled" not in text          # single node
    assert "Mamba Cache is allocated." in text and "ssm_state size: " in text
    r = httpx.get(p.url("/health"))
    assert r.status_code == 200 and r.content == b""


def test_log_is_understood_by_sparkctl_logparse(sim):
    from sparkctl.sglang.bootwatch import LogFollower
    p = sim(HYBRID)
    p.wait_ready()
    follower = LogFollower()
    for line in p.lines:
        follower.feed(line)
    assert follower.ready


def test_not_hybrid_uses_max_running_requests(sim):
    p = sim(["--max-running-requests", "4"])
    p.wait_ready()
    assert "max_running_requests=4," in p.text
    assert "capped" not in p.text and "Mamba Cache" not in p.text


def test_unknown_flag_rejected_like_argparse():
    r = subprocess.run([sys.executable, "-m", "sparkctl.sim", "--model-path", "m", "--bogus-flag", "1"],
                       capture_output=True, text=True, cwd=str(REPO), timeout=30)
    assert r.returncode == 2
    assert "launch_server.py: error: unrecognized arguments: --bogus-flag 1" in r.stderr


def _launch(argv: list[str], version: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCTL_SIM_")}
    env["SPARKCTL_SIM_SGLANG_VERSION"] = version
    return subprocess.run([sys.executable, "-m", "sparkctl.sim", "--model-path", "m", *argv],
                          capture_output=True, text=True, cwd=str(REPO), timeout=30, env=env)


def test_unknown_speculative_algorithm_fails_start_up_like_sglang():
    """0.5.23's parser takes any string; its launcher dies resolving the name (SpeculativeAlgorithm.from_string),
    exit 1, before any process or port; a known name in any case resolves (from_string upper-cases it)."""
    r = _launch(["--speculative-algorithm", "FOOBAR"], "0.5.23")
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: Unknown speculative algorithm name: FOOBAR"
    assert 'speculative/spec_info.py", line 65, in from_string' in lines[-3]
    assert "in handle_speculative_decoding" in r.stderr and "server_args.resolve_once()" in r.stderr
    from sparkctl.sim.args import startup_error
    for name in ("DFLASH", "dflash", "NEXTN", "FROZEN_KV_MTP"):
        assert startup_error(argparse.Namespace(speculative_algorithm=name), "0.5.23") is None
    # 0.5.11 and 0.5.3.post3 have argparse choices: refused by the parser (exit 2), as the real one does
    r = _launch(["--speculative-algorithm", "FOOBAR"], "0.5.11")
    assert r.returncode == 2 and "argument --speculative-algorithm: invalid choice: 'FOOBAR'" in r.stderr


def test_sigterm_shuts_down_cleanly(sim):
    p = sim()
    p.wait_ready()
    p.kill(signal.SIGTERM)
    assert p.wait_exit(10) == 0
    assert "SIGTERM received. signum=None frame=None. Draining requests and shutting down..." in p.text
    try:
        httpx.get(p.url("/health"), timeout=1)
        raise AssertionError("port still open")
    except httpx.ConnectError:
        pass


def test_unknown_knob_is_an_error(sim):
    p = sim(knobs={"decode_tsp": 3})
    assert p.wait_exit(10) == 2
    assert "did you mean 'decode_tps'" in p.text
