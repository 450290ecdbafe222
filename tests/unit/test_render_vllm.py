"""Rendering for vLLM: the profile's settings (SGLang's names) in vLLM 0.32.0's spelling, multi-node without Ray
(rank 1 headless), what vLLM has no counterpart for refused at the profile key, secrets never in argv."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.engines import render
from sparkctl.errors import ConfigError
from testrig.testenv import shipped_profiles

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "render"
INVENTORIES = {"local-vllm": REPO / "inventory" / "local-vllm.yml",
               "sparks": REPO / "inventory" / "sparks.example.yml"}
LOCAL, SPARKS = INVENTORIES["local-vllm"], INVENTORIES["sparks"]


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _profile(tmp_path: Path, **over: object) -> Path:
    """A vLLM profile (cpu-tiny-vllm's settings) with `over` merged in key by key (a dotted key sets a nested one)."""
    doc = yaml.safe_load((REPO / "profiles" / "cpu-tiny-vllm.yml").read_text())
    for dotted, value in over.items():
        *parents, leaf = dotted.split(".")
        node = doc
        for p in parents:
            node = node.setdefault(p, {})
        if value is None and leaf in node:
            del node[leaf]
        else:
            node[leaf] = value
    path = tmp_path / "vllm-case.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _render(path: Path, inventory: Path = SPARKS, environ: dict[str, str] | None = None):
    return render(load_profile(str(path)), load_inventory(inventory), environ=environ or {})


def test_the_vllm_profiles_are_found_by_engine():
    assert "cpu-tiny-vllm" in shipped_profiles("vllm")
    assert "cpu-tiny-vllm" not in shipped_profiles("sglang") and "d5" in shipped_profiles("sglang")


@pytest.mark.parametrize("inv", sorted(INVENTORIES))
@pytest.mark.parametrize("profile", shipped_profiles("vllm"))
def test_golden_vllm(profile, inv):
    """Golden file per shipped vLLM profile and inventory (both ranks). SPARKCTL_UPDATE_GOLDEN=1 rewrites them."""
    got = render(load_profile(profile), load_inventory(INVENTORIES[inv]), environ={}).to_json()
    got["inventory"] = os.path.relpath(got["inventory"], REPO)
    path = GOLDEN / f"{profile}.{inv}.json"
    if os.environ.get("SPARKCTL_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(got, indent=2) + "\n")
    assert path.exists(), f"missing golden {path}; run with SPARKCTL_UPDATE_GOLDEN=1 and review the diff"
    assert got == json.loads(path.read_text())


def test_vllm_tp2_is_rank0_serving_and_rank1_headless_on_the_fabric():
    res = render(load_profile("cpu-tiny-vllm"), load_inventory(SPARKS), environ={})
    a, b = res.specs
    assert a.argv[:5] == ["python3", "-m", "vllm.entrypoints.cli.main", "serve", "/models/target"]
    assert b.argv[:5] == a.argv[:5] and a.engine == b.engine == "vllm" and a.sglang_version == "0.32.0"
    for spec, rank in ((a, "0"), (b, "1")):
        assert _flag(spec.argv, "--tensor-parallel-size") == "2" and _flag(spec.argv, "--nnodes") == "2"
        assert _flag(spec.argv, "--node-rank") == rank
        assert _flag(spec.argv, "--master-addr") == "192.168.100.10" and _flag(spec.argv, "--master-port") == "26000"
    assert _flag(a.argv, "--port") == "31000" and "--headless" not in a.argv
    assert "--headless" in b.argv and "--port" not in b.argv and "--host" not in b.argv
    assert a.env["VLLM_HOST_IP"] == "192.168.100.10" and b.env["VLLM_HOST_IP"] == "192.168.100.11"
    assert "SGLANG_HOST_IP" not in a.env
    # what each rank listens on: rank 0 the API and torch's TCP store, the headless rank nothing
    assert [what for _, _, what in a.listen_ports()] == ["HTTP API", "TCP store (--master-port)"]
    assert b.listen_ports() == []


def test_vllm_settings_are_spelt_as_vllm_means_them(tmp_path):
    path = _profile(tmp_path, **{"server.mem_fraction_static": 0.8, "server.kv_cache_dtype": "bf16",
                                 "server.max_running_requests": 8, "server.chunked_prefill_size": 2048,
                                 "model.reasoning_parser": "glm45"})
    argv = _render(path).specs[0].argv
    assert _flag(argv, "--gpu-memory-utilization") == "0.8" and _flag(argv, "--kv-cache-dtype") == "bfloat16"
    assert _flag(argv, "--max-num-seqs") == "8" and _flag(argv, "--max-num-batched-tokens") == "2048"
    assert _flag(argv, "--max-model-len") == "1024" and "--enforce-eager" in argv
    assert _flag(argv, "--reasoning-parser") == "glm45" and _flag(argv, "--served-model-name") == "tiny-qwen2"
    for sglang_only in ("--mem-fraction-static", "--context-length", "--tp-size", "--max-running-requests"):
        assert sglang_only not in argv


@pytest.mark.parametrize(("spec", "want"), [
    ({"algorithm": "DFLASH", "draft_model_path": "/models/drafter-dflash", "num_draft_tokens": 8},
     {"method": "dflash", "model": "/models/drafter-dflash", "num_speculative_tokens": 7}),
    ({"algorithm": "NEXTN", "num_steps": 4}, {"method": "mtp", "num_speculative_tokens": 4}),
    ({"algorithm": "EAGLE3", "draft_model_path": "/models/e3", "num_steps": 3, "num_draft_tokens": 4,
      "draft_attention_backend": "flashinfer"},
     {"method": "eagle3", "model": "/models/e3", "num_speculative_tokens": 3, "attention_backend": "flashinfer"}),
    ({"algorithm": "NGRAM"}, {"method": "ngram"}),
])
def test_vllm_speculative_decoding_is_one_json_config(tmp_path, spec, want):
    argv = _render(_profile(tmp_path, speculative=spec)).specs[0].argv
    assert json.loads(_flag(argv, "--speculative-config") or "null") == want
    assert not any(a.startswith("--speculative-") and a != "--speculative-config" for a in argv)


@pytest.mark.parametrize(("key", "value", "words"), [
    ("server.max_total_tokens", 65536, "no KV cap in tokens"),
    ("server.mamba_full_memory_ratio", 2, "no vLLM counterpart"),
    ("server.max_mamba_cache_size", 4, "no vLLM counterpart"),
    ("server.dsa_prefill_backend", "tilelang", "DSA backends"),
    ("server.dsa_decode_backend", "tilelang", "DSA backends"),
    ("server.watchdog_timeout", 600, "no scheduler watchdog"),
    ("server.decode_log_interval", 40, "every 10 s"),
    ("server.enable_metrics", False, "always serves /metrics"),
    ("server.kv_cache_dtype", "fp4_e2m1", "not accepted by vLLM 0.32.0's --kv-cache-dtype"),
    ("speculative", {"algorithm": "UNO"}, "has no vLLM 0.32.0 method"),
    ("speculative", {"algorithm": "EAGLE", "draft_model_path": "/models/e", "eagle_topk": 4}, "one chain"),
    ("speculative", {"algorithm": "EAGLE", "draft_model_path": "/models/e", "num_draft_tokens": 1},
     "at least one drafted token"),
    ("server.extra_args", ["--port", "9"], "--port is set by sparkctl"),
    ("server.extra_args", ["--headless"], "--headless is set by sparkctl"),
    ("server.extra_args", ["--speculative-config", "{}"], "set by sparkctl"),
    ("server.extra_args", ["--max-num-seq", "4"], "did you mean '--max-num-seqs'"),
    ("server.extra_args", ["--max-model-len", "9"], "already set by server.context_length"),
    ("server.extra_args", ["--compilation-config", "{level: 3"], "takes JSON"),
])
def test_what_vllm_lacks_is_refused_at_the_profile_key(tmp_path, key, value, words):
    path = _profile(tmp_path, **{key: value})
    with pytest.raises(ConfigError) as err:
        _render(path)
    text = f"{err.value.message} {err.value.hint}"
    assert words in text, text
    assert err.value.message.startswith(key.split(".")[0]) and err.value.where == str(path)


def test_a_vllm_profile_names_its_version_and_image(tmp_path):
    with pytest.raises(ConfigError, match="needs image.vllm_version"):
        load_profile(str(_profile(tmp_path, **{"image.vllm_version": None})))
    with pytest.raises(ConfigError, match="needs image.base_image"):
        load_profile(str(_profile(tmp_path, **{"image.base_image": None})))
    with pytest.raises(ConfigError, match="no flag schema for vLLM 0.1.0") as err:
        _render(_profile(tmp_path, **{"image.vllm_version": "0.1.0"}))
    assert "0.32.0" in (err.value.hint or "")
    sglang = yaml.safe_load((REPO / "profiles" / "cpu-tiny.yml").read_text())
    sglang["image"] = {"vllm_version": "0.32.0"}
    (tmp_path / "s.yml").write_text(yaml.safe_dump(sglang))
    with pytest.raises(ConfigError, match="engine is sglang"):
        load_profile(str(tmp_path / "s.yml"))
    assert load_profile("cpu-tiny-vllm").engine_label() == "vLLM 0.32.0"
    assert load_profile("cpu-tiny-vllm").image.engine_ref("vllm") == "sparkctl/vllm-gb10:0.32.0-unpatched"


def test_the_process_runtime_must_run_the_profiles_engine():
    with pytest.raises(ConfigError, match="runs real sglang") as err:
        render(load_profile("cpu-tiny-vllm"), load_inventory(REPO / "inventory" / "local-sglang.yml"), environ={})
    assert "local-vllm.yml" in (err.value.hint or "")
    with pytest.raises(ConfigError, match="runs real vllm"):
        render(load_profile("cpu-tiny"), load_inventory(LOCAL), environ={})


def test_the_embedded_emulator_runs_both_engines():
    """The emulator speaks vLLM's argv too (`python -m sparkctl.sim serve ...`): the embedded cluster takes a vLLM
    profile, and its process runtime launches the emulator's vLLM dialect with vLLM's own arguments."""
    from sparkctl.nodes.process import ProcessRuntime
    inv = load_inventory(REPO / "inventory" / "local.yml")
    res = render(load_profile("cpu-tiny-vllm"), inv, environ={})
    spec = res.specs[0]
    cmd = ProcessRuntime(Path("/tmp/x/logs"), engine="emulator")._command(spec)
    assert cmd[1:5] == ["-m", "sparkctl.sim", "serve", spec.argv[4]] and cmd[5:] == spec.argv[5:]
    assert "--headless" in res.specs[1].argv


def test_the_vllm_api_key_reaches_the_engine_in_its_config_file_never_argv(tmp_path):
    path = _profile(tmp_path, **{"api.api_key_env": "MY_KEY"})
    res = _render(path, environ={"MY_KEY": "s3cret-vllm-key"})
    for spec in res.specs:
        assert not any("s3cret" in a for a in spec.argv) and not any("s3cret" in v for v in spec.env.values())
        assert _flag(spec.argv, "--config") == "/run/sparkctl-secrets/engine-secrets.yaml"
        assert yaml.safe_load(spec.secret_files["engine-secrets.yaml"]) == {"api-key": "s3cret-vllm-key"}
    assert "s3cret" not in json.dumps(res.to_json())


def test_a_vllm_secret_flag_in_extra_args_goes_to_the_config_file(tmp_path):
    path = _profile(tmp_path, **{"server.extra_args": ["--dtype", "bfloat16", "--hf-token", "hf_s3cretvllm"]})
    res = _render(path)
    for spec in res.specs:
        assert "hf_s3cretvllm" not in " ".join(spec.argv) and "--hf-token" not in spec.argv
        assert yaml.safe_load(spec.secret_files["engine-secrets.yaml"]) == {"hf-token": "hf_s3cretvllm"}
        assert "hf_s3cretvllm" in spec.secret_values


def _real_inventory(tmp_path: Path, **over: object) -> Path:
    doc = yaml.safe_load(LOCAL.read_text())
    doc["all"]["vars"].pop("sparkctl_engine_python")
    doc["all"]["vars"].update({"sparkctl_engine": "real", **over})
    path = tmp_path / "real.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_local_cluster_running_either_engine_renders_each_profiles_own(tmp_path):
    inv = load_inventory(_real_inventory(tmp_path, sparkctl_engine_pythons={"sglang": "/s/python",
                                                                             "vllm": "/v/python"}))
    assert inv.cluster.pythons() == {"sglang": "/s/python", "vllm": "/v/python"} and not inv.emulated
    assert render(load_profile("cpu-tiny-vllm"), inv, environ={}).specs[0].engine == "vllm"
    assert render(load_profile("cpu-tiny"), inv, environ={}).specs[0].engine == "sglang"
    only_vllm = load_inventory(_real_inventory(tmp_path, sparkctl_engine_pythons={"vllm": "/v/python"}))
    with pytest.raises(ConfigError, match="engine_pythons has no sglang") as err:
        render(load_profile("cpu-tiny"), only_vllm, environ={})
    assert "sparkctl_engine_pythons" in (err.value.hint or "")
    with pytest.raises(ConfigError, match="takes each engine's Python in cluster.engine_pythons"):
        load_inventory(_real_inventory(tmp_path))
