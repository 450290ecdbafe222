"""Build the planned engine and launch images on the building node, over its SSH connection.

The engine image: ``docker build -`` reads the build context (a small tar: Dockerfile, patch applier + series) from
stdin over the node's SSH channel; the legacy builder (``DOCKER_BUILDKIT=0``) is used because it needs no buildx
plugin on the node and its layer-per-instruction output is what the layer tests check. The launch image (the
engine + one thin layer): assembled by sparkctl from its Dockerfile and loaded (`sparkctl.images.assemble`), the
same image on every node without reading the engine image (`place_launch`). Each step is a no-op with a reason
when the tag is already there with the planned content (label ``org.sparkctl.inputs-sha256``); a tag that exists
with other content is refused, never overwritten. Build logs are written to ``log_dir`` when given. Example::

    plan = plan_images(profile, inv, ensure_base(conn, profile.image.base_image, node="spark-a"))
    for step in build_images(plan, conn, log_dir=state / "builds"):
        print(step.line())       # "engine sparkctl/sglang-gb10:... built in 41.2s (sha256:...)"
"""
from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparkctl.errors import ImageError
from sparkctl.images.assemble import EngineConfig, LaunchArchive, launch_archive
from sparkctl.images.plan import BASE_DIGEST_LABEL, BASE_IMAGE_LABEL, INPUTS_LABEL, BaseImage, ImagePlan, inspect_base
from sparkctl.statefiles import private_dir, write_text_atomic

if TYPE_CHECKING:
    from sparkctl.nodes.ssh import SSHConnector

log = logging.getLogger("sparkctl.images")
_PATCH_FAILED = re.compile(r"^sparkctl-patch: (FAILED|ERROR) .*$", re.M)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")        # the legacy builder colours a RUN step's stderr


@dataclass
class BuildStep:
    role: str                    # "engine" | "launch"
    tag: str
    image_id: str
    built: bool
    seconds: float
    reason: str

    def line(self) -> str:
        what = (f"{'built' if self.reason == 'built' else self.reason} in {self.seconds:.1f}s" if self.built
                else f"no build ({self.reason})")
        return f"{self.role} {self.tag} {what} ({self.image_id[:19]})"


def image_labels(conn: SSHConnector, ref: str) -> tuple[str, dict[str, str]] | None:
    """(image id, labels) of ``ref`` on the node, or None when absent."""
    r = conn.run(["docker", "image", "inspect", "--format", "{{json .Id}} {{json .Config.Labels}}", ref], timeout=30)
    if r.returncode != 0:
        return None
    image_id, labels = r.stdout.strip().split(" ", 1)
    return json.loads(image_id), json.loads(labels) or {}


def recorded_base(conn: SSHConnector, engine_tag: str, ref: str) -> BaseImage | None:
    """The base an engine image on the node was built from (its labels), when that was ``ref``; else None.

    A rollback plans on it, so it arrives at the recorded engine and launch tags even after ``ref`` was
    re-pulled or re-tagged to another image (the recorded images are then used, not rebuilt on the new base).
    """
    found = image_labels(conn, engine_tag)
    labels = found[1] if found else {}
    pinned = labels.get(BASE_DIGEST_LABEL)
    if not pinned or labels.get(BASE_IMAGE_LABEL) != ref:
        return None
    return BaseImage(ref, pinned, pinned if "@" in pinned else None)


def ensure_base(conn: SSHConnector, ref: str, *, node: str, pull: bool = True, timeout: float = 3600) -> BaseImage:
    """The base image on the building node: inspected, or pulled once when missing; ImageError if neither."""
    base = inspect_base(conn, ref)
    if base is not None:
        return base
    if pull:
        log.info("[%s] base image %s missing: docker pull", node, ref)
        r = conn.run(["docker", "pull", ref], timeout=timeout, merge_stderr=True)
        base = inspect_base(conn, ref) if r.returncode == 0 else None
        if base is not None:
            return base
        evidence = r.stdout[-1500:]
    else:
        evidence = None
    raise ImageError(f"base image {ref} is missing on {node} and could not be pulled", where=f"[{node}] image build",
                     hint=f"docker pull {ref} on {node} (registry access), or docker load it there; or set "
                          f"image.base_image to an image {node} has", evidence=evidence)


def _check_existing(conn: SSHConnector, tag: str, inputs_sha256: str, node: str) -> str | None:
    found = image_labels(conn, tag)
    if found is None:
        return None
    image_id, labels = found
    if labels.get(INPUTS_LABEL) != inputs_sha256:
        raise ImageError(f"tag {tag} on {node} holds other content (label {INPUTS_LABEL}="
                         f"{labels.get(INPUTS_LABEL) or 'none'}, planned {inputs_sha256[:16]}...)",
                         where=f"[{node}] image {tag}",
                         hint=f"someone built or loaded another image under this tag: docker rmi {tag} on {node}, "
                              f"then build again")
    return image_id


