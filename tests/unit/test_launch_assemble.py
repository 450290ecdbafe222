"""The launch image sparkctl assembles (sparkctl.images.assemble) for every shipped profile, without Docker: what the
Dockerfile says is what the image config holds, the archive is deterministic (one ID on every node), it carries only
the launch layer, and a Dockerfile with anything the assembler does not make is refused. That Docker loads it and
that it equals what `docker build` makes of the same Dockerfile: tests/cluster/test_image_pipeline.py."""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.errors import ImageError
from sparkctl.images.assemble import EngineConfig, launch_archive, layer_tar, read_dockerfile
from sparkctl.images.plan import INPUTS_LABEL, ROLE_LABEL, BaseImage, plan_images
from testrig.testenv import shipped_profiles

REPO = Path(__file__).resolve().parents[2]
SPARKS = load_inventory(REPO / "inventory" / "sparks.example.yml")
BASES = {"sglang": BaseImage("lmsysorg/sglang:v0.5.23", "sha256:" + "1" * 64, "lmsysorg/sglang@sha256:" + "2" * 64),
         "vllm": BaseImage("vllm/vllm-openai:v0.32.0", "sha256:" + "3" * 64, "vllm/vllm-openai@sha256:" + "4" * 64)}
ENGINE = EngineConfig("sha256:" + "e" * 64,
                      {"Env": ["PATH=/usr/bin"], "WorkingDir": "/sgl-workspace", "Entrypoint": ["sglang"],
                       "Cmd": ["serve"], "Labels": {"org.sparkctl.role": "engine", "vendor": "lmsys"}},
                      ("sha256:" + "a" * 64, "sha256:" + "b" * 64), "arm64", "linux", "v8", "2026-12-01T00:00:00Z")


def _plan(profile: str, **server):
    prof = load_profile(profile)
    if server:
        prof = prof.model_copy(update={"server": prof.server.model_copy(update=server)})
    return plan_images(prof, SPARKS, BASES[prof.engine])


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return {m.name: (tf.extractfile(m).read() if m.isfile() else b"") for m in tf.getmembers()}  # type: ignore


@pytest.mark.parametrize("profile", shipped_profiles())
def test_every_shipped_launch_image_assembles_as_its_dockerfile_says(profile):
    plan = _plan(profile)
    spec = read_dockerfile(plan.launch_dockerfile)
    archive = launch_archive(plan, ENGINE)
    files = _members(archive.data)
    manifest = json.loads(files["manifest.json"])
    (entry,) = manifest
    config = files[entry["Config"]]
    assert archive.image_id == "sha256:" + hashlib.sha256(config).hexdigest() == "sha256:" + entry["Config"][:-5]
    image = json.loads(config)
    assert image["rootfs"]["diff_ids"] == [*ENGINE.layers, archive.layer_diff_id]
    assert (image["architecture"], image["os"], image["variant"], image["created"]) == \
        ("arm64", "linux", "v8", ENGINE.created)
    cfg = image["config"]
    assert cfg["Entrypoint"] == spec.entrypoint == ["python3", "-I", "/etc/sparkctl/entrypoint.py"]
    assert cfg["Cmd"] == [] and cfg["Image"] == ENGINE.image_id
    assert cfg["Env"] == ENGINE.config["Env"] and cfg["WorkingDir"] == "/sgl-workspace"       # inherited
    assert cfg["Labels"]["vendor"] == "lmsys" and cfg["Labels"][ROLE_LABEL] == "launch"      # the launch's win
    assert cfg["Labels"][INPUTS_LABEL] == plan.launch_inputs_sha256
    assert cfg["Labels"]["org.sparkctl.engine-image"] == plan.engine_tag
    assert entry["RepoTags"] == [plan.launch_tag] and len(entry["Layers"]) == 3
    # only the launch layer travels: docker load finds the engine's layers on the node by chain
    assert set(files) == {"manifest.json", entry["Config"], entry["Layers"][-1]}
    layer = files[entry["Layers"][-1]]
    assert archive.layer_diff_id == "sha256:" + hashlib.sha256(layer).hexdigest()
    placed = _members(layer)
    assert placed["etc/sparkctl/launch.json"] == plan.launch_files()["etc-sparkctl/launch.json"]
    assert placed["etc/sparkctl/entrypoint.py"] == plan.launch_files()["etc-sparkctl/entrypoint.py"]
    assert len(archive.data) < 100_000


