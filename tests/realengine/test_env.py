"""The real-engine environment (testrig.realengine): keyed by its inputs, deterministic models that load, and a
preflight message that names the build command. Light on purpose: the server boots are tested elsewhere.

Builds the environment if it is missing (~2 min, once per key); CI builds it in .ci/run before the tests.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import testrig.realengine as realengine
from testrig.realengine import build as rebuild
from testrig.testenv import need_real_engine

pytestmark = [pytest.mark.real_engine, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def engine():
    return need_real_engine()


def test_key_covers_every_input_and_names_the_directory(engine, monkeypatch):
    inputs = {p.relative_to(rebuild.HERE).as_posix() for p in rebuild.key_inputs()}
    assert {"requirements.txt", "make_model.py", "build.py", "stubs/sgl_kernel/__init__.py",
            "stubs/torchvision/__init__.py"} <= inputs
    assert realengine.key() == realengine.key() == engine.key == engine.root.name == engine.info()["key"]
    monkeypatch.setattr(rebuild, "python_version", lambda *a: "3.11.99")
    assert realengine.key() != engine.key          # another python -> another directory


def test_requirements_are_exact_pins():
    lines = [ln for ln in rebuild.REQUIREMENTS.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines and all("==" in ln and ";" not in ln for ln in lines), lines
    names = {ln.split("==")[0].lower() for ln in lines}
    assert not names & {"torch", "sglang", "torchvision", "sgl-kernel", "sglang-kernel"}


def test_models_are_byte_for_byte_reproducible(engine, tmp_path):
    """Regenerate the models with the venv's python and compare every file's sha256 with the build's."""
    subprocess.run([str(engine.python), str(rebuild.MAKE_MODEL), str(tmp_path)], check=True, timeout=300,
                   env={**os.environ, **engine.env()}, capture_output=True)
    built = engine.info()["models"]
    assert set(built) == set(rebuild.MODELS)
    for name, files in built.items():
        assert rebuild.file_hashes(tmp_path / name) == files, name
        assert rebuild.file_hashes(engine.root / "models" / name) == files, name


_LOAD = r"""
import json, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
prompt = tok.apply_chat_template([{"role": "user", "content": "Hello spark node"}], tokenize=False,
                                 add_generation_prompt=True)
ids = tok(prompt, return_tensors="pt")["input_ids"]
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
print(json.dumps({"arch": type(model).__name__, "dtype": str(model.dtype),
                  "params": sum(p.numel() for p in model.parameters()), "vocab": model.config.vocab_size,
                  "layers": model.config.num_hidden_layers, "eos": tok.eos_token,
                  "prompt": prompt, "new": out[0, ids.shape[1]:].tolist(),
                  "drafter": AutoConfig.from_pretrained(sys.argv[2]).to_dict()["architectures"]}))
"""


def test_the_target_model_loads_and_generates_deterministically(engine):
    def load() -> dict:
        proc = subprocess.run([str(engine.python), "-c", _LOAD, str(engine.model), str(engine.drafter)], timeout=300,
                              env={**os.environ, **engine.env()}, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    got = load()
    assert got["arch"] == "Qwen2ForCausalLM" and got["dtype"] == "torch.bfloat16"
    assert (got["vocab"], got["layers"], got["params"]) == (512, 2, 1_444_096)
    assert got["prompt"] == "<|im_start|>user\nHello spark node<|im_end|>\n<|im_start|>assistant\n"
    assert got["eos"] == "<|im_end|>" and len(got["new"]) == 8
    assert got["drafter"] == ["Qwen2ForCausalLMEagle"]
    assert load()["new"] == got["new"]


def test_sglang_imports_with_the_stubs_and_a_stub_kernel_raises(engine):
    code = ("import sglang.launch_server, sgl_kernel, torchvision\n"
            "try:\n    sgl_kernel.copy_all_layer_kv_cache_cpu(1)\n"
            "except sgl_kernel.StubKernelCalled as e:\n    print('RAISED', e)\n")
    proc = subprocess.run([str(engine.python), "-c", code], env={**os.environ, **engine.env()}, timeout=300,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RAISED sgl_kernel.copy_all_layer_kv_cache_cpu called" in proc.stdout


def test_missing_message_and_path_cli_name_the_build_command(tmp_path):
    env = {**os.environ, "SPARKCTL_REAL_ENGINE_ROOT": str(tmp_path)}
    (tmp_path / realengine.key()).mkdir()          # an interrupted build: a directory without its marker
    proc = subprocess.run([sys.executable, "-m", "testrig.realengine", "path"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and proc.stdout == ""
    assert realengine.BUILD_COMMAND == "python3 -m testrig.realengine build"
    assert f"cd {REPO} && python3 -m testrig.realengine build" in proc.stderr


def test_path_cli_prints_the_built_paths(engine):
    env = {**os.environ, "SPARKCTL_REAL_ENGINE_ROOT": str(engine.root.parent)}
    proc = subprocess.run([sys.executable, "-m", "testrig.realengine", "path"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert Path(got["python"]) == engine.python and Path(got["model"]) == engine.model
    assert hashlib.sha256(Path(got["model"], "model.safetensors").read_bytes()).hexdigest() == \
        engine.info()["models"]["target"]["model.safetensors"]


def _cpu_profile_env() -> list[tuple[str, str]]:
    from sparkctl.config.profile import load_profile
    names = sorted(p.stem for p in (REPO / "profiles").glob("cpu-*.yml"))
    return [(name, key) for name in names for key in sorted(load_profile(name).env) if key.startswith("SGLANG_")]


@pytest.mark.parametrize("profile,variable", _cpu_profile_env())
def test_every_sglang_variable_of_a_cpu_profile_is_one_sglang_reads(engine, profile, variable):
    """A misspelt SGLANG_* variable is silently ignored by SGLang; each one the CPU profiles set (the busy-machine
    SGLANG_HEALTH_CHECK_TIMEOUT among them) is read by the SGLang the tier runs: named in its source as a string
    (os.getenv / os.environ) or as an attribute of its `envs` registry (environ.py)."""
    site = next((engine.root / "venv" / "lib").glob("python3*/site-packages")) / "sglang"
    quoted, registered = (f'"{variable}"', f"'{variable}'"), f"    {variable} = Env"
    for path in site.rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if any(q in text for q in quoted) or (path.name == "environ.py" and registered in text):
            return
    pytest.fail(f"{profile}: {variable} is read nowhere in {site}")
