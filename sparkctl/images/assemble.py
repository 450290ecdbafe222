"""The launch image made by sparkctl itself: what ``docker build`` makes of the launch Dockerfile, as a ``docker
load`` archive that carries only the launch layer, loaded on every node.

Why: a launch image is the engine image plus one thin layer (the launch document and the entrypoint) and a few
settings. Built with ``docker build`` on the building node, every other node had to get it by ``docker save``
there, and ``docker save`` reads the whole image (the engine's gigabytes) to write the one layer a peer lacks:
18.8-24.8 s for a 41 kB flag change on the 2.8 GB test image (stop 40), minutes for a ~20 GB SGLang image on a
Spark. Assembled here, a flag change costs one ``docker image inspect`` of the engine image and a few kilobytes
over each node's SSH connection; nothing of the engine image is read or sent.

What is assembled is exactly what the rendered launch Dockerfile says (it stays the launch image's one
specification and its tag's input): ``FROM`` the engine image, ``COPY etc-sparkctl/ /etc/sparkctl/`` of the launch
context's files, ``ENTRYPOINT``, ``CMD`` and ``LABEL``. Any other instruction is refused (`ImageError`), so a
template that grows a ``RUN`` cannot be silently half-built. The image is deterministic: the layer is a tar with
fixed metadata, the config is canonical JSON whose ``created`` is the engine image's, so every node that loads it
holds the same image ID, computed before any node is touched (`LaunchArchive.image_id`).

The archive is ``docker save``'s format (manifest.json, the config, layer tars) naming every layer of the image
but holding only the launch layer's tar: ``docker load`` reads a layer's file only when it does not already store
the layer by chain (measured on Docker 20.10, as the fabric stream relies on: `sparkctl.images.stream`), so a node
must hold the engine image first (`sparkctl.images.pipeline` distributes it before placing the launch image). On
Docker's containerd image store the image ID is the manifest's digest, not the config's: there a node's launch image
never matches `image_id` and is loaded again on each placement (idempotent, a few kB); not run here.

Example::

    engine = EngineConfig.inspect(conn, plan.engine_tag)
    archive = launch_archive(plan, engine)
    archive.image_id                      # "sha256:..." on every node that loads it
    conn.run(["docker", "load"], stdin=archive.data, check=True)
"""
from __future__ import annotations

import hashlib
import io
import json
import shlex
import tarfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkctl.errors import ImageError
from sparkctl.images.plan import ImagePlan, fixed_tar
from sparkctl.jsontypes import JSONObject

if TYPE_CHECKING:
    from sparkctl.nodes.ssh import SSHConnector

CONTEXT_DIR = "etc-sparkctl/"           # the launch context's directory that the one COPY places
DEST_DIR = "/etc/sparkctl/"


@dataclass(frozen=True)
class EngineConfig:
    """What the launch image inherits from its engine image (``docker image inspect`` on one node)."""

    image_id: str
    config: JSONObject                  # the image's container config (Env, WorkingDir, Labels, ...)
    layers: tuple[str, ...]             # RootFS.Layers: diff IDs, bottom first
    architecture: str
    os: str
    variant: str | None
    created: str

    @classmethod
    def inspect(cls, conn: SSHConnector, ref: str) -> EngineConfig:
        r = conn.run(["docker", "image", "inspect", ref], timeout=60)
        if r.returncode != 0:
            raise ImageError(f"engine image {ref} is missing on {getattr(conn, 'name', 'the building node')}: the "
                             f"launch image is assembled on top of it", where="image build (launch)",
                             hint="sparkctl image build builds the engine image first", evidence=r.output[-800:])
        (img,) = json.loads(r.stdout)
        return cls(img["Id"], dict(img.get("Config") or {}), tuple(img["RootFS"]["Layers"]), img["Architecture"],
                   img["Os"], img.get("Variant") or None, img["Created"])


@dataclass(frozen=True)
class LaunchArchive:
    """A ``docker load`` archive of the launch image: its tag, ID, the launch layer's diff ID and the bytes."""

    tag: str
    image_id: str
    layer_diff_id: str
    data: bytes


@dataclass(frozen=True)
class LaunchDockerfile:
    """The rendered launch Dockerfile, read: the image it starts from and what it sets."""

    from_ref: str
    entrypoint: list[str]
    cmd: list[str]
    labels: dict[str, str]


