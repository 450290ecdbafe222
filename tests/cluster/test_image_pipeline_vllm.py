"""vLLM's image pipeline on the real test cluster: the shipped vLLM series applied in a real `docker build` to vLLM
0.32.0's real source files, vLLM's engine and launch images (repositories, labels), and the launch image's
entrypoint giving each rank exactly render's argv (rank 0 --host/--port, rank 1 --headless).

The base is the test vLLM base image (`testrig.engine_image.EngineImages.ensure_vllm_base`): the emulator image + the
vLLM files the series touches, as the package `vllm`, on spark-a only. Nothing boots vLLM here (the test cluster's
engine image is the emulator; what only a Spark confirms, vLLM on GB10 itself, is not exercised).
"""
from __future__ import annotations

import json

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.engines import render
from sparkctl.images import launchdoc, manage, pipeline
from sparkctl.images.build import build_images, ensure_base
from sparkctl.images.plan import plan_images
from testrig.engine_image import VLLM_SOURCE_PACKAGE, EngineImages

pytestmark = pytest.mark.cluster
SHIPPED_D5 = True          # boots no d5: the cluster conftest's d5 fixture stays out of the way
SERIES = "gb10-vllm-0.32.0"


@pytest.fixture(scope="module")
def env(test_cluster):
    inv = load_inventory(test_cluster.inventory_path)
    base_tag = EngineImages(test_cluster).ensure_vllm_base("spark-a", SERIES)
    conns = pipeline.connections(inv)
    yield {"cluster": test_cluster, "inv": inv, "base_tag": base_tag, "a": conns["spark-a"], "conns": conns}
    manage.prune_images(conns, keep=set())          # leave no pipeline image in the cached data roots


def _profile(env):
    prof = load_profile("cpu-tiny-vllm")
    return prof.model_copy(update={"image": prof.image.model_copy(update={"base_image": env["base_tag"],
                                                                          "patch_series": SERIES})})


@pytest.fixture(scope="module")
def built(env):
    base = ensure_base(env["a"], env["base_tag"], node="spark-a", pull=False)
    plan = plan_images(_profile(env), env["inv"], base)
    steps = build_images(plan, env["a"], log_dir=env["cluster"].workdir / "builds-vllm")
    return plan, steps


def test_vllm_series_is_applied_for_real_in_docker_build(env, built):
    plan, steps = built
    assert [(s.role, s.built or s.reason == "tag present with the planned inputs") for s in steps] == \
        [("engine", True), ("launch", True)]
    assert plan.engine_tag.startswith(f"sparkctl/vllm-gb10:0.32.0-{SERIES}-")
    assert plan.launch_tag.startswith("sparkctl/vllm-gb10-launch:cpu-tiny-vllm-")
    script = ("import os, sys; p = sys.argv[1]; v = open(p + '/version.py').read(); "
              "c = os.path.join(p, '__pycache__'); "
              "print(int('SPARKCTL_PATCH_SERIES = \"" + SERIES + "\"' in v), "
              "int(os.path.isdir(c) and any(f.startswith('version.') for f in os.listdir(c))))")
    r = env["a"].run(["docker", "run", "--rm", "--entrypoint", "python3", plan.engine_tag, "-c", script,
                      VLLM_SOURCE_PACKAGE], timeout=120, check=True)
    assert r.stdout.split() == ["1", "1"]            # the marker in the image's vLLM source, compiled
    base = env["a"].run(["docker", "run", "--rm", "--entrypoint", "python3", env["base_tag"], "-c", script,
                         VLLM_SOURCE_PACKAGE], timeout=120)
    assert base.stdout.split()[:1] == ["0"]          # the base carries the unpatched release
    labels = json.loads(env["a"].run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}",
                                      plan.engine_tag], check=True).stdout)
    assert (labels["org.sparkctl.engine"], labels["org.sparkctl.engine-version"]) == ("vllm", "0.32.0")
    assert labels["org.sparkctl.patch-series"] == SERIES and labels["org.sparkctl.base-digest"] == plan.base.pinned
    assert "org.sparkctl.sglang-version" not in labels


def test_vllm_launch_image_gives_each_rank_renders_argv(env, built):
    plan, _ = built
    specs = render(_profile(env), env["inv"], environ={}).specs
    assert [("--headless" in s.argv) for s in specs] == [False, True]
    for spec in specs:
        container = launchdoc.rank_environment(plan.launch_doc, spec)
        flags = [a for k, v in container.items() for a in ("-e", f"{k}={v}")]
        r = env["a"].run(["docker", "run", "--rm", *flags, plan.launch_tag, "--print"], timeout=120, check=True)
        shown = json.loads(r.stdout)
        assert shown["argv"] == spec.argv, spec.rank
        assert {k: shown["env"][k] for k in spec.env} == spec.env
    r = env["a"].run(["docker", "run", "--rm", "-e", "SPARKCTL_ARG_NODE_RANK=1", "-e", "VLLM_HOST_IP=x",
                      plan.launch_tag, "--print"], timeout=120)
    assert r.returncode == 2 and "lacks SPARKCTL_FLAG_HOST, SPARKCTL_FLAG_HEADLESS" in r.stderr
