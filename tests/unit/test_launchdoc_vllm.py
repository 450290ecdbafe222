"""vLLM's launch image without Docker: the launch document of a vLLM render (schema 2: rank 0's --host/--port, the
headless ranks' --headless), the environment each rank's container gets, and the entrypoint that ships in the image
rebuilding, per rank, exactly the argv and environment `sparkctl render` prints."""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from sparkctl.config.inventory import Inventory, load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.engines import render
from sparkctl.errors import ConfigError
from sparkctl.images import entrypoint, entrypoint_rankflags, launchdoc
from sparkctl.images.plan import BaseImage, plan_images
from testrig.nnode_inputs import sparks_inventory

REPO = Path(__file__).resolve().parents[2]
SPARKS = load_inventory(REPO / "inventory" / "sparks.example.yml")
LOCAL = load_inventory(REPO / "inventory" / "local-vllm.yml")
BASE = BaseImage("vllm/vllm-openai:v0.32.0", "sha256:" + "3" * 64, "vllm/vllm-openai@sha256:" + "4" * 64)
SECRETS = {"SPARKCTL_API_KEY": "k-123", "HF_TOKEN": "hf-456"}


def _profile(tp: int = 2, secrets: bool = False):
    p = load_profile("cpu-tiny-vllm")
    update: dict = {"server": p.server.model_copy(update={"tp_size": tp})}
    if secrets:
        update["api"] = p.api.model_copy(update={"api_key_env": "SPARKCTL_API_KEY", "hf_token_env": "HF_TOKEN"})
    return p.model_copy(update=update)


def _inventories(tmp_path: Path) -> dict[str, tuple[Inventory, int]]:
    return {"sparks": (SPARKS, 2), "local-vllm": (LOCAL, 2),
            "four-sparks": (load_inventory(sparks_inventory(tmp_path / "n4.yml", 4)), 4)}


def _shipped_entrypoint(plan) -> bytes:
    """The entrypoint the launch image carries (its build context's etc-sparkctl/entrypoint.py)."""
    with tarfile.open(fileobj=io.BytesIO(plan.launch_context())) as tf:
        member = tf.extractfile("etc-sparkctl/entrypoint.py")
        assert member is not None
        return member.read()


