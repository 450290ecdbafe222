"""Launch document (rank-independent part of the render) and the launch image's entrypoint, without Docker."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError
from sparkctl.images import entrypoint, launchdoc
from sparkctl.images.plan import BaseImage, plan_images
from sparkctl.sglang.render import render

REPO = Path(__file__).resolve().parents[2]
INV = load_inventory(REPO / "inventory" / "sparks.example.yml")
BASE = BaseImage("lmsysorg/sglang:v0.5.23", "sha256:" + "1" * 64, "lmsysorg/sglang@sha256:" + "2" * 64)


def _doc(profile="d5"):
    return plan_images(load_profile(profile), INV, BASE).launch_doc


@pytest.mark.parametrize("environ", [{}, {"SPARKCTL_API_KEY": "k-123", "HF_TOKEN": "hf-456"}])
def test_entrypoint_rebuilds_every_ranks_argv_and_env(environ):
    doc = _doc()
    for spec in render(load_profile("d5"), INV, environ=environ).specs:
        container_env = launchdoc.rank_environment(doc, spec)
        argv, env, missing = entrypoint.build(doc, container_env)
        assert missing == [] and argv == spec.argv
        assert {k: env[k] for k in spec.env} == spec.env


def test_document_holds_no_secret_and_no_per_rank_value():
    text = launchdoc.doc_bytes(_doc()).decode()
    assert "k-123" not in text and launchdoc.SECRET_PLACEHOLDER not in text
    doc = json.loads(text)
    placeholders = [i for i in doc["argv"] if isinstance(i, dict)]
    # the API key reaches SGLang in a --config file (mounted only when set): the flag is optional, like the token path
    assert placeholders == [{"env": "SPARKCTL_ARG_NODE_RANK"}, {"env": "SPARKCTL_ARG_CONFIG", "optional": True}]
    assert doc["rank_env"] == ["SGLANG_HOST_IP"] and doc["optional_env"] == ["HF_TOKEN_PATH"]
    assert doc["env"]["SGLANG_OPT_DEEPGEMM_HC_PRENORM"] == "0"


def test_missing_rank_value_is_named():
    argv, _, missing = entrypoint.build(_doc(), {})
    assert missing == ["SPARKCTL_ARG_NODE_RANK", "SGLANG_HOST_IP"]


def test_flag_change_changes_only_the_launch_tag():
    d5 = load_profile("d5")
    changed = d5.model_copy(update={"server": d5.server.model_copy(update={"mem_fraction_static": 0.85})})
    a, b = plan_images(d5, INV, BASE), plan_images(changed, INV, BASE)
    assert a.engine_tag == b.engine_tag and a.launch_tag != b.launch_tag
    assert plan_images(d5, INV, BASE).to_json() == a.to_json()          # same inputs, same tags
    other_base = BaseImage(BASE.ref, BASE.image_id, "lmsysorg/sglang@sha256:" + "3" * 64)
    c = plan_images(d5, INV, other_base)
    assert c.engine_tag != a.engine_tag and c.launch_tag != a.launch_tag
    assert c.engine_dockerfile.splitlines()[1] == "FROM lmsysorg/sglang@sha256:" + "3" * 64


def test_spec_of_another_profile_is_refused():
    spec = render(load_profile("dflash-off"), INV, environ={}).specs[0]
    with pytest.raises(ConfigError, match="does not match the launch image of profile d5"):
        launchdoc.rank_environment(_doc(), spec)


def test_secret_positions_are_found_by_field_not_by_value():
    """Every plain value of the rendered argv, taken in turn as the API key and the HF token, leaves the document's
    placeholders as they are: a number equal to a secret stays a baked flag value (redaction by field)."""
    unique = {"SPARKCTL_API_KEY": "k-unique-123", "HF_TOKEN": "hf-unique-456"}
    baseline = launchdoc.launch_doc(render(load_profile("d5"), INV, environ=unique).specs, profile="d5")
    values = {t for t in baseline["argv"] if isinstance(t, str) and not t.startswith("-")}
    assert "8" in values or len(values) > 10   # the D5 argv carries numbers such as the draft-token count
    for value in sorted(values):
        specs = render(load_profile("d5"), INV, environ={"SPARKCTL_API_KEY": value, "HF_TOKEN": value}).specs
        doc = launchdoc.launch_doc(specs, profile="d5")
        assert doc["argv"] == baseline["argv"], value
        assert doc["optional_env"] == baseline["optional_env"] and doc["env"] == baseline["env"], value
