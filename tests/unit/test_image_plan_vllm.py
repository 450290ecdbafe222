"""The image plan of a vLLM profile: per-engine repositories, templates, labels and build contexts; what changes
which tag; what is refused. (Goldens: tests/unit/test_image_golden.py.)"""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError
from sparkctl.images import patchapply, seriesapply
from sparkctl.images.plan import BaseImage, plan_images, unresolved_plan

REPO = Path(__file__).resolve().parents[2]
SPARKS = load_inventory(REPO / "inventory" / "sparks.example.yml")
BASE = BaseImage("vllm/vllm-openai:v0.32.0", "sha256:" + "3" * 64, "vllm/vllm-openai@sha256:" + "4" * 64)
SERIES = "gb10-vllm-0.32.0"


def _profile(series: str | None = SERIES, **server):
    p = load_profile("cpu-tiny-vllm")
    return p.model_copy(update={"image": p.image.model_copy(update={"patch_series": series}),
                                "server": p.server.model_copy(update=server)})


def _files(context: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(context)) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_repositories_labels_and_base_pinned_by_digest():
    plan = plan_images(_profile(), SPARKS, BASE)
    assert plan.engine_tag.startswith(f"sparkctl/vllm-gb10:0.32.0-{SERIES}-")
    assert plan.launch_tag.startswith("sparkctl/vllm-gb10-launch:cpu-tiny-vllm-")
    lines = plan.engine_dockerfile.splitlines()
    assert lines[1] == "FROM vllm/vllm-openai@sha256:" + "4" * 64
    assert f"RUN python3 /tmp/sparkctl-build/seriesapply.py --series /tmp/sparkctl-build/{SERIES}/series --compile \\" \
        in lines
    for label in ('org.sparkctl.role="engine"', 'org.sparkctl.engine="vllm"', 'org.sparkctl.engine-version="0.32.0"',
                  f'org.sparkctl.patch-series="{SERIES}"', 'org.sparkctl.base-image="vllm/vllm-openai:v0.32.0"'):
        assert label in plan.engine_dockerfile
    assert "sglang" not in plan.engine_dockerfile.lower() and "sglang" not in plan.launch_dockerfile.lower()
    assert f"FROM {plan.engine_tag}" in plan.launch_dockerfile
    assert 'org.sparkctl.engine="vllm"' in plan.launch_dockerfile
    assert plan.engine_inputs["engine"] == "vllm" and plan.engine_inputs["engine_version"] == "0.32.0"
    assert "sglang_version" not in plan.engine_inputs


def test_engine_context_carries_both_appliers_and_the_series():
    files = _files(plan_images(_profile(), SPARKS, BASE).engine_context())
    assert files["sparkctl-build/seriesapply.py"] == Path(seriesapply.__file__).read_bytes()
    assert files["sparkctl-build/patchapply.py"] == Path(patchapply.__file__).read_bytes()
    assert f"sparkctl-build/{SERIES}/series" in files
    assert f"sparkctl-build/{SERIES}/0001-sparkctl-series-marker.patch" in files
    assert set(_files(plan_images(_profile(None), SPARKS, BASE).engine_context())) == {"Dockerfile"}


def test_what_moves_which_tag():
    a = plan_images(_profile(), SPARKS, BASE)
    assert plan_images(_profile(), SPARKS, BASE).to_json() == a.to_json()            # same inputs, same tags
    flags = plan_images(_profile(max_running_requests=4), SPARKS, BASE)
    assert flags.engine_tag == a.engine_tag and flags.launch_tag != a.launch_tag       # a flag: the thin layer only
    unpatched = plan_images(_profile(None), SPARKS, BASE)
    assert unpatched.engine_tag.startswith("sparkctl/vllm-gb10:0.32.0-unpatched-")
    assert unpatched.launch_tag != a.launch_tag
    other = plan_images(_profile(), SPARKS, BaseImage(BASE.ref, BASE.image_id, "vllm/vllm-openai@sha256:" + "5" * 64))
    assert other.engine_tag != a.engine_tag and other.launch_tag != a.launch_tag


def test_an_sglang_series_on_a_vllm_profile_is_refused():
    with pytest.raises(ConfigError, match="patch series gb10-0.5.23 is for SGLang 0.5.23, the profile runs vLLM "
                                          "0.32.0"):
        plan_images(_profile("gb10-0.5.23"), SPARKS, BASE)
    d5 = load_profile("d5")
    d5 = d5.model_copy(update={"image": d5.image.model_copy(update={"patch_series": SERIES})})
    with pytest.raises(ConfigError, match="is for vLLM 0.32.0, the profile runs SGLang 0.5.23"):
        plan_images(d5, SPARKS, BaseImage("lmsysorg/sglang:v0.5.23", "sha256:" + "1" * 64))


def test_unresolved_plan_of_a_vllm_profile():
    doc = unresolved_plan(_profile(), SPARKS, "no docker")
    assert doc["engine"]["inputs"]["engine"] == "vllm" and doc["engine"]["inputs"]["base_digest"] is None
    resolved = plan_images(_profile(), SPARKS, BASE)
    assert doc["launch"]["inputs"]["launch_spec_sha256"] == resolved.launch_inputs["launch_spec_sha256"]
    assert doc["engine"]["inputs"]["template_sha256"] == resolved.engine_inputs["template_sha256"]


def test_the_shipped_files_a_build_context_takes_are_the_modules_themselves():
    """The appliers and entrypoints go into build contexts by path (`plan.SHIPPED`, never imported by the plan):
    every one named is there and is the module sparkctl ships under that name."""
    import importlib

    from sparkctl.images import launchdoc, plan
    names = {n for images in plan.IMAGES.values() for n in images.appliers}
    names |= {plan.entrypoint_source({"schema": launchdoc.SCHEMA}).name,
              plan.entrypoint_source({"schema": launchdoc.SCHEMA_RANK_FLAGS}).name}
    assert names == {"patchapply.py", "seriesapply.py", "entrypoint.py", "entrypoint_rankflags.py"}
    for name in names:
        module = importlib.import_module(f"sparkctl.images.{name.removesuffix('.py')}")
        assert Path(module.__file__ or "") == plan.SHIPPED / name