def _run_entrypoint(source: Path, doc: dict, environ: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    """The entrypoint file as the image runs it (`python3 -I`), with --print instead of exec."""
    doc_file = tmp_path / "launch.json"
    doc_file.write_bytes(launchdoc.doc_bytes(doc))
    return subprocess.run([sys.executable, "-I", str(source), "--print"], capture_output=True, text=True,
                          env={**environ, "SPARKCTL_LAUNCH_JSON": str(doc_file), "PATH": os.environ["PATH"]})


@pytest.mark.parametrize("secrets", [False, True])
@pytest.mark.parametrize("inv", ["sparks", "local-vllm", "four-sparks"])
def test_entrypoint_rebuilds_every_vllm_ranks_argv_as_render_prints_it(tmp_path, inv, secrets):
    """Per rank: the plan's launch document + the environment the runtime gives that rank's container -> the
    entrypoint shipped in the launch image (run as the image runs it) -> exactly render's argv and env."""
    inventory, tp = _inventories(tmp_path)[inv]
    profile = _profile(tp, secrets)
    plan = plan_images(profile, inventory, BASE)
    doc = plan.launch_doc
    assert doc["schema"] == launchdoc.SCHEMA_RANK_FLAGS and doc["engine"] == "vllm"
    specs = render(profile, inventory, environ=SECRETS if secrets else {}).specs
    assert len(specs) == tp
    assert _shipped_entrypoint(plan) == Path(entrypoint_rankflags.__file__).read_bytes()
    for spec in specs:
        container_env = launchdoc.rank_environment(doc, spec)
        argv, env, missing = entrypoint_rankflags.build(doc, container_env)
        assert missing == [] and argv == spec.argv, spec.rank
        assert {k: env[k] for k in spec.env} == spec.env
        done = _run_entrypoint(Path(entrypoint_rankflags.__file__), doc, container_env, tmp_path)
        assert done.returncode == 0, done.stderr
        printed = json.loads(done.stdout)["argv"]
        assert printed == ["***" if a in SECRETS.values() else a for a in spec.argv], spec.rank
        headless = spec.rank > 0
        assert ("--headless" in printed, "--host" in printed, "--port" in printed) == (headless, not headless,
                                                                                        not headless)
        assert printed[printed.index("--node-rank") + 1] == str(spec.rank)


def test_the_per_rank_part_is_the_node_rank_and_rank_0s_api_flags_against_headless():
    doc = plan_images(_profile(), SPARKS, BASE).launch_doc
    switches = [i for i in doc["argv"] if isinstance(i, dict) and "if" in i]
    assert switches == [{"if": "SPARKCTL_FLAG_HOST", "argv": ["--host", "0.0.0.0", "--port", "31000"]},
                        {"if": "SPARKCTL_FLAG_HEADLESS", "argv": ["--headless"]}]
    assert [i for i in doc["argv"] if isinstance(i, dict) and "env" in i] == [{"env": "SPARKCTL_ARG_NODE_RANK"}]
    assert doc["rank_env"] == ["VLLM_HOST_IP"] and "VLLM_HOST_IP" not in doc["env"]
    rank0, rank1 = render(_profile(), SPARKS, environ={}).specs
    e0, e1 = launchdoc.rank_environment(doc, rank0), launchdoc.rank_environment(doc, rank1)
    assert {k: e0[k] for k in ("SPARKCTL_FLAG_HOST", "SPARKCTL_FLAG_HEADLESS", "SPARKCTL_ARG_NODE_RANK")} == \
        {"SPARKCTL_FLAG_HOST": "1", "SPARKCTL_FLAG_HEADLESS": "0", "SPARKCTL_ARG_NODE_RANK": "0"}
    assert {k: e1[k] for k in ("SPARKCTL_FLAG_HOST", "SPARKCTL_FLAG_HEADLESS", "SPARKCTL_ARG_NODE_RANK")} == \
        {"SPARKCTL_FLAG_HOST": "0", "SPARKCTL_FLAG_HEADLESS": "1", "SPARKCTL_ARG_NODE_RANK": "1"}


def test_a_container_without_its_switch_is_refused_naming_it(tmp_path):
    """Nothing is guessed: a container that does not say whether it serves the API (or is headless) exits 2."""
    doc = plan_images(_profile(), SPARKS, BASE).launch_doc
    spec = render(_profile(), SPARKS, environ={}).specs[1]
    env = launchdoc.rank_environment(doc, spec)
    del env["SPARKCTL_FLAG_HEADLESS"]
    _, _, missing = entrypoint_rankflags.build(doc, env)
    assert missing == ["SPARKCTL_FLAG_HEADLESS"]
    done = _run_entrypoint(Path(entrypoint_rankflags.__file__), doc, env, tmp_path)
    assert done.returncode == 2 and "lacks SPARKCTL_FLAG_HEADLESS" in done.stderr


def test_a_rank_of_another_render_is_refused():
    doc = plan_images(_profile(), SPARKS, BASE).launch_doc
    other = load_profile("cpu-tiny-vllm")
    other = other.model_copy(update={"api": other.api.model_copy(update={"port": 31001})})
    with pytest.raises(ConfigError, match="does not match the launch image of profile cpu-tiny-vllm"):
        launchdoc.rank_environment(doc, render(other, SPARKS, environ={}).specs[0])


def test_document_holds_no_secret(tmp_path):
    doc = plan_images(_profile(secrets=True), SPARKS, BASE).launch_doc
    text = launchdoc.doc_bytes(doc).decode()
    assert launchdoc.SECRET_PLACEHOLDER not in text and "k-123" not in text
    assert {"env": "SPARKCTL_ARG_CONFIG", "optional": True} in doc["argv"] and doc["optional_env"] == ["HF_TOKEN_PATH"]


def test_one_node_vllm_is_schema_1_and_ships_the_first_entrypoint(tmp_path):
    """One rank has no headless peer: the document is schema 1, read by entrypoint.py like every SGLang one."""
    one = load_inventory(sparks_inventory(tmp_path / "n1.yml", 1))
    profile = _profile(tp=1)
    plan = plan_images(profile, one, BASE)
    assert plan.launch_doc["schema"] == launchdoc.SCHEMA
    assert _shipped_entrypoint(plan) == Path(entrypoint.__file__).read_bytes()
    [spec] = render(profile, one, environ={}).specs
    argv, _, missing = entrypoint.build(plan.launch_doc, launchdoc.rank_environment(plan.launch_doc, spec))
    assert missing == [] and argv == spec.argv and "--host" in argv and "--headless" not in argv


@pytest.mark.parametrize("profile", ["d5", "base", "dflash-off"])
@pytest.mark.parametrize("environ", [{}, SECRETS])
def test_rankflags_entrypoint_reads_sglangs_schema_1_documents_as_entrypoint_does(profile, environ):
    """entrypoint_rankflags is a superset: on every SGLang document it gives what entrypoint.py gives (SGLang's images
    keep shipping entrypoint.py: its bytes are in their launch tags)."""
    prof = load_profile(profile)
    doc = plan_images(prof, SPARKS, BaseImage("lmsysorg/sglang:v0.5.23", "sha256:" + "1" * 64)).launch_doc
    assert doc["schema"] == launchdoc.SCHEMA and "engine" not in doc
    for spec in render(prof, SPARKS, environ=environ).specs:
        env = launchdoc.rank_environment(doc, spec)
        assert entrypoint_rankflags.build(doc, env) == entrypoint.build(doc, env)
        assert entrypoint_rankflags.build(doc, env)[0] == spec.argv


def test_ranks_differing_in_a_flags_value_count_or_before_the_flags_are_refused():
    from dataclasses import replace
    a, b = render(_profile(), SPARKS, environ={}).specs
    assert b.argv[-2:] == ["--kv-cache-memory-bytes", "67108864"]      # a flag with one value ends the argv
    with pytest.raises(ConfigError, match="different number of values"):
        launchdoc.launch_doc([a, replace(b, argv=[*b.argv, "extra"])], profile="t")
    with pytest.raises(ConfigError, match="not a flag value"):
        launchdoc.launch_doc([a, replace(b, argv=["python3", "-m", "other", *b.argv[3:]])], profile="t")


def test_launch_image_tag_moves_with_the_entrypoint_it_ships():
    """The launch tag hashes the entrypoint the image carries: a vLLM schema-2 image names entrypoint_rankflags's
    bytes."""
    plan = plan_images(_profile(), SPARKS, BASE)
    template = (REPO / "images" / "launch" / "vllm.Dockerfile.j2").read_bytes()
    h = hashlib.sha256()
    for part in (template, Path(entrypoint_rankflags.__file__).read_bytes()):
        h.update(hashlib.sha256(part).digest())
    assert plan.launch_inputs["template_sha256"] == h.hexdigest()
