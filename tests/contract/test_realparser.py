"""Contract tests: SGLang's *real* parser, from each released wheel, judges sparkctl's argv facts.

Each version's venv is built once (about 2 minutes, ~1.1 GB) and cached under
~/.cache/sparkctl/sglang-venvs. Without network the tests skip with the reason, except
under CI=true, where a missing real parser is a failure.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from testrig.realparser import (
    RealParserError,
    RealParserUnavailable,
    dump_real_parser,
    ensure_sglang_venv,
    parse_with_real_sglang,
    run_real_parser,
)

pytestmark = [pytest.mark.contract, pytest.mark.timeout(1800)]

VERSIONS = ["0.5.23", "0.5.11", "0.5.3.post3"]
ROOT = Path(__file__).resolve().parents[2]
BASE = ["--model-path", "/m"]


@pytest.fixture(scope="session")
def real_sglang():
    """Return a function version -> None that makes sure that version's venv exists (skip/fail if not)."""
    unavailable: dict[str, str] = {}

    def need(version: str) -> None:
        if version not in unavailable:
            try:
                ensure_sglang_venv(version)
                unavailable[version] = ""
            except RealParserUnavailable as exc:
                unavailable[version] = f"real SGLang {version} parser unavailable: {exc}"
        if unavailable[version]:
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(unavailable[version])
            pytest.skip(unavailable[version])

    return need


def _rejected(version: str, argv: list[str]) -> RealParserError:
    with pytest.raises(RealParserError) as info:
        parse_with_real_sglang(version, BASE + argv)
    return info.value


@pytest.mark.parametrize("version", VERSIONS)
def test_small_argv_parses(real_sglang, version):
    real_sglang(version)
    values = parse_with_real_sglang(version, BASE + ["--tp-size", "2", "--mem-fraction-static", "0.88",
                                                     "--nnodes", "2", "--node-rank", "1",
                                                     "--dist-init-addr", "10.0.0.1:5000"])
    assert values["model_path"] == "/m"
    assert values["tp_size"] == 2
    assert values["mem_fraction_static"] == 0.88
    assert (values["nnodes"], values["node_rank"], values["dist_init_addr"]) == (2, 1, "10.0.0.1:5000")


@pytest.mark.parametrize("version", VERSIONS)
def test_unknown_flag_carries_sglangs_message(real_sglang, version):
    real_sglang(version)
    err = _rejected(version, ["--no-such-flag", "1"])
    assert err.kind == "argparse"
    assert err.message.endswith("error: unrecognized arguments: --no-such-flag 1")
    assert "usage:" in err.stderr


def test_dflash_is_an_invalid_choice_on_spark_image_version(real_sglang):
    real_sglang("0.5.3.post3")
    err = _rejected("0.5.3.post3", ["--speculative-algorithm", "DFLASH"])
    assert "argument --speculative-algorithm: invalid choice: 'DFLASH'" in err.message


@pytest.mark.parametrize("version", ["0.5.23", "0.5.11"])
def test_dflash_accepted_from_0_5_11(real_sglang, version):
    real_sglang(version)
    assert parse_with_real_sglang(version, BASE + ["--speculative-algorithm", "DFLASH"])[
        "speculative_algorithm"] == "DFLASH"


def test_kv_cache_bf16_rejected_on_spark_image_version(real_sglang):
    real_sglang("0.5.3.post3")
    err = _rejected("0.5.3.post3", ["--kv-cache-dtype", "bf16"])
    assert "argument --kv-cache-dtype: invalid choice: 'bf16'" in err.message


def test_nsa_backend_flags_are_unrecognized_on_0_5_23(real_sglang):
    real_sglang("0.5.23")
    err = _rejected("0.5.23", ["--nsa-prefill-backend", "tilelang"])
    assert err.message.endswith("error: unrecognized arguments: --nsa-prefill-backend tilelang")
    values = parse_with_real_sglang("0.5.23", BASE + ["--dsa-prefill-backend", "tilelang"])
    assert values["dsa_prefill_backend"] == "tilelang"


def test_nsa_backend_flags_work_on_0_5_11(real_sglang):
    real_sglang("0.5.11")
    values = parse_with_real_sglang("0.5.11", BASE + ["--nsa-prefill-backend", "tilelang",
                                                      "--nsa-decode-backend", "tilelang"])
    assert (values["nsa_prefill_backend"], values["nsa_decode_backend"]) == ("tilelang", "tilelang")


def test_cuda_graph_max_bs_is_ambiguous_on_0_5_23(real_sglang):
    real_sglang("0.5.23")
    err = _rejected("0.5.23", ["--cuda-graph-max-bs", "8"])
    assert "ambiguous option: --cuda-graph-max-bs could match" in err.message


