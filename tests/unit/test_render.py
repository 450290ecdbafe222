"""Rendering: golden argv/env per shipped profile and rank, dialect spelling, refusals, secrets, quoting."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError
from sparkctl.sglang.render import render
from testrig.testenv import shipped_profiles

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "render"
SHIPPED = shipped_profiles("sglang")
INVENTORIES = {"local": REPO / "inventory" / "local.yml", "sparks": REPO / "inventory" / "sparks.example.yml"}


def _rendered(profile: str, inv: str) -> dict:
    out = render(load_profile(profile), load_inventory(INVENTORIES[inv]), environ={}).to_json()
    out["inventory"] = os.path.relpath(out["inventory"], REPO)
    return out


@pytest.mark.parametrize("inv", sorted(INVENTORIES))
@pytest.mark.parametrize("profile", SHIPPED)
def test_golden(profile, inv):
    """Golden file per shipped profile and inventory (both ranks). SPARKCTL_UPDATE_GOLDEN=1 rewrites them."""
    got = _rendered(profile, inv)
    path = GOLDEN / f"{profile}.{inv}.json"
    if os.environ.get("SPARKCTL_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(got, indent=2) + "\n")
    assert path.exists(), f"missing golden {path}; run with SPARKCTL_UPDATE_GOLDEN=1 and review the diff"
    assert got == json.loads(path.read_text())


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_d5_ranks_differ_only_in_node_rank_and_per_node_env():
    res = render(load_profile("d5"), load_inventory(INVENTORIES["sparks"]), environ={})
    a, b = res.specs
    assert a.argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert [x for x in a.argv if x not in ("0",)] == [x for x in b.argv if x not in ("1",)]
    assert _flag(a.argv, "--node-rank") == "0" and _flag(b.argv, "--node-rank") == "1"
    assert _flag(a.argv, "--dist-init-addr") == _flag(b.argv, "--dist-init-addr") == "192.168.100.10:25000"
    assert a.env["SGLANG_HOST_IP"] == "192.168.100.10" and b.env["SGLANG_HOST_IP"] == "192.168.100.11"
    for spec in (a, b):
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
            assert spec.env[var] == "enp1s0f0np0"
        assert spec.env["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0"
    for flag, value in [("--tp-size", "2"), ("--nnodes", "2"), ("--mem-fraction-static", "0.88"),
                        ("--max-total-tokens", "131072"), ("--mamba-full-memory-ratio", "2"),
                        ("--context-length", "65536"), ("--kv-cache-dtype", "bf16"),
                        ("--dsa-prefill-backend", "tilelang"), ("--dsa-decode-backend", "tilelang"),
                        ("--speculative-algorithm", "DFLASH"), ("--speculative-num-draft-tokens", "8"),
                        ("--speculative-draft-attention-backend", "flashinfer")]:
        assert _flag(a.argv, flag) == value, flag


def test_dflash_off_has_no_speculative_flags():
    res = render(load_profile("dflash-off"), load_inventory(INVENTORIES["sparks"]), environ={})
    assert not any(a.startswith("--speculative") for a in res.specs[0].argv)


def _variant(profiles_dir: Path, body: str) -> str:
    (profiles_dir / "v.yml").write_text(body)
    return "v"


def test_nsa_spelling_on_0_5_11(profiles_dir):
    name = _variant(profiles_dir, "extends: d5\nimage: {sglang_version: '0.5.11'}\n")
    argv = render(load_profile(name), load_inventory(INVENTORIES["sparks"]), environ={}).specs[0].argv
    assert _flag(argv, "--nsa-prefill-backend") == "tilelang" and "--dsa-prefill-backend" not in argv
    assert _flag(argv, "--speculative-algorithm") == "DFLASH"


@pytest.mark.parametrize("body,fragment", [
    ("extends: d5\nimage: {sglang_version: 0.5.3.post3}\nserver: {kv_cache_dtype: auto, dsa_prefill_backend: null,"
     " dsa_decode_backend: null}\n", "speculative.algorithm: 'DFLASH' is not accepted by SGLang 0.5.3.post3"),
    ("extends: dflash-off\nimage: {sglang_version: 0.5.3.post3}\nserver: {dsa_prefill_backend: null, "
     "dsa_decode_backend: null}\n", "server.kv_cache_dtype: 'bf16' is not accepted by SGLang 0.5.3.post3"),
    ("extends: d5\nserver: {cuda_graph_max_bs: 8}\n", "SGLang 0.5.23 has no flag for this setting"),
    ("extends: d5\nserver: {extra_args: ['--no-such-flag']}\n", "'--no-such-flag' is not a flag of SGLang 0.5.23"),
    ("extends: d5\nserver: {extra_args: ['--tp-size', '4']}\n", "--tp-size is set by sparkctl"),
    ("extends: d5\nserver: {tp_size: 4}\n", "4 ranks cannot be held by 2 node(s)"),
    ("extends: d5\nimage: {sglang_version: '9.9.9'}\n", "no flag schema for SGLang 9.9.9"),
])
def test_refusals_name_file_key_and_fix(cli, profiles_dir, body, fragment):
    _variant(profiles_dir, body)
    code, out, err = cli("render", "--profile", "v", "--inventory", str(INVENTORIES["sparks"]))
    assert code == 2, err
    assert fragment in err and "fix:" in err and "Traceback" not in err and out == ""
    assert str(profiles_dir) in err or str(REPO / "profiles") in err


def test_error_points_at_the_file_that_set_the_key(profiles_dir):
    (profiles_dir / "v.yml").write_text("extends: d5\nimage: {sglang_version: 0.5.3.post3}\n"
                                        "server: {dsa_prefill_backend: null, dsa_decode_backend: null}\n")
    with pytest.raises(ConfigError) as exc:
        render(load_profile("v"), load_inventory(INVENTORIES["sparks"]), environ={})
    # kv_cache_dtype bf16 was set in d5.yml, not in v.yml
    assert exc.value.where is not None and exc.value.where.endswith("profiles/d5.yml")


def test_0_5_3_spelling(profiles_dir):
    name = _variant(profiles_dir, "extends: dflash-off\nimage: {sglang_version: 0.5.3.post3}\n"
                                  "server: {kv_cache_dtype: fp8_e4m3, cuda_graph_max_bs: 8}\n")
    argv = render(load_profile(name), load_inventory(INVENTORIES["sparks"]), environ={}).specs[0].argv
    assert _flag(argv, "--tp-size") == "2" and _flag(argv, "--nsa-prefill") == "tilelang"
    assert _flag(argv, "--cuda-graph-max-bs") == "8"


def test_shell_metacharacters_stay_one_argv_element(profiles_dir):
    name = _variant(profiles_dir, "extends: d5\nmodel: {served_name: \"glm; rm -rf / 'x' $(id)\"}\n")
    argv = render(load_profile(name), load_inventory(INVENTORIES["sparks"]), environ={}).specs[0].argv
    assert _flag(argv, "--served-model-name") == "glm; rm -rf / 'x' $(id)"


def test_secrets_travel_as_files_never_in_argv_env_or_anything_printed(cli, monkeypatch):
    monkeypatch.setenv("SPARKCTL_API_KEY", "sk-very-secret")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token")
    res = render(load_profile("d5"), load_inventory(INVENTORIES["sparks"]))
    for spec in res.specs:
        assert _flag(spec.argv, "--config") == "/run/sparkctl-secrets/engine-secrets.yaml"
        assert "--api-key" not in spec.argv and "HF_TOKEN" not in spec.env
        assert spec.env["HF_TOKEN_PATH"] == "/run/sparkctl-secrets/hf-token"
        assert yaml.safe_load(spec.secret_files["engine-secrets.yaml"]) == {"api-key": "sk-very-secret"}
        assert spec.secret_files["hf-token"] == "hf_secret_token"
        assert "sk-very-secret" not in spec.redacted().model_dump_json() + repr(spec)
    shown = json.dumps(res.to_json())
    assert "sk-very-secret" not in shown and "hf_secret_token" not in shown
    code, out, err = cli("render", "--profile", "d5", "--json", "--inventory", str(INVENTORIES["sparks"]))
    assert code == 0 and "sk-very-secret" not in out + err and "hf_secret_token" not in out + err


def test_an_api_key_that_yaml_would_read_as_another_type_stays_a_string(monkeypatch):
    for key in ("true", "1e3", "0x10", "null", "key: with colon", "'quoted\""):
        monkeypatch.setenv("SPARKCTL_API_KEY", key)
        spec = render(load_profile("d5"), load_inventory(INVENTORIES["sparks"])).specs[0]
        assert yaml.safe_load(spec.secret_files["engine-secrets.yaml"]) == {"api-key": key}


def test_extra_args_may_not_carry_their_own_config_file(tmp_path, monkeypatch, profiles_dir):
    (profiles_dir / "cfg.yml").write_text("extends: d5\nserver: {extra_args: ['--config', '/x.yaml']}\n")
    with pytest.raises(ConfigError) as e:
        render(load_profile("cfg"), load_inventory(INVENTORIES["sparks"]))
    assert "--config is set by sparkctl" in e.value.message


def test_redact_hides_known_values_and_server_args_fields():
    from sparkctl.redaction import redact
    line = "server_args=ServerArgs(model_path='/m', api_key='unknown-key', admin_api_key=\"k2\", port=30000)"
    assert redact(line, ()) == ("server_args=ServerArgs(model_path='/m', api_key='***', admin_api_key=\"***\", "
                                "port=30000)")
    assert redact("token abc-123 and abc", {"abc", "abc-123"}) == "token *** and ***"
    assert redact("api_key=None", ()) == "api_key=None"


def test_cli_json_shape_and_rank_filter(cli):
    code, out, _ = cli("render", "--profile", "d5", "--json")
    data = json.loads(out)
    assert code == 0 and data["profile"] == "d5" and data["sglang_version"] == "0.5.23"
    assert [r["rank"] for r in data["ranks"]] == [0, 1] and data["ranks"][0]["node"] == "spark-a"
    code, out, _ = cli("render", "--profile", "dflash-off", "--rank", "1", "--json")
    data = json.loads(out)
    assert code == 0 and [r["rank"] for r in data["ranks"]] == [1]
    code, _, err = cli("render", "--profile", "d5", "--rank", "5")
    assert code == 2 and "ranks 0..1" in err


def test_deprecated_flag_renders_with_a_warning(cli, profiles_dir):
    _variant(profiles_dir, "extends: d5\nserver: {disable_cuda_graph: true}\n")
    res = render(load_profile("v"), load_inventory(INVENTORIES["sparks"]), environ={})
    assert "--disable-cuda-graph" in res.specs[0].argv
    assert any("--disable-cuda-graph is deprecated in SGLang 0.5.23" in w for w in res.warnings)
    code, _, err = cli("render", "--profile", "v", "--inventory", str(INVENTORIES["sparks"]))
    assert code == 0 and "warning: server.disable_cuda_graph: --disable-cuda-graph is deprecated" in err


def test_a_secret_flag_in_extra_args_goes_to_the_secrets_file_never_to_argv(cli, profiles_dir, monkeypatch):
    """`extra_args: [--admin-api-key, X]` printed X in `render`; the dialect's secret flags (Flag.secret) go to
    the --config file SGLang merges at start-up, beside the API key."""
    monkeypatch.setenv("SPARKCTL_API_KEY", "sk-main")
    name = _variant(profiles_dir, "extends: d5\nserver: {extra_args: [--admin-api-key, adm-XYZZY]}\n")
    res = render(load_profile(name), load_inventory(INVENTORIES["sparks"]))
    for spec in res.specs:
        assert "adm-XYZZY" not in spec.argv and "--admin-api-key" not in spec.argv
        assert yaml.safe_load(spec.secret_files["engine-secrets.yaml"]) == {"api-key": "sk-main",
                                                                             "admin-api-key": "adm-XYZZY"}
        assert _flag(spec.argv, "--config") == "/run/sparkctl-secrets/engine-secrets.yaml"
    code, out, err = cli("render", "--profile", name, "--inventory", str(INVENTORIES["sparks"]))
    assert code == 0 and "adm-XYZZY" not in out + err and "sk-main" not in out + err


def test_redaction_is_by_field_not_by_value():
    """An API key "8" must not hide `--speculative-num-draft-tokens 8`: argv hides the secret flags' values by
    position, env the secret variables by name; numbers stay."""
    from sparkctl.sglang.launch import LaunchSpec
    spec = LaunchSpec(rank=0, node="a", argv=["python3", "--speculative-num-draft-tokens", "8", "--api-key", "8",
                                              "--admin-api-key=8", "--max-total-tokens", "8"],
                      env={"NCCL_DEBUG": "8", "HF_TOKEN": "8"}, sglang_version="0.5.23", secret_values=frozenset({"8"}))
    view = spec.redacted()
    assert view.argv == ["python3", "--speculative-num-draft-tokens", "8", "--api-key", "***",
                            "--admin-api-key=***", "--max-total-tokens", "8"]
    assert view.env == {"HF_TOKEN": "***", "NCCL_DEBUG": "8"}


def test_secret_flags_are_the_credential_strings_not_every_token_word():
    from sparkctl.sglang.dialect import load_dialect
    secret = load_dialect("0.5.23").secret_options()
    assert {"--api-key", "--admin-api-key", "--ssl-keyfile-password"} <= secret
    assert not secret & {"--max-total-tokens", "--speculative-num-draft-tokens", "--speculative-token-map",
                         "--kt-max-deferred-experts-per-token", "--bucket-time-to-first-token"}


@pytest.mark.parametrize("inv", sorted(INVENTORIES))
def test_render_json_of_replicas_is_one_object_with_the_router(cli, profiles_dir, inv):
    """`render --json` of `replicas: 2` (TP=1 each, on the two nodes): every replica's ranks and the router's argv in
    one document; on Sparks the router runs in a container of the engine image, on the embedded cluster here."""
    from testrig.embedded import write_replicated_profile
    write_replicated_profile(profiles_dir / "rep.yml", 8)
    code, out, err = cli("render", "--profile", "rep", "--inventory", str(INVENTORIES[inv]), "--json")
    assert code == 0, err
    doc = json.loads(out)
    nodes = [n.name for n in load_inventory(INVENTORIES[inv]).nodes]
    assert [(r["index"], r["nodes"], [x["node"] for x in r["ranks"]]) for r in doc["replicas"]] == \
        [(0, nodes[:1], nodes[:1]), (1, nodes[1:], nodes[1:])]
    dist = [r["ranks"][0]["argv"][r["ranks"][0]["argv"].index("--dist-init-addr") + 1] for r in doc["replicas"]]
    assert dist[0].endswith(":25000") and dist[1].endswith(":25001")        # each replica its own TCP store port
    argv = doc["router"]["argv"]
    assert argv[argv.index("--worker-urls") + 1:] == [r["url"] for r in doc["replicas"]]
    assert argv[argv.index("--policy") + 1] == "round_robin" and doc["router"]["url"].endswith(":30080")
    assert ("container" in doc["router"]["runs"]) == (inv == "sparks")
    assert (argv[0] == "python3") == (inv == "sparks")


@pytest.mark.parametrize("args,want", [
    (["--replica", "1"], [(1, 0)]), (["--rank", "0"], [(0, 0), (1, 0)]), (["--replica", "0", "--rank", "0"], [(0, 0)])])
def test_render_replica_and_rank_narrow_a_replicated_profile(cli, profiles_dir, args, want):
    from testrig.embedded import write_replicated_profile
    write_replicated_profile(profiles_dir / "rep.yml", 8)
    code, out, err = cli("render", "--profile", "rep", *args, "--json")
    assert code == 0, err
    assert [(r["index"], x["rank"]) for r in json.loads(out)["replicas"] for x in r["ranks"]] == want
    code, out, err = cli("render", "--profile", "rep", *args)
    assert code == 0 and out.count("# rank ") == len(want) and ("## router" in out) is False, out


@pytest.mark.parametrize("args,words", [
    (["--rank", "1"], ["--rank 1: each replica of profile rep has rank 0 only", "--replica I --rank N"]),
    (["--replica", "2"], ["--replica 2: profile rep has replicas 0..1", "--replica I --rank N"])])
def test_render_names_what_a_replicated_profile_has(cli, profiles_dir, args, words):
    from testrig.embedded import write_replicated_profile
    write_replicated_profile(profiles_dir / "rep.yml", 8)
    code, out, err = cli("render", "--profile", "rep", *args)
    assert code == 2 and out == "" and all(w in err for w in words), err


def test_render_replica_of_one_group_says_how_its_ranks_are_named(cli):
    code, out, err = cli("render", "--profile", "d5", "--replica", "0")
    assert code == 2 and out == ""
    assert "--replica 0: profile d5 is one TP group" in err and "sparkctl render --profile d5 --rank N" in err
