"""The image stage of `up`: image-build -> image-distribute -> image-verify, each a no-op with a reason when satisfied.

Three kinds of cluster (`survey` tells which, read-only, when `up` plans):

* **process** (the embedded local cluster): the emulator runs in place; every image step is a no-op
  ("process runtime: no image").
* **prebuilt**: the inventory names the engine image (``sparkctl_engine_image``) or the profile sets
  ``image.ref``: nothing to build; it is copied whole to a node that lacks it and must have one ID everywhere
  (`sparkctl.images.distribute.ensure_same_image`).
* **pipeline** (the default on Sparks): the profile's base image + patch series become the engine image and
  the launch image on the rank-0 node (`sparkctl.images.pipeline`), built only when their content-addressed
  tags are missing (build logs under ``<state>/builds``), copied to every peer at once over the fabric (missing
  layers, or a whole-image stream to a peer lacking most: `sparkctl.images.copy`), and checked on every node
  (planned inputs, one ID per image) before boot. The ranks then run the
  launch image (`LaunchImage`): ``docker inspect`` of an engine names its profile and launch-spec hash, and a
  rollback runs the previous launch image.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.deploy.steps import IMAGE_BUILD, IMAGE_DISTRIBUTE, IMAGE_STEPS, IMAGE_VERIFY
from sparkctl.errors import ConfigError, ImageError, PreflightError, SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.nodes.fanout import fan_out, raise_first
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.sglang.render import RenderResult

if TYPE_CHECKING:
    from sparkctl.images.plan import BaseImage, ImagePlan
    from sparkctl.nodes.ssh import SSHConnector

STEPS = IMAGE_STEPS
NO_IMAGE = "no-op (process runtime: no image)"


@dataclass(frozen=True)
class LaunchImage:
    """The launch image the ranks run: its tag and launch document (no secrets; per-rank values from the env)."""

    tag: str
    doc: JSONObject

    def environment(self, spec: LaunchSpec) -> dict[str, str]:
        """What this rank's container needs on top of the image (ConfigError when the image cannot run `spec`)."""
        from sparkctl.images.launchdoc import rank_environment
        return rank_environment(self.doc, spec)


