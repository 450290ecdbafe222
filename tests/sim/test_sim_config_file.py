"""The emulator's `--config FILE.yaml`: merged like SGLang's ConfigArgumentMerger (config first, CLI wins), with
SGLang's errors for a missing file or a root that is not a mapping (a launcher traceback, exit 1)."""
from __future__ import annotations

import subprocess
import sys

from sparkctl.sim.args import build_parser
from sparkctl.sim.config_file import merge_config_args


def test_config_keys_in_any_spelling_go_first_and_the_command_line_wins(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("api-key: sk-from-file\ntp-size: 4\nenable-metrics: true\ntrust_remote_code: false\n"
                   "port: 31000\n")
    parser, _ = build_parser("0.5.23")
    argv = merge_config_args(parser, ["--model-path", "/m", "--config", str(cfg), "--port", "32000"])
    assert argv == ["--api-key", "sk-from-file", "--tp-size", "4", "--enable-metrics", "--port", "31000",
                    "--model-path", "/m", "--port", "32000"]
    ns = parser.parse_args(argv)
    assert (ns.api_key, ns.tp_size, ns.enable_metrics, ns.trust_remote_code, ns.port) == \
        ("sk-from-file", 4, True, False, 32000)
    # As in SGLang (checked with the real 0.5.23 parser): a key is passed as `--KEY` verbatim, so `tp_size: 4`
    # becomes `--tp_size 4`, which argparse does not know (only store_true keys match either spelling, to skip).
    cfg.write_text("tp_size: 4\n")
    assert merge_config_args(parser, ["--config", str(cfg)]) == ["--tp_size", "4"]


def _run_sim(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sparkctl.sim", *argv], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "SPARKCTL_SIM_SGLANG_VERSION": "0.5.23"})


def test_missing_or_non_mapping_config_fails_like_sglang(tmp_path):
    res = _run_sim("--model-path", "/m", "--config", str(tmp_path / "nope.yaml"))
    assert res.returncode == 1 and res.stderr.rstrip().endswith(f"ValueError: Config file not found: "
                                                                 f"{tmp_path / 'nope.yaml'}")
    assert "prepare_server_args" in res.stderr and res.stderr.startswith("Traceback (most recent call last):")
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    res = _run_sim("--config", str(bad))
    assert res.returncode == 1 and res.stderr.rstrip().endswith(
        "ValueError: Config file must contain a dictionary at root level")
    res = _run_sim("--config", str(tmp_path / "x.json"))
    assert res.returncode == 1 and "ValueError: Config file must be YAML format, got: .json" in res.stderr


def test_a_key_of_an_unsupported_action_is_refused_like_sglang(tmp_path):
    import argparse

    import pytest

    from sparkctl.sim.config_file import ConfigFileError
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-warmup", dest="warmup", action="store_false")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("no-warmup: true\n")
    with pytest.raises(ConfigFileError, match="Unsupported config option 'no_warmup' with action '_StoreFalseAction'"):
        merge_config_args(parser, ["--config", str(cfg)])
