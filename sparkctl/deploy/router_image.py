"""Which image the router container runs on rank 0's node (docker runtime): the engine image the replicas run.

The router starts before the first replica's `up` (whose image stage builds the pipeline's images), so what is on
the node decides:

* **prebuilt** (inventory ``sparkctl_engine_image`` / profile ``image.ref``): that image, which every rank runs;
* **pipeline**: the content-addressed engine tag once the building node (rank 0) holds it; before the first build,
  the profile's base image it is built FROM (lmsysorg/sglang images carry sglang-router; the engine layer only
  patches SGLang), when the node has it;
* otherwise the image render names, and `docker run --pull never` says plainly that it is missing.
"""
from __future__ import annotations

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.deploy.image_stage import ImageSurvey, survey
from sparkctl.sglang.render import RenderResult


def pick_router_image(s: ImageSurvey, profile: Profile, node: str, rendered: str | None) -> str | None:
    """The choice above, from a survey (pure)."""
    if s.mode == "prebuilt" and s.image:
        return s.image
    if s.mode == "pipeline":
        if s.plan is not None and (s.present.get(node) or {}).get(s.plan.engine_tag):
            return s.plan.engine_tag
        if not s.base_missing and s.error is None:
            return profile.image.base_image
    return rendered


def router_image(profile: Profile, inventory: Inventory, result: RenderResult) -> str | None:
    """The image for the router container on the cluster's rank 0 node (None on the process runtime). Read-only:
    one image survey (an SSH round-trip per node)."""
    if inventory.rank0.runtime != "docker":
        return None
    return pick_router_image(survey(profile, inventory, result), profile, inventory.rank0.name,
                             result.specs[0].image)
