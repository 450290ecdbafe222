"""The image pipeline as `up` (and the `sparkctl image` commands) call it: plan -> build -> distribute -> verify.

Each step takes the Inventory and the Profile and talks to the nodes over their verified SSH connections
(`sparkctl.nodes.ssh.connector_for`); each is a no-op with a reason when already satisfied. The building node
is rank 0; the other nodes receive the engine image from it over the fabric, all at once (`sparkctl.images.copy`),
and every node loads the launch image sparkctl assembles on top of it (`sparkctl.images.assemble`).
Example (what `up`'s image stage becomes)::

    plan = prepare(profile, inventory, log_dir=ledger.root / "builds", report=lambda m: reporter.stage("image", m))
    # then run plan.launch_tag on every node, with launchdoc.rank_environment(plan.launch_doc, spec) per rank
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.errors import ConfigError, ImageError
from sparkctl.images.assemble import EngineConfig, launch_archive
from sparkctl.images.build import BuildStep, build_images, ensure_base, place_launch
from sparkctl.images.copy import distribute
from sparkctl.images.manage import verify_images
from sparkctl.images.plan import BaseImage, ImagePlan, inspect_base, plan_images
from sparkctl.images.registry import Endpoint, Transfer
from sparkctl.jsontypes import JSONObject
from sparkctl.nodes.fanout import fan_out, raise_first
from sparkctl.nodes.ssh import connector_for

Report = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def connections(inventory: Inventory) -> JSONObject:
    """{node name: SSH connection} of a docker inventory (rank order); ConfigError for process-runtime nodes."""

    odd = [n.name for n in inventory.nodes if n.runtime != "docker"]
    if odd:
        raise ConfigError(f"node(s) {', '.join(odd)} run the engine as a local process, not in Docker: there are no "
                          f"images to build", where=inventory.path,
                          hint="use an inventory of docker nodes (inventory/sparks.yml or the test cluster)")
    return {n.name: connector_for(inventory, n) for n in inventory.nodes}


def plan(profile: Profile, inventory: Inventory, *, pull: bool = False, base: BaseImage | None = None) -> ImagePlan:
    """The plan, with the base image as the building node knows it (pulled first only when ``pull``), or on
    ``base`` when given (a rollback's recorded base: nothing is read from the node)."""
    builder = inventory.rank0.name
    if base is not None:
        return plan_images(profile, inventory, base, builder=builder)
    conn = connections(inventory)[builder]
    ref = profile.image.base_image
    base = ensure_base(conn, ref, node=builder) if pull else inspect_base(conn, ref)
    if base is None:
        raise ImageError(f"base image {ref} is not on {builder} (the building node): its digest pins the engine tag",
                         where=f"[{builder}] image plan",
                         hint=f"sparkctl image build --profile {profile.name} pulls it, or docker pull {ref} there")
    return plan_images(profile, inventory, base, builder=builder)


def build(profile: Profile, inventory: Inventory, *, log_dir: Path | None = None, report: Report = _quiet,
          base: BaseImage | None = None) -> tuple[ImagePlan, list[BuildStep]]:
    """Pull the base if missing, plan, build engine then launch image on the building node.

    ``base``: plan on this base instead of what the profile's base tag names now (a rollback's recorded base).
    """
    p = plan(profile, inventory, pull=True, base=base)
    return p, build_images(p, connections(inventory)[p.builder], log_dir=log_dir, report=report)


def distribute_plan(p: ImagePlan, inventory: Inventory, *, report: Report = _quiet) -> list[Transfer]:
    """The plan's images on every node: the engine image copied from the building node to every other node, all at
    once (a stream without the layers a peer holds, or the registry when it would send at most half:
    `sparkctl.images.stream.choose_copy`); then the launch image, assembled once from the building node's engine
    image, loaded on every node that lacks it (a few kB over each node's SSH connection, nothing over the fabric,
    no ``docker save`` of the engine: `sparkctl.images.assemble`). The building node is placed too: a launch tag
    there from an older ``docker build`` is replaced, so that every node holds the same ID."""
    source = Endpoint.of(inventory, inventory.node(p.builder))
    peers = [Endpoint.of(inventory, n) for n in inventory.nodes if n.name != p.builder]
    transfers = distribute([p.engine_tag], source, peers, report=report)
    conns = connections(inventory)
    archive = launch_archive(p, EngineConfig.inspect(conns[p.builder], p.engine_tag))

    def place(node: str) -> Transfer:
        step = place_launch(p, conns[node], node=node, archive=archive)
        return Transfer(node, p.launch_tag, step.image_id, via="assembled", seconds=step.seconds,
                        rx_bytes=len(archive.data) if step.built else 0,
                        skipped=None if step.built else step.reason)
    placed = raise_first(fan_out(list(conns), place))
    for t in placed:
        report(t.line())
    return transfers + placed


def verify(p: ImagePlan, inventory: Inventory) -> dict[str, dict[str, str]]:
    """Identity before boot: the plan's images on every node, planned inputs, one ID each."""
    return verify_images(p, connections(inventory))


def prepare(profile: Profile, inventory: Inventory, *, log_dir: Path | None = None,
            report: Report = _quiet) -> ImagePlan:
    """build (when missing) -> distribute -> verify; returns the plan whose launch image the ranks run."""
    p, _ = build(profile, inventory, log_dir=log_dir, report=report)
    distribute_plan(p, inventory, report=report)
    ids = verify(p, inventory)
    for tag, per_node in ids.items():
        report(f"{tag}: same ID on {', '.join(per_node)} ({next(iter(per_node.values()))[:19]})")
    return p
