"""The image steps of `up` as the plan shows them, and a rank's `docker run` of a launch image (no daemon)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.deploy.image_stage import ImageSurvey, LaunchImage
from sparkctl.deploy.plan import launch_identity
from sparkctl.images import entrypoint
from sparkctl.images.plan import BaseImage, plan_images
from sparkctl.nodes.container import container_config
from sparkctl.sglang.render import render

REPO = Path(__file__).resolve().parents[2]
INV = load_inventory(REPO / "inventory" / "sparks.example.yml")
BASE = BaseImage("lmsysorg/sglang:v0.5.23", "sha256:" + "1" * 64, "lmsysorg/sglang@sha256:" + "2" * 64)
KEY = "sk-stage-secret-123"


def _plan():
    return plan_images(load_profile("d5"), INV, BASE)


def _what(survey: ImageSurvey) -> dict[str, str]:
    return {name: what for name, what, _ in survey.steps()}


def test_process_runtime_has_three_no_op_steps():
    assert _what(ImageSurvey("process")) == {n: f"{n}: no-op (process runtime: no image)"
                                             for n in ("image-build", "image-distribute", "image-verify")}
    assert ImageSurvey("process").identity_key is None


def test_pipeline_steps_say_what_is_missing_and_why_a_step_is_a_no_op():
    p = _plan()
    a, b = p.builder, next(n.name for n in INV.nodes if n.name != p.builder)
    nothing = ImageSurvey("pipeline", plan=p, present={a: {p.engine_tag: None, p.launch_tag: None},
                                                       b: {p.engine_tag: None, p.launch_tag: None}})
    what = _what(nothing)
    assert what["image-build"] == (f"image-build: build engine image {p.engine_tag} ({BASE.ref} + gb10-0.5.23) and "
                                   f"launch image {p.launch_tag} on {a}")
    assert what["image-distribute"] == (f"image-distribute: copy from {a}: {b} <- {p.engine_tag}, {p.launch_tag} "
                                        f"(missing layers only, over the fabric)")
    flag_only = ImageSurvey("pipeline", plan=p, present={a: {p.engine_tag: "sha256:e", p.launch_tag: None},
                                                         b: {p.engine_tag: "sha256:e", p.launch_tag: None}})
    assert _what(flag_only)["image-distribute"] == (f"image-distribute: copy from {a}: {b} <- {p.launch_tag} "
                                                    f"(missing layers only, over the fabric)")
    assert _what(flag_only)["image-build"].startswith(f"image-build: build launch image {p.launch_tag} on {a} "
                                                      f"(engine image present: one thin layer)")
    everything = ImageSurvey("pipeline", plan=p, present={n: {p.engine_tag: "sha256:e", p.launch_tag: "sha256:l"}
                                                          for n in (a, b)})
    what = _what(everything)
    assert what["image-build"] == f"image-build: no-op ({p.engine_tag} and {p.launch_tag} already on {a})"
    assert what["image-distribute"] == f"image-distribute: no-op (every node has {p.engine_tag}, {p.launch_tag})"
    assert what["image-verify"].startswith(f"image-verify: {p.engine_tag}, {p.launch_tag} on {a}, {b} with one ID")
    missing_base = _what(ImageSurvey("pipeline", base_missing=True, present={a: {}, b: {}}))
    assert missing_base["image-build"].startswith("image-build: pull the base image (missing on the building node)")


def test_prebuilt_image_is_not_built_and_is_copied_only_where_missing():
    s = ImageSurvey("prebuilt", image="eng:1", source="the inventory (sparkctl_engine_image)",
                    present={"spark-a": {"eng:1": "sha256:x"}, "spark-b": {"eng:1": None}})
    what = _what(s)
    assert what["image-build"] == ("image-build: no-op (prebuilt image eng:1 named by the inventory "
                                   "(sparkctl_engine_image): nothing to build)")
    assert what["image-distribute"] == "image-distribute: copy eng:1 whole to spark-b from a node that has it"
    s.present["spark-b"]["eng:1"] = "sha256:x"
    assert _what(s)["image-distribute"] == "image-distribute: no-op (eng:1 on spark-a, spark-b)"


def test_launch_image_is_part_of_the_identity():
    result = render(load_profile("d5"), INV, environ={})
    assert launch_identity(result) != launch_identity(result, "sparkctl/sglang-gb10-launch:d5-a")
    assert launch_identity(result, "x:1") != launch_identity(result, "x:2")


def test_rank_runs_the_launch_image_with_no_secret_in_argv_or_image(tmp_path, monkeypatch):
    p = _plan()
    launch = LaunchImage(p.launch_tag, p.launch_doc)
    assert KEY not in json.dumps(p.launch_doc) and KEY not in p.launch_context().decode("latin-1")
    node = INV.nodes[0]
    spec = render(load_profile("d5"), INV, environ={"SPARKCTL_API_KEY": KEY}).specs[0]
    cfg = container_config(spec, node, cluster="desk", deployment_id="d1", image=launch.tag,
                           extra_env=launch.environment(spec), command=[])
    assert cfg.argv[-1] == p.launch_tag and cfg.command == ()          # the entrypoint builds the argv
    # The key is in neither argv nor env: it sits in the rank's secret file (written over SSH stdin, mounted
    # read-only); the container only learns the file's path, for SGLang's --config.
    assert KEY not in " ".join(cfg.argv) and KEY not in json.dumps(cfg.env)
    assert cfg.env["SPARKCTL_ARG_CONFIG"] == "/run/sparkctl-secrets/engine-secrets.yaml"
    assert KEY in spec.secret_files["engine-secrets.yaml"] and cfg.secrets_dir
    assert cfg.env["SPARKCTL_ARG_NODE_RANK"] == "0"
    # The entrypoint in that container execs the rank's full argv, plus what `docker run` appends after the
    # image, passed through to SGLang.
    doc_path = tmp_path / "launch.json"
    doc_path.write_text(json.dumps(p.launch_doc))
    monkeypatch.setattr(entrypoint, "LAUNCH_JSON", str(doc_path))
    ran: list = []
    monkeypatch.setattr(entrypoint.os, "execvpe", lambda f, argv, env: ran.append((argv, env)))
    monkeypatch.setattr(entrypoint.os, "environ", dict(cfg.env))
    entrypoint.main(["--log-level", "debug"])
    argv, env = ran[0]
    assert argv == spec.argv + ["--log-level", "debug"] and "--config" in argv
    assert {k: env[k] for k in spec.env} == spec.env


def test_spec_the_launch_image_cannot_run_is_refused_before_docker_run():
    from sparkctl.errors import ConfigError
    launch = LaunchImage(_plan().launch_tag, _plan().launch_doc)
    other = render(load_profile("dflash-off"), INV, environ={}).specs[0]
    with pytest.raises(ConfigError, match="does not match the launch image of profile d5"):
        launch.environment(other)


def test_a_rollback_on_the_recorded_base_says_so():
    p = _plan()
    present: dict[str, dict[str, str | None]] = {n.name: {p.engine_tag: "sha256:e", p.launch_tag: "sha256:l"}
                                                 for n in INV.nodes}
    build = _what(ImageSurvey("pipeline", plan=p, present=present, pinned_base=BASE))["image-build"]
    assert build.startswith(f"image-build: no-op ({p.engine_tag} and {p.launch_tag} already on {p.builder})")
    assert f"(rollback: on the recorded base {BASE.pinned[:26]}..., which {BASE.ref} no longer names)" in build


def test_images_in_use_reads_the_deployment_records_only(tmp_path):
    from sparkctl.images.manage import images_in_use
    deployments = tmp_path / "deployments"
    deployments.mkdir()
    (deployments / "d1.json").write_text(json.dumps({
        "specs": [{"image": "sparkctl/sglang-gb10-launch:d5-1"}], "image_ids": {"spark-a": "sha256:aa"},
        "images": {"spark-a": {"engine_tag": "sparkctl/sglang-gb10:e1", "engine_id": "sha256:ee",
                               "launch_tag": "sparkctl/sglang-gb10-launch:d5-1", "launch_id": "sha256:aa"}}}))
    (deployments / "broken.json").write_text("{not json")
    (deployments / "list.json").write_text("[1, 2]")
    (tmp_path / "ansible").mkdir()
    (tmp_path / "ansible" / "event.json").write_text(json.dumps({"specs": [{"image": "not-a-deployment"}]}))
    assert images_in_use([tmp_path]) == {"sparkctl/sglang-gb10-launch:d5-1", "sha256:aa",
                                         "sparkctl/sglang-gb10:e1", "sha256:ee"}


VLLM_BASE = BaseImage("vllm/vllm-openai:v0.32.0", "sha256:" + "3" * 64, "vllm/vllm-openai@sha256:" + "4" * 64)


def _vllm_profile():
    p = load_profile("cpu-tiny-vllm")
    return p.model_copy(update={"image": p.image.model_copy(update={"patch_series": "gb10-vllm-0.32.0"}),
                                "api": p.api.model_copy(update={"api_key_env": "SPARKCTL_API_KEY"})})


def test_ups_image_stage_plans_vllms_images(monkeypatch):
    """`up`'s survey of a vLLM profile on docker nodes: pipeline mode, vLLM's engine and launch tags, the steps."""
    from sparkctl.deploy import image_stage
    from sparkctl.engines import render as engine_render
    profile = _vllm_profile()
    result = engine_render(profile, INV, environ={})
    monkeypatch.setattr(image_stage, "_conns", lambda inv: {n.name: object() for n in inv.nodes})
    monkeypatch.setattr(image_stage, "inspect_base", lambda conn, ref: VLLM_BASE if ref == VLLM_BASE.ref else None)
    monkeypatch.setattr(image_stage, "_ids", lambda conns, tags: {n: {t: None for t in tags} for n in conns})
    survey = image_stage.survey(profile, INV, result)
    assert survey.mode == "pipeline" and survey.plan is not None
    p = survey.plan
    assert p.engine_tag.startswith("sparkctl/vllm-gb10:0.32.0-gb10-vllm-0.32.0-")
    assert p.launch_tag.startswith("sparkctl/vllm-gb10-launch:cpu-tiny-vllm-") and survey.identity_key == p.launch_tag
    assert _what(survey)["image-build"] == (f"image-build: build engine image {p.engine_tag} ({VLLM_BASE.ref} + "
                                            f"gb10-vllm-0.32.0) and launch image {p.launch_tag} on {p.builder}")


@pytest.mark.parametrize("rank", [0, 1])
def test_a_vllm_rank_runs_the_launch_image_as_render_prints_it(tmp_path, monkeypatch, rank):
    """Each vLLM rank's `docker run` of the launch image, then the entrypoint it ships (entrypoint_rankflags) in that
    container: rank 0 execs `... --host ... --port ...`, rank 1 `... --headless ...`, exactly render's argv."""
    from sparkctl.engines import render as engine_render
    from sparkctl.images import entrypoint_rankflags
    profile = _vllm_profile()
    p = plan_images(profile, INV, VLLM_BASE)
    launch = LaunchImage(p.launch_tag, p.launch_doc)
    spec = engine_render(profile, INV, environ={"SPARKCTL_API_KEY": KEY}).specs[rank]
    cfg = container_config(spec, INV.nodes[rank], cluster="desk", deployment_id="d1", image=launch.tag,
                           extra_env=launch.environment(spec), command=[])
    assert cfg.argv[-1] == p.launch_tag and cfg.command == ()
    assert KEY not in " ".join(cfg.argv) and KEY not in json.dumps(cfg.env) and KEY not in json.dumps(p.launch_doc)
    assert (cfg.env["SPARKCTL_FLAG_HOST"], cfg.env["SPARKCTL_FLAG_HEADLESS"]) == (("1", "0") if rank == 0 else
                                                                                  ("0", "1"))
    doc_path = tmp_path / "launch.json"
    doc_path.write_text(json.dumps(p.launch_doc))
    monkeypatch.setattr(entrypoint_rankflags, "LAUNCH_JSON", str(doc_path))
    ran: list = []
    monkeypatch.setattr(entrypoint_rankflags.os, "execvpe", lambda f, argv, env: ran.append((argv, env)))
    monkeypatch.setattr(entrypoint_rankflags.os, "environ", dict(cfg.env))
    entrypoint_rankflags.main([])
    argv, env = ran[0]
    assert argv == spec.argv and "--config" in argv
    assert ("--headless" in argv) is (rank == 1) and ("--host" in argv) is (rank == 0)
    assert {k: env[k] for k in spec.env} == spec.env