def test_disable_cuda_graph_warns_but_parses_on_0_5_23(real_sglang):
    real_sglang("0.5.23")
    result = run_real_parser("0.5.23", BASE + ["--disable-cuda-graph"])
    assert result.values["disable_cuda_graph"] is True
    assert "'--disable-cuda-graph' is deprecated" in result.stderr


def test_deprecated_flag_aborts_parsing_on_spark_image_version(real_sglang):
    """0.5.3.post3's DeprecatedAction raises ValueError(help): a deprecated flag stops the launch."""
    real_sglang("0.5.3.post3")
    err = _rejected("0.5.3.post3", ["--enable-ep-moe"])
    assert err.kind == "exception"
    assert err.message.startswith("ValueError: NOTE: --enable-ep-moe is deprecated.")


def test_prog_name_is_launch_server_on_spark_image_version(real_sglang):
    """0.5.3.post3 builds `ArgumentParser()` without prog: errors name argv[0] as `-m` gives it."""
    real_sglang("0.5.3.post3")
    assert _rejected("0.5.3.post3", ["--no-such-flag"]).message.startswith("launch_server.py: error:")


def _gen_dialects():
    """scripts/gen_dialects.py as a module (the generator the committed dialects come from)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_dialects", ROOT / "scripts" / "gen_dialects.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def _committed(version: str) -> dict:
    return json.loads((ROOT / "sparkctl" / "sglang" / "dialects" / f"{version}.json").read_text())


@pytest.mark.parametrize("version", VERSIONS)
def test_committed_dialect_matches_the_real_parser(real_sglang, version):
    """sparkctl/sglang/dialects/<version>.json is what scripts/gen_dialects.py makes of the real parser."""
    real_sglang(version)
    fresh = sorted((_gen_dialects().flag_of(a) for a in dump_real_parser(version)["actions"]),
                   key=lambda f: (f["dest"], f["options"]))
    assert _committed(version)["flags"] == fresh, "regenerate: python scripts/gen_dialects.py"


@pytest.mark.parametrize("version", VERSIONS)
def test_committed_speculative_algorithms_match_the_wheel_source(version):
    """The algorithm names in the dialect are the wheel's SpeculativeAlgorithm members and aliases, read from
    sglang/srt/speculative/spec_info.py of the very wheel the flags came from; where argparse has choices for
    --speculative-algorithm (before 0.5.23) they are the same names."""
    gen = _gen_dialects()
    try:
        wheel = gen.sglang_wheel(version)
    except (OSError, subprocess.SubprocessError) as exc:
        message = f"sglang=={version} wheel unavailable: {exc}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    committed = _committed(version)
    assert gen.wheel_sha256(wheel) in committed["source"], "dialect generated from another wheel: regenerate"
    fresh = gen.speculative_algorithms(wheel)
    assert committed["speculative_algorithms"] == fresh, \
        "regenerate: python scripts/gen_dialects.py --algorithms-only"
    choices = next(f["choices"] for f in committed["flags"] if f["dest"] == "speculative_algorithm")
    assert choices is None or sorted(choices) == sorted(fresh["names"])
    assert ("DFLASH" in fresh["names"]) == (version != "0.5.3.post3")


@pytest.mark.parametrize("version", VERSIONS)
def test_api_key_from_the_rendered_config_file_reaches_server_args(real_sglang, version, tmp_path, monkeypatch):
    """sparkctl renders `--config <secrets>/engine-secrets.yaml` instead of `--api-key KEY`: the real parser
    reads the key from that file (prepare_server_args merges the YAML in-process); no key in argv."""
    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.sglang.launch import SECRETS_MOUNT
    from sparkctl.sglang.render import render

    real_sglang(version)
    monkeypatch.setenv("SPARKCTL_API_KEY", "sk-contract-1e3")       # a key YAML would read as a float unquoted
    spec = render(load_profile("d5"), load_inventory(ROOT / "inventory" / "sparks.example.yml")).specs[0]
    for name, content in spec.secret_files.items():
        (tmp_path / name).write_text(content)
    argv = [a.replace(SECRETS_MOUNT, str(tmp_path)) for a in ["--config", f"{SECRETS_MOUNT}/engine-secrets.yaml"]]
    assert "sk-contract-1e3" not in " ".join(spec.argv)
    assert parse_with_real_sglang(version, BASE + argv)["api_key"] == "sk-contract-1e3"
    # SGLang's errors for a missing file, as the emulator reproduces them
    err = _rejected(version, ["--config", str(tmp_path / "missing.yaml")])
    assert err.kind == "exception" and f"Config file not found: {tmp_path / 'missing.yaml'}" in err.message
