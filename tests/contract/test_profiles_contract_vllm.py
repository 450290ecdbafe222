"""Contract: vLLM 0.32.0's real `vllm serve` parser (and ServeSubcommand.validate) accepts every shipped vLLM
profile's rendered argv, on both ranks, and reads back what the profile says in vLLM's names; so does every
translation of a setting render makes (speculative methods, KV dtype, the step budget), and the API key reaches
vLLM from sparkctl's --config file with nothing of it in argv."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.engines import render
from testrig.realparser.vllm import parse_with_real_vllm
from testrig.testenv import need_real_vllm_parser, shipped_profiles

pytestmark = [pytest.mark.contract, pytest.mark.timeout(1800)]

VERSION = "0.32.0"
REPO = Path(__file__).resolve().parents[2]
SPARKS = REPO / "inventory" / "sparks.example.yml"


@pytest.fixture(scope="module", autouse=True)
def _real_parser():
    need_real_vllm_parser(VERSION)


def _serve_args(argv: list[str]) -> list[str]:
    assert argv[:4] == ["python3", "-m", "vllm.entrypoints.cli.main", "serve"], argv
    return argv[4:]


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("profile", shipped_profiles("vllm"))
def test_vllm_reads_back_the_shipped_profile(profile, rank):
    prof = load_profile(profile)
    spec = render(prof, load_inventory(SPARKS), environ={}).specs[rank]
    values = parse_with_real_vllm(VERSION, _serve_args(spec.argv))
    s = prof.server
    assert values["model_tag"] == prof.model.path and values["served_model_name"] == [prof.model.served_name]
    assert (values["tensor_parallel_size"], values["nnodes"], values["node_rank"]) == (s.tp_size, 2, rank)
    assert (values["master_addr"], values["master_port"]) == ("192.168.100.10", prof.api.dist_port)
    assert values["headless"] is (rank > 0)
    if rank == 0:
        assert values["port"] == prof.api.port
    assert values["max_model_len"] == s.context_length and values["enforce_eager"] is s.disable_cuda_graph
    assert values["distributed_timeout_seconds"] == s.dist_timeout


@pytest.mark.parametrize("case", [
    {"speculative": {"algorithm": "DFLASH", "draft_model_path": "/models/drafter-dflash", "num_draft_tokens": 8}},
    {"speculative": {"algorithm": "NEXTN", "num_steps": 4}},
    {"speculative": {"algorithm": "EAGLE3", "draft_model_path": "/models/e3", "num_steps": 3,
                     "draft_attention_backend": "flashinfer"}},
    {"speculative": {"algorithm": "NGRAM", "num_steps": 4}},
    {"server": {"kv_cache_dtype": "bf16", "mem_fraction_static": 0.8, "max_running_requests": 8,
                "chunked_prefill_size": 2048, "context_length": 1024}},
    {"server": {"kv_cache_dtype": "fp8_e4m3", "cuda_graph_max_bs": 16, "attention_backend": "FLASHINFER"}},
    {"model": {"reasoning_parser": "glm45", "tool_call_parser": "glm45", "trust_remote_code": True}},
], ids=["dflash", "mtp", "eagle3", "ngram", "memory-and-batching", "fp8-graphs-attention", "glm-parsers"])
def test_vllm_accepts_every_translation(tmp_path, case):
    doc = yaml.safe_load((REPO / "profiles" / "cpu-tiny-vllm.yml").read_text())
    for section, values in case.items():
        doc[section] = {**(doc.get(section) or {}), **values}
    (tmp_path / "case.yml").write_text(yaml.safe_dump(doc))
    prof = load_profile(str(tmp_path / "case.yml"))
    spec = render(prof, load_inventory(SPARKS), environ={}).specs[0]
    values = parse_with_real_vllm(VERSION, _serve_args(spec.argv))
    argv = spec.argv
    if "--speculative-config" in argv:
        assert values["speculative_config"] == json.loads(argv[argv.index("--speculative-config") + 1])
    for flag, dest in (("--kv-cache-dtype", "kv_cache_dtype"), ("--gpu-memory-utilization", "gpu_memory_utilization"),
                       ("--max-num-seqs", "max_num_seqs"), ("--max-num-batched-tokens", "max_num_batched_tokens"),
                       ("--reasoning-parser", "reasoning_parser"), ("--max-cudagraph-capture-size",
                                                                    "max_cudagraph_capture_size")):
        if flag in argv:
            assert str(values[dest]) == argv[argv.index(flag) + 1], (flag, values[dest])


def test_the_api_key_reaches_vllm_from_the_config_file_only(tmp_path):
    doc = yaml.safe_load((REPO / "profiles" / "cpu-tiny-vllm.yml").read_text())
    doc["api"]["api_key_env"] = "K"
    (tmp_path / "k.yml").write_text(yaml.safe_dump(doc))
    spec = render(load_profile(str(tmp_path / "k.yml")), load_inventory(SPARKS), environ={"K": "sk-contract"}).specs[0]
    config = tmp_path / "engine-secrets.yaml"
    config.write_text(spec.secret_files["engine-secrets.yaml"])
    argv = [str(config) if a == "/run/sparkctl-secrets/engine-secrets.yaml" else a for a in _serve_args(spec.argv)]
    assert "sk-contract" not in " ".join(argv)
    values = parse_with_real_vllm(VERSION, argv)
    assert values["api_key"] == ["sk-contract"]