def read_dockerfile(text: str) -> LaunchDockerfile:
    """The launch Dockerfile's instructions; ImageError for anything ``launch_archive`` cannot assemble."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    found: dict[str, str] = {}
    for line in logical:
        op, _, args = line.partition(" ")
        op = op.upper()
        if op not in ("FROM", "COPY", "ENTRYPOINT", "CMD", "LABEL") or op in found:
            raise ImageError(f"the launch Dockerfile has an instruction sparkctl does not assemble: {line[:80]!r}",
                             where="image plan (launch)",
                             hint="a launch image is FROM, one COPY of etc-sparkctl/, ENTRYPOINT, CMD and LABEL; "
                                  "put anything else in the engine image's template")
        found[op] = args.strip()
    missing = [op for op in ("FROM", "COPY", "ENTRYPOINT", "CMD") if op not in found]
    if missing or found["COPY"].split() != [CONTEXT_DIR, DEST_DIR]:
        raise ImageError(f"the launch Dockerfile lacks {', '.join(missing) or f'COPY {CONTEXT_DIR} {DEST_DIR}'}",
                         where="image plan (launch)", hint="restore the shipped images/launch template")
    labels = {}
    try:
        words = shlex.split(found.get("LABEL", ""))
    except ValueError as exc:          # an unbalanced quote (a profile name with a `"` in it)
        raise ImageError(f"launch Dockerfile LABEL cannot be read: {exc}", where="image plan (launch)",
                         hint="name the profile with letters, digits, '-', '_' and '.' only") from None
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise ImageError(f"launch Dockerfile LABEL {word!r} is not key=value", where="image plan (launch)")
        labels[key] = value
    return LaunchDockerfile(found["FROM"], _exec_form(found["ENTRYPOINT"]), _exec_form(found["CMD"]), labels)


def _exec_form(args: str) -> list[str]:
    try:
        value = json.loads(args)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ImageError(f"launch Dockerfile ENTRYPOINT/CMD {args[:80]!r} is not a JSON list of strings",
                         where="image plan (launch)", hint="use the exec form, e.g. [\"python3\", \"-I\", ...]")
    return value


def layer_tar(files: dict[str, bytes]) -> bytes:
    """The launch layer: ``files`` (context paths under etc-sparkctl/) at /etc/sparkctl/, as ``COPY`` places them
    (root-owned, the context's modes), with fixed metadata: the same files give the same bytes, so the same diff ID."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        top = tarfile.TarInfo(DEST_DIR.strip("/") + "/")
        top.type, top.mode, top.mtime = tarfile.DIRTYPE, 0o755, 0
        tf.addfile(top)
        for name in sorted(files):
            if not name.startswith(CONTEXT_DIR) or "/" in name[len(CONTEXT_DIR):]:
                raise ImageError(f"launch context file {name!r} is not directly under {CONTEXT_DIR}",
                                 where="image build (launch)")
            info = tarfile.TarInfo(DEST_DIR.strip("/") + "/" + name[len(CONTEXT_DIR):])
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tf.addfile(info, io.BytesIO(files[name]))
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def launch_archive(plan: ImagePlan, engine: EngineConfig) -> LaunchArchive:
    """The plan's launch image on top of ``engine`` (the plan's engine image, inspected), as a load archive."""
    spec = read_dockerfile(plan.launch_dockerfile)
    if spec.from_ref != plan.engine_tag:
        raise ImageError(f"the launch Dockerfile starts FROM {spec.from_ref}, not the plan's engine image "
                         f"{plan.engine_tag}", where="image plan (launch)")
    layer = layer_tar({k: v for k, v in plan.launch_files().items() if k.startswith(CONTEXT_DIR)})
    diff_id = _digest(layer)
    config = dict(engine.config)
    config.update(Image=engine.image_id, Entrypoint=spec.entrypoint, Cmd=spec.cmd,
                  Labels={**(engine.config.get("Labels") or {}), **spec.labels})
    history: list[JSONObject] = [
        {"created": engine.created, "created_by": f"layer {i} of the engine image {plan.engine_tag} "
                                                  f"({engine.image_id[:19]}): docker history {plan.engine_tag}"}
        for i in range(1, len(engine.layers) + 1)]
    history += [{"created": engine.created, "created_by": f"COPY {CONTEXT_DIR} {DEST_DIR}",
                 "comment": "assembled by sparkctl (sparkctl.images.assemble)"},
                {"created": engine.created, "created_by": f"ENTRYPOINT {json.dumps(spec.entrypoint)}",
                 "empty_layer": True},
                {"created": engine.created, "created_by": f"CMD {json.dumps(spec.cmd)}", "empty_layer": True},
                {"created": engine.created, "created_by": "LABEL " + " ".join(f"{k}={v}" for k, v in
                                                                            spec.labels.items()),
                 "empty_layer": True}]
    image: JSONObject = {"architecture": engine.architecture, "os": engine.os, "created": engine.created,
                         "config": config, "history": history,
                         "rootfs": {"type": "layers", "diff_ids": [*engine.layers, diff_id]}}
    if engine.variant:
        image["variant"] = engine.variant
    config_bytes = json.dumps(image, sort_keys=True, separators=(",", ":")).encode()
    image_id = _digest(config_bytes)
    hex_id = image_id.split(":", 1)[1]
    layer_names = [f"{d.split(':', 1)[1]}/layer.tar" for d in (*engine.layers, diff_id)]
    manifest = [{"Config": f"{hex_id}.json", "RepoTags": [plan.launch_tag], "Layers": layer_names}]
    data = fixed_tar({layer_names[-1]: layer, f"{hex_id}.json": config_bytes,
                      "manifest.json": json.dumps(manifest, separators=(",", ":")).encode()})
    return LaunchArchive(plan.launch_tag, image_id, diff_id, data)