def test_the_archive_is_deterministic_and_a_flag_changes_only_the_launch_layer():
    a, b = launch_archive(_plan("d5"), ENGINE), launch_archive(_plan("d5"), ENGINE)
    assert a.data == b.data and a.image_id == b.image_id
    c = launch_archive(_plan("d5", watchdog_timeout=601), ENGINE)
    assert c.layer_diff_id != a.layer_diff_id and c.image_id != a.image_id and c.tag != a.tag
    other_engine = EngineConfig(ENGINE.image_id.replace("e", "f"), ENGINE.config, ENGINE.layers, ENGINE.architecture,
                                ENGINE.os, ENGINE.variant, ENGINE.created)
    assert launch_archive(_plan("d5"), other_engine).image_id != a.image_id       # the engine is part of the ID


def test_layer_metadata_is_fixed_root_owned():
    with tarfile.open(fileobj=io.BytesIO(layer_tar({"etc-sparkctl/x.json": b"{}"}))) as tf:
        members = tf.getmembers()
    assert [(m.name, m.isdir(), m.mode, m.uid, m.gid, m.mtime) for m in members] == \
        [("etc/sparkctl", True, 0o755, 0, 0, 0), ("etc/sparkctl/x.json", False, 0o644, 0, 0, 0)]
    for bad in ("etc-sparkctl/sub/x", "other/x", "etc-sparkctl/../x"):
        with pytest.raises(ImageError, match="not directly under etc-sparkctl/"):
            layer_tar({bad: b""})


OTHER_INSTRUCTIONS = ["RUN pip install x", "ENV A=1", "WORKDIR /x", "USER nobody", "ADD x /y", "EXPOSE 80",
                      "ARG X", "ONBUILD RUN x", "VOLUME /data", "HEALTHCHECK NONE", "SHELL [\"sh\"]",
                      "STOPSIGNAL 9", "COPY etc-sparkctl/ /etc/sparkctl/", "CMD [\"x\"]", "LABEL a=b",
                      "FROM scratch"]


@given(extra=st.sampled_from(OTHER_INSTRUCTIONS), at=st.integers(min_value=0, max_value=20),
       profile=st.sampled_from(["d5", "cpu-tiny-vllm"]))
def test_a_launch_dockerfile_with_anything_the_assembler_does_not_make_is_refused(extra, at, profile):
    lines = _plan(profile).launch_dockerfile.splitlines()
    # after a complete instruction (not inside a LABEL's continuation), or at the end
    ends = [i + 1 for i, ln in enumerate(lines) if not ln.rstrip().endswith("\\")]
    pos = ends[at % len(ends)]
    with pytest.raises(ImageError, match="an instruction sparkctl does not assemble") as err:
        read_dockerfile("\n".join([*lines[:pos], extra, *lines[pos:]]))
    assert err.value.hint is not None and "engine image's template" in err.value.hint


@pytest.mark.parametrize("text, message", [
    ("FROM x\nCOPY etc-sparkctl/ /opt/\nENTRYPOINT [\"a\"]\nCMD []\n", "lacks COPY etc-sparkctl/ /etc/sparkctl/"),
    ("FROM x\nCOPY etc-sparkctl/ /etc/sparkctl/\nCMD []\n", "lacks ENTRYPOINT"),
    ("FROM x\nCOPY etc-sparkctl/ /etc/sparkctl/\nENTRYPOINT python3 x.py\nCMD []\n", "is not a JSON list"),
    ("FROM x\nCOPY etc-sparkctl/ /etc/sparkctl/\nENTRYPOINT [\"a\"]\nCMD []\nLABEL novalue\n", "is not key=value"),
    ("FROM x\nCOPY etc-sparkctl/ /etc/sparkctl/\nENTRYPOINT [\"a\"]\nCMD []\nLABEL p=\"a\"b\"\n", "cannot be read"),
])
def test_a_broken_launch_dockerfile_names_what_is_wrong(text, message):
    with pytest.raises(ImageError, match=message):
        read_dockerfile(text)


def test_an_engine_other_than_the_plans_is_refused():
    plan = _plan("d5")
    plan.launch_dockerfile = plan.launch_dockerfile.replace(f"FROM {plan.engine_tag}", "FROM other:tag")
    with pytest.raises(ImageError, match="starts FROM other:tag, not the plan's engine image"):
        launch_archive(plan, ENGINE)
