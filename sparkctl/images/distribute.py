"""The same engine image on every node: find it, copy it where it is missing, refuse a mismatch.

The image stage of `up` (design step 3). Identity is the image ID (content hash), not the tag: two nodes
whose tags point at different IDs would run different engines, so sparkctl refuses to launch (as
spark-vllm-docker does). A node that lacks the image gets it streamed from a node that has it
(`docker save` there -> `docker load` here, through the controller's SSH connections), then the IDs are
compared again. The image pipeline (`sparkctl.images.pipeline`) builds images and copies only missing layers
node to node over the fabric (`sparkctl.images.registry`); `up` uses this whole-image copy only for a prebuilt image
(inventory `sparkctl_engine_image` or profile `image.ref`; see `sparkctl.deploy.image_stage`).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from sparkctl.errors import PreflightError
from sparkctl.nodes.fanout import fan_out, raise_first

if TYPE_CHECKING:
    from sparkctl.nodes.docker_runtime import DockerRuntime

log = logging.getLogger("sparkctl.images")


def ensure_same_image(image: str, runtimes: dict[str, DockerRuntime],
                      report: Callable[[str, str], None]) -> dict[str, str]:
    """Make `image` present with one ID on every node of `runtimes` (node name -> DockerRuntime).

    Returns {node: image id}. Raises PreflightError when no node has it or the IDs differ.
    """
    ids = dict(zip(runtimes, raise_first(fan_out(list(runtimes.values()), lambda rt: rt.image_id(image)))))
    present = {n: i for n, i in ids.items() if i}
    if not present:
        raise PreflightError(f"image {image} is on no node ({', '.join(runtimes)})", where="image",
                             hint=f"build or load {image} on one node; sparkctl copies it to the others")
    _refuse_mismatch(image, present)
    source = next(iter(present))
    for node in [n for n, i in ids.items() if not i]:
        t0 = time.monotonic()
        report(f"image {image} missing: copying it from {source}", node)
        moved, _, _ = runtimes[source].ssh.pipe_to(runtimes[node].ssh, ["docker", "save", image],
                                                    ["docker", "load"])
        ids[node] = runtimes[node].image_id(image)
        if not ids[node]:
            raise PreflightError(f"image {image} still missing on {node} after the copy", where=f"[{node}] image",
                                 hint="check the node's disk space and docker daemon")
        elapsed = time.monotonic() - t0
        report(f"image copied from {source}: {moved / 1e6:.0f} MB in {elapsed:.1f}s "
               f"({moved / 1e6 / max(elapsed, 1e-6):.0f} MB/s)", node)
    _refuse_mismatch(image, ids)
    for node, image_id in ids.items():
        report(f"image {image} present ({image_id})", node)
    return {n: str(i) for n, i in ids.items()}


def _refuse_mismatch(image: str, ids: Mapping[str, str | None]) -> None:
    distinct = {i for i in ids.values() if i}
    if len(distinct) > 1:
        shown = ", ".join(f"{n}={str(i)[:19]}" for n, i in ids.items())
        raise PreflightError(f"image {image} differs between nodes ({shown})", where="image",
                             hint="both ranks must run the same engine: remove the stale image on the odd node "
                                  "(docker rmi) and run up again to copy the right one")
