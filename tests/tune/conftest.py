"""An embedded cluster whose emulator has a planted optimum over draft tokens (sparkctl/sim/perf.py).

With these knobs one stream decodes code at decode_tps * E[L](D) / c(D): about 931 / 1197 / 920 tok/s for
D = 4 / 6 / 8 (d5 runs 8), so 6 is the optimum by ~30%, far beyond a loaded machine's noise; a static memory
fraction above 0.92 dies of the host OOM-killer at boot.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

PLANTED = {"boot_s": 0.3, "decode_tps": 300, "verify_cost": 1.5, "verify_cost_per_token": 0.25,
           "accept_len_code": 4.6, "ttft_base_s": 0.01, "prefill_tps": 100000,
           "oom_mem_fraction": 0.92}

# d5 with a short boot warm-up (the profile's own is 2 x 800 tokens: seconds per trial at these rates)
FAST_D5 = "extends: d5\nwarmup:\n  requests: 1\n  max_tokens: 16\n"
FAST_OFF = "extends: t5\nspeculative: null\nrollback_profile: null\n"


@pytest.fixture
def tune_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path, profiles_dir: Path):
    from testrig.embedded import stop_recorded_engines, write_embedded_inventory

    inv = write_embedded_inventory(tmp_path / "inventory.yml", PLANTED)
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(inv))
    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    (profiles_dir / "t5.yml").write_text(FAST_D5)
    (profiles_dir / "t5-off.yml").write_text(FAST_OFF)
    yield inv
    stop_recorded_engines(inv)


@pytest.fixture
def vllm_tune_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path, profiles_dir: Path):
    """The embedded cluster with the planted optimum; `tv`: cpu-tiny-vllm speculative (ngram, 8 draft tokens as
    d5 runs) with the tiny model's KV cell (its 64 MiB per rank hold 131,072 tokens), on free ports; `tv-off` the same
    without speculation."""
    from testrig.embedded import emulated_vllm_profile, stop_recorded_engines, write_embedded_inventory

    inv = write_embedded_inventory(tmp_path / "inventory.yml", {**PLANTED, "vllm_stats_interval_s": 0.5}, prefix="tv")
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(inv))
    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    doc = emulated_vllm_profile(inv)
    doc["warmup"] = {"requests": 1, "max_tokens": 16, "timeout_s": 120}
    off = {**doc, "description": "tv without speculation"}
    doc["speculative"] = {"algorithm": "NGRAM", "num_draft_tokens": 8}
    (profiles_dir / "tv.yml").write_text(yaml.safe_dump(doc))
    (profiles_dir / "tv-off.yml").write_text(yaml.safe_dump(off))
    (profiles_dir / "base.yml").write_text((REPO / "profiles" / "base.yml").read_text())
    yield inv
    stop_recorded_engines(inv)