@dataclass
class ImageSurvey:
    """What the nodes hold now, and so what each image step will do (see module docstring)."""

    mode: str                                     # process | prebuilt | pipeline
    image: str | None = None                      # prebuilt: the engine image every rank runs
    source: str = ""                              # prebuilt: who names it
    plan: ImagePlan | None = None                 # pipeline: None while the base is missing
    base_missing: bool = False
    pinned_base: BaseImage | None = None          # pipeline: the recorded base a rollback plans on
    present: dict[str, dict[str, str | None]] = field(default_factory=dict)   # node -> {tag: id or None}
    error: str | None = None                      # the survey could not look (unreachable node ...)

    @property
    def identity_key(self) -> str | None:
        """What the launch identity adds: the launch image tag (its content hash) in pipeline mode."""
        return self.plan.launch_tag if self.mode == "pipeline" and self.plan is not None else None

    @property
    def launch(self) -> LaunchImage | None:
        p = self.plan
        return LaunchImage(p.launch_tag, p.launch_doc) if self.mode == "pipeline" and p is not None else None

    def _tags(self) -> list[str]:
        if self.mode == "prebuilt":
            return [self.image or ""]
        return [self.plan.engine_tag, self.plan.launch_tag] if self.plan is not None else []

    def steps(self) -> list[tuple[str, str, bool]]:
        """[(step name, what it does or why it is a no-op, whether it is a no-op)] for the plan: the decision is made
        here, once, and apply runs it (a no-op step's effect is not run; its journal outcome is `noop`)."""
        if self.mode == "process":
            return [(name, f"{name}: {NO_IMAGE}", True) for name in STEPS]
        nodes = list(self.present) or ["every node"]
        if self.error:
            unknown = f"(nodes not surveyed: {self.error})"
            return [(IMAGE_BUILD, f"image-build: build what is missing {unknown}", False),
                    (IMAGE_DISTRIBUTE, f"image-distribute: copy what a node lacks {unknown}", False),
                    (IMAGE_VERIFY, "image-verify: one image ID on every node before boot", False)]
        tags = self._tags()
        if self.mode == "prebuilt":
            build, build_noop = f"no-op (prebuilt image {self.image} named by {self.source}: nothing to build)", True
            ids = {n: v.get(self.image or "") for n, v in self.present.items()}
            lacking = [n for n, i in ids.items() if not i]
            differ = len({i for i in ids.values() if i}) > 1
            dist = (f"refuse: {self.image} differs between nodes (one engine on every rank)" if differ else
                    f"copy {self.image} whole to {', '.join(lacking)} from a node that has it" if lacking else
                    f"no-op ({self.image} on {', '.join(nodes)})")
            dist_noop = not lacking and not differ
        else:
            p = self.plan
            builder = nodes[0]
            if p is None:
                build, build_noop = ("pull the base image (missing on the building node), then build engine + "
                                     "launch images on what the pull gives"), False
                dist = "copy the engine + launch images to the other nodes (missing layers, over the fabric)"
                dist_noop = False
            else:
                have = self.present.get(p.builder, {})
                builder_note = (f" (rollback: on the recorded base {p.base.pinned[:26]}..., which {p.base.ref} "
                                "no longer names)") if self.pinned_base is not None else ""
                build_noop = bool(have.get(p.engine_tag) and have.get(p.launch_tag))
                if build_noop:
                    build = f"no-op ({p.engine_tag} and {p.launch_tag} already on {p.builder})"
                elif have.get(p.engine_tag):
                    build = f"build launch image {p.launch_tag} on {p.builder} (engine image present: one thin layer)"
                else:
                    series = p.series.name if p.series else "no patch series"
                    build = (f"build engine image {p.engine_tag} ({p.base.ref} + {series}) and launch image "
                             f"{p.launch_tag} on {p.builder}")
                build += builder_note
                builder = p.builder
                lacks = {n: [t for t in tags if not v.get(t)] for n, v in self.present.items() if n != builder}
                shown = "; ".join(f"{n} <- {', '.join(ts)}" for n, ts in lacks.items() if ts)
                dist = (f"copy from {builder}: {shown} (missing layers only, over the fabric)" if shown else
                        f"no-op (every node has {', '.join(tags)})")
                dist_noop = not shown
        shown = ", ".join(tags) or "the engine and launch images"
        return [(IMAGE_BUILD, f"image-build: {build}", build_noop),
                (IMAGE_DISTRIBUTE, f"image-distribute: {dist}", dist_noop),
                (IMAGE_VERIFY, f"image-verify: {shown} on {', '.join(nodes)} with one ID each, before boot", False)]

    def stale(self, conn: SSHConnector) -> str | None:
        """Why the nodes no longer hold what this survey saw on the building node (its base moved, a tag it saw
        missing or present changed), or None: apply runs a plan only on the state it was made from, as Terraform
        refuses a stale plan, rather than deciding again (pipeline mode; `conn`: the building node's)."""
        if self.mode != "pipeline":
            return None
        if self.error:
            return f"the plan could not survey the nodes ({self.error})"
        p = self.plan
        if p is None:
            return None                     # planned: pull the base, then build on what the pull gives
        if self.pinned_base is None:        # a rollback plans on its recorded base, whatever the tag names now
            base = inspect_base(conn, p.base.ref)
            if base is None or base.pinned != p.base.pinned:
                return (f"base image {p.base.ref} on {p.builder} changed since the plan ({p.base.pinned[:26]} -> "
                        f"{base.pinned[:26] if base else 'missing'})")
        saw = self.present.get(p.builder, {})
        now = _ids({p.builder: conn}, [p.engine_tag, p.launch_tag])[p.builder]
        moved = [f"{t} ({'missing' if not saw.get(t) else str(saw.get(t))[:19]} -> "
                 f"{'missing' if not now.get(t) else str(now.get(t))[:19]})"
                 for t in (p.engine_tag, p.launch_tag) if saw.get(t) != now.get(t)]
        return f"on {p.builder} since the plan: {', '.join(moved)}" if moved else None


def inspect_base(conn: SSHConnector, ref: str) -> BaseImage | None:
    """The base image `ref` on the building node, or None (``images.plan.inspect_base``)."""
    from sparkctl.images import plan
    return plan.inspect_base(conn, ref)


def _conns(inventory: Inventory) -> JSONObject:
    from sparkctl.images.pipeline import connections
    return connections(inventory)


def _ids(conns: dict[str, SSHConnector], tags: list[str]) -> dict[str, dict[str, str | None]]:
    """{node: {tag: image id or None}}: one round trip per node (``registry.image_ids``), nodes in parallel."""
    from sparkctl.images.registry import image_ids

    def one(conn: SSHConnector) -> dict[str, str | None]:
        return image_ids(conn, tags)
    return dict(zip(conns, raise_first(fan_out(list(conns.values()), one))))


def survey(profile: Profile, inventory: Inventory, result: RenderResult, *,
           base_of: str | None = None) -> ImageSurvey:
    """Read-only: which mode, and what the nodes hold of the images this profile needs.

    ``base_of`` (a rollback: the engine tag the target deployment ran): plan on the base that engine image was
    built from when the building node still has it and the profile's base tag now names another image, so the
    rollback arrives at the recorded images instead of rebuilding on the new base.
    """
    if all(n.runtime != "docker" for n in inventory.nodes):
        return ImageSurvey("process")
    from sparkctl.images.build import recorded_base
    from sparkctl.images.plan import plan_images
    if inventory.cluster.engine_image or profile.image.ref:
        source = ("the inventory (sparkctl_engine_image)" if inventory.cluster.engine_image else
                  f"image.ref of profile {profile.name}")
        s = ImageSurvey("prebuilt", image=result.specs[0].image, source=source)
        tags = [s.image or ""]
    else:
        s = ImageSurvey("pipeline")
        tags = []
    try:
        conns = _conns(inventory)
        if s.mode == "pipeline":
            builder = inventory.rank0.name
            base = inspect_base(conns[builder], profile.image.base_image)
            pinned = recorded_base(conns[builder], base_of, profile.image.base_image) if base_of else None
            if pinned is not None and (base is None or pinned.pinned != base.pinned):
                s.pinned_base = base = pinned
            s.base_missing = base is None
            if base is not None:
                s.plan = plan_images(profile, inventory, base, builder=builder)
                tags = [s.plan.engine_tag, s.plan.launch_tag]
        s.present = _ids(conns, tags) if tags else {n: {} for n in conns}
    except ConfigError:
        raise                                  # a profile the pipeline cannot build: said at plan time
    except SparkctlError as exc:
        s.error = exc.message
    return s


