"""Golden image plans: every shipped profile's engine and launch image, byte for byte (tags, inputs, Dockerfiles, launch
document, the build contexts' hashes). A tag is a content address that deployed clusters hold: a change here is a
rebuild and a fabric copy on every cluster at its next `up` (and an SGLang deployment seen as changed), so a diff in
these files must be a decision, never a side effect. SPARKCTL_UPDATE_GOLDEN=1 rewrites them; review the diff."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.images import launchdoc
from sparkctl.images.plan import BaseImage, plan_images, unresolved_plan
from testrig.testenv import shipped_profiles

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "images"
SPARKS = load_inventory(REPO / "inventory" / "sparks.example.yml")
BASES = {"sglang": BaseImage("lmsysorg/sglang:v0.5.23", "sha256:" + "1" * 64, "lmsysorg/sglang@sha256:" + "2" * 64),
         "vllm": BaseImage("vllm/vllm-openai:v0.32.0", "sha256:" + "3" * 64, "vllm/vllm-openai@sha256:" + "4" * 64)}


def _planned(profile: str) -> dict:
    prof = load_profile(profile)
    plan = plan_images(prof, SPARKS, BASES[prof.engine])
    return {"engine_tag": plan.engine_tag, "launch_tag": plan.launch_tag,
            "engine_inputs": plan.engine_inputs, "launch_inputs": plan.launch_inputs,
            "engine_dockerfile": plan.engine_dockerfile.splitlines(),
            "launch_dockerfile": plan.launch_dockerfile.splitlines(),
            "launch_doc": json.loads(launchdoc.doc_bytes(plan.launch_doc)),
            "engine_context_sha256": hashlib.sha256(plan.engine_context()).hexdigest(),
            "launch_context_sha256": hashlib.sha256(plan.launch_context()).hexdigest(),
            "unresolved": unresolved_plan(prof, SPARKS, "golden")}


def _check(path: Path, got: dict) -> None:
    if os.environ.get("SPARKCTL_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert path.exists(), f"missing golden {path}; run with SPARKCTL_UPDATE_GOLDEN=1 and review the diff"
    assert got == json.loads(path.read_text())


@pytest.mark.parametrize("profile", shipped_profiles("sglang"))
def test_sglang_image_plan_is_byte_identical(profile):
    """The SGLang images' tags, labels and Dockerfiles as deployed clusters hold them (fixed base digest)."""
    _check(GOLDEN / f"{profile}.sparks.json", _planned(profile))


def _with_series(profile: str, series: str | None):
    prof = load_profile(profile)
    return prof.model_copy(update={"image": prof.image.model_copy(update={"patch_series": series})})


@pytest.mark.parametrize("series", [None, "gb10-vllm-0.32.0"])
@pytest.mark.parametrize("profile", shipped_profiles("vllm"))
def test_vllm_image_plan_golden(profile, series):
    """vLLM's images: sparkctl/vllm-gb10[-launch], FROM the base by digest, the series applied by seriesapply, the
    engine and its release in the labels, the schema-2 launch document."""
    prof = _with_series(profile, series)
    plan = plan_images(prof, SPARKS, BASES["vllm"])
    got = {"engine_tag": plan.engine_tag, "launch_tag": plan.launch_tag, "engine_inputs": plan.engine_inputs,
           "launch_inputs": plan.launch_inputs, "engine_dockerfile": plan.engine_dockerfile.splitlines(),
           "launch_dockerfile": plan.launch_dockerfile.splitlines(),
           "launch_doc": json.loads(launchdoc.doc_bytes(plan.launch_doc)),
           "engine_context_sha256": hashlib.sha256(plan.engine_context()).hexdigest(),
           "launch_context_sha256": hashlib.sha256(plan.launch_context()).hexdigest(),
           "unresolved": unresolved_plan(prof, SPARKS, "golden")}
    _check(GOLDEN / f"{profile}.{series or 'unpatched'}.sparks.json", got)
