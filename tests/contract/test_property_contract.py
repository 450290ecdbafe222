"""Contract: the real SGLang parser accepts what the generated profiles render.

tests/property/ checks every mutated profile against the dialect's schema (fast); here a bounded, deterministic
sample of the mutated profiles that render is given to SGLang 0.5.23's own parser (about 1.5 s a parse), so a
schema that drifted from the wheel cannot hide an argv the engine would refuse."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given

from sparkctl.errors import ConfigError
from testrig.mutations import SPARKS, ci_settings, mutated_profile, write_yaml
from testrig.realparser import parse_with_real_sglang
from testrig.testenv import need_real_parser

pytestmark = [pytest.mark.contract, pytest.mark.timeout(1800)]

MAX_REAL_PARSES = 12
_parsed: list[list[str]] = []


@pytest.fixture(scope="module", autouse=True)
def _real_parser():
    need_real_parser("0.5.23")


@ci_settings(max_examples=80)
@given(mutated_profile(kinds=("near", "near", "extra")))
def test_real_sglang_accepts_every_sampled_generated_profile_that_renders(case):
    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.sglang.render import render

    doc, keys = case
    if len(_parsed) >= MAX_REAL_PARSES:
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = write_yaml(Path(tmp) / "mutant.yml", doc)
        try:
            profile = load_profile(str(path))
            spec = render(profile, load_inventory(SPARKS), environ={}).specs[1]
        except ConfigError:
            return  # refused with exit 2: tests/property checks how
    if profile.image.sglang_version != "0.5.23" or spec.argv[3:] in _parsed:
        return
    _parsed.append(spec.argv[3:])
    values = parse_with_real_sglang("0.5.23", spec.argv[3:])
    assert values["model_path"] == profile.model.path and values["tp_size"] == profile.server.tp_size, keys
    assert values["node_rank"] == 1 and values["port"] == profile.api.port, keys


def test_the_sample_was_not_empty():
    assert len(_parsed) >= 5, f"only {len(_parsed)} generated profiles rendered: the sample judges nothing"
