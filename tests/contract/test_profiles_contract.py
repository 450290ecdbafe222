"""Contract: SGLang's real parser (from the released wheel of each profile's version) accepts every shipped
profile's rendered argv, on both ranks, and reads back the profile's values (the seed's, for d5)."""
from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import Profile, load_profile
from sparkctl.sglang.render import render
from testrig.realparser import parse_with_real_sglang
from testrig.testenv import need_real_parser, shipped_profiles

pytestmark = [pytest.mark.contract, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
SHIPPED = shipped_profiles("sglang")
INVENTORY = REPO / "inventory" / "sparks.example.yml"


def _expected(profile: Profile, rank: int) -> dict:
    m, s, sp = profile.model, profile.server, profile.speculative
    exp = {"model_path": m.path, "served_model_name": m.served_name, "reasoning_parser": m.reasoning_parser,
           "trust_remote_code": m.trust_remote_code, "tp_size": s.tp_size, "nnodes": 2, "node_rank": rank,
           "dist_init_addr": f"192.168.100.10:{profile.api.dist_port}", "port": profile.api.port,
           "mem_fraction_static": s.mem_fraction_static, "max_total_tokens": s.max_total_tokens,
           "mamba_full_memory_ratio": s.mamba_full_memory_ratio, "context_length": s.context_length,
           "kv_cache_dtype": s.kv_cache_dtype or "auto", "enable_metrics": s.enable_metrics,
           "speculative_algorithm": sp.algorithm if sp else None,
           "dist_timeout": s.dist_timeout, "watchdog_timeout": s.watchdog_timeout}
    if s.dsa_prefill_backend:
        exp.update(dsa_prefill_backend=s.dsa_prefill_backend, dsa_decode_backend=s.dsa_decode_backend)
    if sp:
        exp.update(speculative_draft_model_path=sp.draft_model_path,
                   speculative_num_draft_tokens=sp.num_draft_tokens,
                   speculative_draft_attention_backend=sp.draft_attention_backend)
    return exp


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("name", SHIPPED)
def test_real_parser_reads_back_the_profile(name, rank):
    profile = load_profile(name)
    version = profile.image.sglang_version
    need_real_parser(version)
    spec = render(profile, load_inventory(INVENTORY), environ={}).specs[rank]
    parsed = parse_with_real_sglang(version, spec.argv[3:])
    for key, want in _expected(profile, rank).items():
        if want is None and key not in ("speculative_algorithm",):
            continue
        assert parsed.get(key) == want, f"{name} rank {rank}: {key} parsed {parsed.get(key)!r}, profile {want!r}"


def test_d5_is_the_seed_envelope_as_sglang_0_5_23_reads_it():
    need_real_parser("0.5.23")
    spec = render(load_profile("d5"), load_inventory(INVENTORY), environ={}).specs[0]
    parsed = parse_with_real_sglang("0.5.23", spec.argv[3:])
    seed = {"tp_size": 2, "nnodes": 2, "mem_fraction_static": 0.88, "max_total_tokens": 131072,
            "mamba_full_memory_ratio": 2.0, "context_length": 65536, "kv_cache_dtype": "bf16",
            "dsa_prefill_backend": "tilelang", "dsa_decode_backend": "tilelang", "speculative_algorithm": "DFLASH",
            "speculative_num_draft_tokens": 8, "speculative_draft_attention_backend": "flashinfer"}
    assert {k: parsed.get(k) for k in seed} == seed


@pytest.mark.parametrize("version", ["0.5.3.post3"])
def test_real_parser_agrees_with_our_refusals_on_the_spark_image(version):
    """What sparkctl refuses on 0.5.3.post3 (DFLASH, KV bf16), SGLang's own parser refuses too."""
    from testrig.realparser import RealParserError
    need_real_parser(version)
    for argv in (["--model-path", "/m", "--speculative-algorithm", "DFLASH"],
                 ["--model-path", "/m", "--kv-cache-dtype", "bf16"]):
        with pytest.raises(RealParserError, match="invalid choice"):
            parse_with_real_sglang(version, argv)
