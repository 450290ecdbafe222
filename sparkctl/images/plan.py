"""Plan the engine and launch images of a profile: content-addressed tags, inputs, Dockerfiles, build contexts.

Pure except for `inspect_base` (one ``docker image inspect`` on the building node). Example::

    base = inspect_base(connector_for(inv, inv.rank0), profile.image.base_image)
    plan = plan_images(profile, inv, base)
    plan.to_json()   # {"engine": {"tag": "sparkctl/sglang-gb10:0.5.23-gb10-0.5.23-1a2b3c4d5e6f", "inputs": {...}},
                     #  "launch": {"tag": "sparkctl/sglang-gb10-launch:d5-...", "inputs": {...}}}

Engine tag = hash(base digest, series content, engine template, patch applier); launch tag = hash(engine tag,
launch document, launch template, entrypoint). Nothing changed: same tags, nothing to build; a flag change
changes only the launch document, so only the launch image (one thin layer) is new.

Per engine (`IMAGES`): SGLang's images are ``sparkctl/sglang-gb10[-launch]`` from ``engine/Dockerfile.j2`` and
``launch/Dockerfile.j2`` with patchapply.py; vLLM's (``engine: vllm``) are ``sparkctl/vllm-gb10[-launch]`` from
``engine/vllm.Dockerfile.j2`` and ``launch/vllm.Dockerfile.j2`` with seriesapply.py (which imports patchapply.py),
labelled ``org.sparkctl.engine`` / ``org.sparkctl.engine-version``. SGLang's inputs, templates and labels are what
deployed clusters' tags were computed from, byte for byte (tests/golden/images/), so none of them moves. The launch
image carries the entrypoint that reads its document's schema (launchdoc: schema 1, entrypoint.py, every SGLang
document; schema 2, entrypoint_rankflags.py, a vLLM document with rank 0's API flags and the headless ranks'
--headless).
"""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.engines import render
from sparkctl.errors import ConfigError
from sparkctl.images import launchdoc
from sparkctl.images.series import Series, load_series
from sparkctl.jsontypes import JSONObject
from sparkctl.resources import shipped

if TYPE_CHECKING:
    from sparkctl.nodes.ssh import SSHConnector

ENGINE_REPO = "sparkctl/sglang-gb10"
LAUNCH_REPO = "sparkctl/sglang-gb10-launch"
ROLE_LABEL = "org.sparkctl.role"
INPUTS_LABEL = "org.sparkctl.inputs-sha256"
BASE_DIGEST_LABEL = "org.sparkctl.base-digest"     # the engine image's base, as its plan pinned it
BASE_IMAGE_LABEL = "org.sparkctl.base-image"


def templates_dir() -> Path:
    return shipped("images")


# The files of sparkctl/images/ that go into a build context as they are (the appliers and the entrypoints: run by
# the image's own python3, never imported here: importing them only to find them cost 15-40 ms of `up`'s plan)
SHIPPED = Path(__file__).parent


@dataclass(frozen=True)
class EngineImages:
    """What the image pipeline builds for one engine."""

    engine_repo: str
    launch_repo: str
    engine_template: str                    # under images/
    launch_template: str
    appliers: tuple[str, ...]               # files of sparkctl/images/ in the engine build context (sparkctl-build/)

    def applier_bytes(self) -> list[bytes]:
        return [(SHIPPED / name).read_bytes() for name in self.appliers]


IMAGES = {"sglang": EngineImages(ENGINE_REPO, LAUNCH_REPO, "engine/Dockerfile.j2", "launch/Dockerfile.j2",
                                 ("patchapply.py",)),
          "vllm": EngineImages("sparkctl/vllm-gb10", "sparkctl/vllm-gb10-launch", "engine/vllm.Dockerfile.j2",
                               "launch/vllm.Dockerfile.j2", ("patchapply.py", "seriesapply.py"))}


def entrypoint_source(doc: JSONObject) -> Path:
    """The entrypoint that reads ``doc``: entrypoint.py for schema 1, entrypoint_rankflags.py for schema 2."""
    return SHIPPED / ("entrypoint.py" if doc["schema"] == launchdoc.SCHEMA else "entrypoint_rankflags.py")