class ImageStage:
    """Runs the three image steps of one `up` (the lifecycle calls build, distribute, verify in that order)."""

    def __init__(self, profile: Profile, inventory: Inventory, result: RenderResult, survey: ImageSurvey, *,
                 runtimes: Any, log_dir: Path, report: Callable[[str, str | None], None]) -> None:
        self.profile, self.inventory, self.result, self.survey = profile, inventory, result, survey
        self.rts, self.log_dir, self.report = runtimes, log_dir, report
        self.plan = survey.plan

    def _built(self) -> ImagePlan:
        """The plan image-build built on: distribute and verify run after it (the step order), never before."""
        if self.plan is None:
            raise ImageError("no image plan: image-build did not run before this step", where=IMAGE_DISTRIBUTE,
                             hint="run the command again (apply runs image-build, image-distribute, image-verify "
                                  "in that order)")
        return self.plan

    def _say(self, message: str) -> None:
        self.report(message, None)

    def build(self) -> None:
        """The planned build: on the survey's plan (refused when stale), or, when the base was missing at plan time,
        the pull the plan names and the build on what it gives."""
        if self.survey.mode != "pipeline":
            return       # its no-op reason is the step's own line (the plan's decision, said once)
        from sparkctl.images import pipeline
        from sparkctl.images.build import build_images
        conn = _conns(self.inventory)[self.inventory.rank0.name]     # the building node (image_stage.survey)
        stale = self.survey.stale(conn)
        if stale is not None:
            raise ImageError(f"the image plan is stale: {stale}", where=IMAGE_BUILD,
                             hint="run the command again: it plans from what the nodes hold now")
        self.log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            if self.plan is None:
                self.plan, steps = pipeline.build(self.profile, self.inventory, log_dir=self.log_dir,
                                                  report=self._say, base=self.survey.pinned_base)
            else:
                steps = build_images(self.plan, conn, log_dir=self.log_dir, report=self._say)
        finally:
            for path in self.log_dir.glob("*.log"):     # state files are private, build logs included
                path.chmod(0o600)
        if any(s.built for s in steps):
            self._say(f"build logs: {self.log_dir}")

    def distribute(self) -> dict[str, str]:
        if self.survey.mode == "process":
            return {}
        from sparkctl.images import pipeline
        from sparkctl.images.distribute import ensure_same_image
        if self.survey.mode == "prebuilt":
            docker = {s.node: self.rts.for_node(s.node) for s in self.result.specs}
            return ensure_same_image(self.survey.image or "", docker, self.report)
        pipeline.distribute_plan(self._built(), self.inventory, report=self._say)
        return {}

    def verify(self) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
        """({node: id of the image the ranks run}, {node: {engine_tag, engine_id, launch_tag, launch_id}})."""
        if self.survey.mode == "process":
            return {}, {}
        from sparkctl.images import pipeline
        from sparkctl.images.distribute import _refuse_mismatch
        if self.survey.mode == "prebuilt":
            image = self.survey.image or ""
            nodes = [s.node for s in self.result.specs]
            ids = dict(zip(nodes, raise_first(fan_out(nodes, lambda n: self.rts.for_node(n).image_id(image))),
                           strict=True))      # every node at once
            missing = [n for n, i in ids.items() if not i]
            if missing:
                raise PreflightError(f"image {image} is missing on {', '.join(missing)} right before boot",
                                     where=IMAGE_VERIFY, hint="run up again (it copies the image)")
            _refuse_mismatch(image, ids)
            self._say(f"{image}: same ID on {', '.join(nodes)} ({next(iter(ids.values()))[:19]})")
            return ({n: str(i) for n, i in ids.items()},
                    {n: {"engine_tag": image, "engine_id": str(i)} for n, i in ids.items()})
        p = self._built()
        tag_ids = pipeline.verify(p, self.inventory)
        for tag, per_node in tag_ids.items():
            self._say(f"{tag}: same ID on {', '.join(per_node)} ({next(iter(per_node.values()))[:19]})")
        self.rts.bind_launch(LaunchImage(p.launch_tag, p.launch_doc))
        images = {n: {"engine_tag": p.engine_tag, "engine_id": tag_ids[p.engine_tag][n],
                      "launch_tag": p.launch_tag, "launch_id": tag_ids[p.launch_tag][n]} for n in tag_ids[p.launch_tag]}
        return dict(tag_ids[p.launch_tag]), images