def build_image(conn: SSHConnector, *, role: str, tag: str, context: bytes, inputs_sha256: str, node: str,
                log_dir: Path | None = None, timeout: float = 7200,
                before_build: Callable[[], None] | None = None) -> BuildStep:
    """Build one image from a tar context on the node (no-op when the tag holds the planned content).

    ``before_build`` runs only when a build is needed, right before it (the engine's base check)."""
    existing = _check_existing(conn, tag, inputs_sha256, node)
    if existing:
        return BuildStep(role, tag, existing, False, 0.0, "tag present with the planned inputs")
    if before_build is not None:
        before_build()
    t0 = time.monotonic()
    r = conn.run(["env", "DOCKER_BUILDKIT=0", "docker", "build", "--force-rm", "-t", tag, "-"], stdin=context,
                 timeout=timeout, merge_stderr=True)
    seconds = time.monotonic() - t0
    output = _ANSI.sub("", r.stdout).replace("\r", "")
    if log_dir is not None:             # sparkctl's state: private, atomic, no link followed (sparkctl.statefiles)
        path = private_dir(log_dir) / f"{role}-{tag.rsplit(':', 1)[-1]}-{int(time.time())}.log"
        write_text_atomic(path, output)
    if r.returncode != 0:
        failed = [m.group(0) for m in _PATCH_FAILED.finditer(output)]
        message = (f"{role} image build failed on {node}: " + "; ".join(s.removeprefix("sparkctl-patch: ")
                                                                         for s in failed)) if failed else \
            f"{role} image build failed on {node} (docker build exit {r.returncode})"
        raise ImageError(message, where=f"[{node}] image {tag}",
                         hint=("rebase the patch onto the engine source the base image carries (sparkctl patches "
                               "check), or change image.base_image / image.patch_series") if failed else
                              "see the build log" + (f" under {log_dir}" if log_dir else ""),
                         evidence="\n".join(output.rstrip().splitlines()[-25:]))
    found = _check_existing(conn, tag, inputs_sha256, node)
    if not found:
        raise ImageError(f"{role} image {tag} missing on {node} right after its build", where=f"[{node}] image build",
                         hint="look at the node's docker daemon (disk space, concurrent prune)")
    return BuildStep(role, tag, found, True, round(seconds, 2), "built")


def build_images(plan: ImagePlan, conn: SSHConnector, *, log_dir: Path | None = None,
                 report: Callable[[str], None] = lambda _: None) -> list[BuildStep]:
    """Engine then launch image on ``plan.builder`` (each a no-op with a reason when already there): the engine by
    ``docker build``, the launch image assembled on it (`place_launch`)."""
    node = plan.builder

    def base_unchanged() -> None:
        # only a build reads the base: a present engine image (a rollback's, on a base since re-tagged) is used
        current = inspect_base(conn, plan.base.ref)
        if current is None or current.pinned != plan.base.pinned:
            raise ImageError(f"base image {plan.base.ref} changed on {node} since the plan "
                             f"({plan.base.pinned[:26]} -> {current.pinned[:26] if current else 'missing'})",
                             where=f"[{node}] image build", hint="plan again (sparkctl image build re-plans)")
    steps = [build_image(conn, role="engine", tag=plan.engine_tag, context=plan.engine_context(),
                         inputs_sha256=plan.engine_inputs_sha256, node=node, log_dir=log_dir,
                         before_build=base_unchanged)]
    report(steps[0].line())
    steps.append(place_launch(plan, conn, node=node))
    report(steps[1].line())
    return steps


def place_launch(plan: ImagePlan, conn: SSHConnector, *, node: str,
                 archive: LaunchArchive | None = None) -> BuildStep:
    """The plan's launch image on one node that holds its engine image: assembled (`sparkctl.images.assemble`) and
    loaded, a no-op when the tag already holds that image. ``archive``: the one a caller assembled for every node
    (else assembled from this node's engine image). A tag with the planned inputs but another ID (made by
    ``docker build`` before sparkctl assembled launch images) is replaced, so that every node holds one ID."""
    existing = _check_existing(conn, plan.launch_tag, plan.launch_inputs_sha256, node)
    t0 = time.monotonic()
    archive = archive or launch_archive(plan, EngineConfig.inspect(conn, plan.engine_tag))
    if existing == archive.image_id:
        return BuildStep("launch", plan.launch_tag, existing, False, 0.0, "tag present with the planned inputs")
    r = conn.run(["docker", "load"], stdin=archive.data, timeout=300, merge_stderr=True)
    if r.returncode != 0:
        raise ImageError(f"docker load of the launch image {plan.launch_tag} failed on {node}",
                         where=f"[{node}] image {plan.launch_tag}",
                         hint=f"the node must hold the engine image {plan.engine_tag} (sparkctl image build copies "
                              f"it first); check its docker daemon and disk space",
                         evidence=_ANSI.sub("", r.stdout)[-1500:])
    found = _check_existing(conn, plan.launch_tag, plan.launch_inputs_sha256, node)
    if not found:
        raise ImageError(f"launch image {plan.launch_tag} missing on {node} right after its load",
                         where=f"[{node}] image {plan.launch_tag}",
                         hint="look at the node's docker daemon (disk space, concurrent prune)")
    return BuildStep("launch", plan.launch_tag, found, True, round(time.monotonic() - t0, 2),
                     f"assembled, {len(archive.data)} B loaded" + (" in place of a docker-built one" if existing
                                                                    else ""))


def image_layers(conn: SSHConnector, ref: str) -> list[str]:
    """The image's layer diff IDs (RootFS.Layers), bottom first."""
    r = conn.run(["docker", "image", "inspect", "--format", "{{json .RootFS.Layers}}", ref], timeout=30, check=True)
    return list(json.loads(r.stdout))