@dataclass(frozen=True)
class BaseImage:
    """The base image as the building node knows it: the ref, its local ID and (if pulled) its repo digest."""

    ref: str
    image_id: str
    digest: str | None = None          # "lmsysorg/sglang@sha256:..." when the node pulled it from a registry

    @property
    def pinned(self) -> str:
        """What identifies the base: the registry digest when known, else the local image ID."""
        return self.digest or self.image_id

    @property
    def from_ref(self) -> str:
        """The FROM line's reference: pinned by digest when the node knows one."""
        return self.digest or self.ref


def inspect_base(conn: SSHConnector, ref: str) -> BaseImage | None:
    """``docker image inspect`` of ``ref`` on a node connection (``.run(argv)``); None when the node lacks it."""
    r = conn.run(["docker", "image", "inspect", "--format", "{{json .Id}} {{json .RepoDigests}}", ref], timeout=30)
    if r.returncode != 0:
        return None
    image_id, digests = r.stdout.strip().split(" ", 1)
    repo = ref.split("@", 1)[0].rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref.split("@", 1)[0]
    repo_digests = json.loads(digests) or []
    digest = next((d for d in repo_digests if d.split("@", 1)[0] == repo), repo_digests[0] if repo_digests else None)
    return BaseImage(ref, json.loads(image_id), digest)


def _sha256(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def _render(template: str, **values: object) -> str:
    import jinja2  # lazy: only the image commands need it

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    return env.get_template(template).render(**values)


def fixed_tar(files: dict[str, bytes]) -> bytes:
    """An uncompressed tar of `files` with fixed metadata (same files -> same bytes): a build context, the launch
    image's load archive (`sparkctl.images.assemble`)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tf.addfile(info, io.BytesIO(files[name]))
    return buf.getvalue()


@dataclass
class ImagePlan:
    builder: str
    base: BaseImage
    series: Series | None
    engine_tag: str
    engine_inputs: JSONObject
    engine_inputs_sha256: str
    engine_dockerfile: str
    launch_tag: str
    launch_inputs: JSONObject
    launch_inputs_sha256: str
    launch_dockerfile: str
    launch_doc: JSONObject
    engine: str = "sglang"

    def to_json(self) -> JSONObject:
        """The plan as `image plan --json` prints it (the same keys as `unresolved_plan`)."""
        return {"profile": self.launch_inputs["profile"], "builder": self.builder, "resolved": True, "unresolved": [],
                "reason": None,
                "engine": {"tag": self.engine_tag, "inputs": self.engine_inputs,
                           "inputs_sha256": self.engine_inputs_sha256},
                "launch": {"tag": self.launch_tag, "inputs": self.launch_inputs,
                           "inputs_sha256": self.launch_inputs_sha256}}

    def engine_context(self) -> bytes:
        files = {"Dockerfile": self.engine_dockerfile.encode()}
        if self.series is not None:
            images = IMAGES[self.engine]
            files.update({f"sparkctl-build/{name}": data for name, data in zip(images.appliers,
                                                                                images.applier_bytes(), strict=True)})
            for path in (self.series.dir / "series", *self.series.patches):
                files[f"sparkctl-build/{self.series.name}/{path.name}"] = path.read_bytes()
        return fixed_tar(files)

    def launch_files(self) -> dict[str, bytes]:
        """The launch image's build context: its Dockerfile and the files its one COPY places."""
        return {"Dockerfile": self.launch_dockerfile.encode(),
                "etc-sparkctl/launch.json": launchdoc.doc_bytes(self.launch_doc),
                "etc-sparkctl/entrypoint.py": entrypoint_source(self.launch_doc).read_bytes()}

    def launch_context(self) -> bytes:
        """The launch context as ``docker build -`` reads it (what the image's assembly reads: `launch_files`)."""
        return fixed_tar(self.launch_files())


def _series(profile: Profile) -> Series | None:
    img = profile.image
    return (load_series(img.patch_series, expect_version=profile.engine_version(), expect_engine=profile.engine,
                        where=profile.origin_of("image.patch_series")) if img.patch_series else None)


def _engine_inputs(profile: Profile, series: Series | None, base_digest: str | None) -> JSONObject:
    """What the engine tag hashes. SGLang's keys are those its deployed tags were computed from (no engine key)."""
    images, img = IMAGES[profile.engine], profile.image
    version = ({"sglang_version": img.sglang_version} if profile.engine == "sglang" else
               {"engine": profile.engine, "engine_version": profile.engine_version()})
    return {"base_image": img.base_image, "base_digest": base_digest, **version,
            "series": series.name if series else None,
            "series_sha256": series.content_hash() if series else None,
            "template_sha256": _sha256((templates_dir() / images.engine_template).read_bytes(),
                                       *images.applier_bytes())}


def _launch_doc(profile: Profile, inventory: Inventory) -> JSONObject:
    placeholders = {k: launchdoc.SECRET_PLACEHOLDER for k in (profile.api.api_key_env, profile.api.hf_token_env) if k}
    return launchdoc.launch_doc(render(profile, inventory, environ=placeholders).specs, profile=profile.name)


def _launch_inputs(profile: Profile, doc: JSONObject, engine_tag: str | None) -> JSONObject:
    template = templates_dir() / IMAGES[profile.engine].launch_template
    return {"engine_tag": engine_tag, "profile": profile.name, "launch_spec_sha256": launchdoc.doc_sha256(doc),
            "template_sha256": _sha256(template.read_bytes(), entrypoint_source(doc).read_bytes())}


def unresolved_plan(profile: Profile, inventory: Inventory, reason: str) -> JSONObject:
    """What can be planned without the building node's docker (`image plan` on the embedded cluster): every input
    but the base image's digest, which pins the engine tag (and so the launch tag); `reason` says why it is not
    known. The shape of ImagePlan.to_json plus `resolved`, `unresolved` and `reason`."""

    series = _series(profile)
    engine_inputs = _engine_inputs(profile, series, None)
    launch_inputs = _launch_inputs(profile, _launch_doc(profile, inventory), None)
    return {"profile": profile.name, "builder": inventory.rank0.name, "resolved": False,
            "unresolved": ["engine.inputs.base_digest", "engine.tag", "launch.inputs.engine_tag", "launch.tag"],
            "reason": reason,
            "engine": {"tag": None, "inputs": engine_inputs, "inputs_sha256": None},
            "launch": {"tag": None, "inputs": launch_inputs, "inputs_sha256": None}}


def plan_images(profile: Profile, inventory: Inventory, base: BaseImage, *, builder: str | None = None) -> ImagePlan:
    """Tags, inputs and Dockerfiles of the profile's engine and launch images (nothing is built)."""

    img = profile.image
    if img.ref:
        raise ConfigError(f"image.ref is set ({img.ref}): the image pipeline builds from image.base_image",
                          where=profile.origin_of("image.ref"), hint="remove image.ref to let sparkctl build images")
    images, engine, version = IMAGES[profile.engine], profile.engine, profile.engine_version()
    series = _series(profile)
    engine_inputs = _engine_inputs(profile, series, base.pinned)
    engine_sha = _sha256(json.dumps(engine_inputs, sort_keys=True).encode())
    engine_tag = f"{images.engine_repo}:{version}-{series.name if series else 'unpatched'}-{engine_sha[:12]}"
    engine_dockerfile = _render(images.engine_template, base_ref=base.from_ref, base_image=img.base_image,
                                base_digest=base.pinned, sglang_version=img.sglang_version, engine=engine,
                                engine_version=version, series=series.name if series else None,
                                series_sha256=engine_inputs["series_sha256"], inputs_sha256=engine_sha)

    doc = _launch_doc(profile, inventory)
    launch_inputs = _launch_inputs(profile, doc, engine_tag)
    launch_sha = _sha256(json.dumps(launch_inputs, sort_keys=True).encode())
    launch_tag = f"{images.launch_repo}:{_tag_safe(profile.name)}-{launch_sha[:12]}"
    launch_dockerfile = _render(images.launch_template, engine_tag=engine_tag, profile=profile.name,
                                launch_spec_sha256=launch_inputs["launch_spec_sha256"],
                                sglang_version=img.sglang_version, engine=engine, engine_version=version,
                                inputs_sha256=launch_sha)
    return ImagePlan(builder or inventory.rank0.name, base, series, engine_tag, engine_inputs, engine_sha,
                     engine_dockerfile, launch_tag, launch_inputs, launch_sha, launch_dockerfile, doc, engine)


def _tag_safe(name: str) -> str:
    import re
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name)[:64] or "profile"
