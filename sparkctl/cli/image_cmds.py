"""Image pipeline commands: `patches check`, `image plan|build|ls|verify|prune` (thin; the work is in
sparkctl.images)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sparkctl.cli.options import PlainFlagsGroup, flag
from sparkctl.errors import ConfigError
from sparkctl.jsontypes import JSONObject

if TYPE_CHECKING:
    from pydantic import BaseModel

    from sparkctl.config.inventory import Inventory
    from sparkctl.config.profile import Profile
    from sparkctl.deploy.progress import Reporter

patches_app = typer.Typer(cls=PlainFlagsGroup, no_args_is_help=True, help="GB10 patch series (patches/<series>/).")
image_app = typer.Typer(cls=PlainFlagsGroup, no_args_is_help=True,
                        help="Engine and launch images: plan, build, list, verify, prune.")


def register(app: typer.Typer) -> None:
    app.add_typer(patches_app, name="patches")
    app.add_typer(image_app, name="image")


@patches_app.command("check")
def patches_check(series: str | None = typer.Option(None, "--series", "-s", help="One series (default: all)."),
                  profile: str | None = typer.Option(None, "--profile", "-p",
                                                        help="Check the profile's series against its engine and "
                                                             "release."),
                  source: Path | None = typer.Option(None, "--source", metavar="PATH",
                                                     help="Check against this copy of the release instead of the "
                                                          "downloaded wheel: a wheel, or an installed package "
                                                          "directory (e.g. .../site-packages/vllm)."),
                  as_json: bool = flag("--json", help="Print JSON on stdout.")) -> None:
    """Apply every patch to the released wheel of the series' engine and release (SGLang or vLLM, cached); report
    each patch."""
    from sparkctl.images.series import check_series, list_series

    expect, engine = None, None
    if profile is not None:
        from sparkctl.config.profile import load_profile
        prof = load_profile(profile)
        if not prof.image.patch_series and series is None:
            raise ConfigError(f"profile {prof.name} names no patch series", where=prof.origin_of("image.patch_series"),
                              hint="set image.patch_series, or pass --series")
        series = series or prof.image.patch_series
        expect, engine = prof.engine_version(), prof.engine
    names = [series] if series else list_series()
    if not names:
        raise ConfigError("no patch series under patches/", hint="add patches/<series>/series")
    if source is not None and len(names) > 1:
        raise ConfigError("--source is one release's source: check one series with it", hint="add --series NAME")
    reports = [check_series(n, expect_version=expect, expect_engine=engine, source=source) for n in names]
    if as_json:
        from sparkctl.cli.outputs import PatchesCheckOutput, emit
        emit(PatchesCheckOutput, [r.to_json() for r in reports])
    else:
        for r in reports:
            print("\n".join(r.lines()))
    for r in reports:
        if not r.ok:
            if as_json:
                print(f"sparkctl: patch series {r.series.name} does not apply", file=sys.stderr)
            r.raise_for_failure()


def _ctx(profile: str | None, inventory: str | None):
    from sparkctl.config.inventory import resolve_inventory
    from sparkctl.config.profile import load_profile

    inv = resolve_inventory(inventory)
    return (load_profile(profile) if profile else None), inv


_PROFILE = typer.Option(..., "--profile", "-p", help="Profile name (profiles/NAME.yml) or path.")
_INVENTORY = typer.Option(None, "--inventory", "-i", help="Ansible inventory file.")
_JSON = flag("--json", help="Print JSON on stdout.")


def _groups(profile: str, inventory: str | None) -> list[tuple[int | None, Profile, Inventory]]:
    """The TP groups whose images a profile names: the one group, or each replica of a replicated profile (its own
    nodes and rank 0, and its own launch image: the launch document carries the group's --dist-init-addr), with
    the profile its replicated `up` deploys; `up` builds each replica's images on that replica's rank 0."""
    prof, inv = _ctx(profile, inventory)
    assert prof is not None
    if prof.replicas == 1:
        return [(None, prof, inv)]
    from sparkctl.router.replicas import render_replicas
    return [(rep.index, rep.result.profile, rep.inventory) for rep in render_replicas(prof, inv)]


def _replica_doc(index: int | None, inv: Inventory, doc: JSONObject) -> JSONObject:
    return doc if index is None else {"index": index, "nodes": [n.name for n in inv.nodes], **doc}


def _emit_groups(single: type[BaseModel], replicated: type[BaseModel], name: str, docs: list[JSONObject]) -> None:
    from sparkctl.cli.outputs import emit
    if len(docs) == 1 and "index" not in docs[0]:
        emit(single, docs[0])
    else:
        emit(replicated, {"profile": name, "replicas": docs})


def _heading(index: int | None, inv: Inventory) -> None:
    if index is not None:
        print(f"## replica {index} on {', '.join(n.name for n in inv.nodes)}")


@image_app.command("plan")
def image_plan(profile: str = _PROFILE, inventory: str | None = _INVENTORY, as_json: bool = _JSON) -> None:
    """Print the engine and launch image tags and their inputs, without building (a replicated profile: each
    replica's, built on its own rank 0). Without docker on the building node (the embedded cluster) the base
    image's digest is unknown: the tags it pins are shown as unresolved."""
    from sparkctl.images import pipeline
    from sparkctl.images.plan import unresolved_plan

    groups = _groups(profile, inventory)
    docs = []
    for index, prof, inv in groups:
        if inv.rank0.runtime != "docker":
            doc = unresolved_plan(prof, inv, f"{inv.rank0.name} (the building node) runs the engine as a local "
                                             f"process, not in Docker: no base image digest to pin the engine tag to")
        else:
            doc = pipeline.plan(prof, inv).to_json()
        docs.append(_replica_doc(index, inv, doc))
    if as_json:
        from sparkctl.cli.outputs import ImagePlanOutput, ImagePlanReplicatedOutput
        _emit_groups(ImagePlanOutput, ImagePlanReplicatedOutput, groups[0][1].name, docs)
        return
    for (index, _, inv), doc in zip(groups, docs, strict=True):
        _heading(index, inv)
        for side in ("engine", "launch"):
            print(f"{side} {doc[side]['tag'] or '(unresolved: base digest)'}")
        print(f"(built on {doc['builder']}; inputs: --json)" + (f"\nunresolved: {doc['reason']}" if doc["reason"]
                                                                 else ""))


@image_app.command("build")
def image_build(profile: str = _PROFILE, inventory: str | None = _INVENTORY,
                copy: bool = typer.Option(True, "--copy/--no-copy", metavar="",
                                          help="Copy to the other nodes over the fabric."),
                as_json: bool = _JSON) -> None:
    """Build the engine + launch images on the rank-0 node (no-op when present), copy them, verify them (a
    replicated profile: each replica's, on its own rank 0, copied to its own nodes, as its `up` does)."""
    from sparkctl.deploy.progress import Reporter

    groups = _groups(profile, inventory)
    progress = Reporter()               # stderr: timestamped lines, or a live display with elapsed time on a terminal
    docs = [_replica_doc(index, inv, _build_group(prof, inv, copy, progress, index)) for index, prof, inv in groups]
    progress.close()
    if as_json:
        from sparkctl.cli.outputs import ImageBuildOutput, ImageBuildReplicatedOutput
        _emit_groups(ImageBuildOutput, ImageBuildReplicatedOutput, groups[0][1].name, docs)
        return
    for (index, _, inv), doc in zip(groups, docs, strict=True):   # each step and copy was reported (stderr)
        _heading(index, inv)
        print(f"engine {doc['engine']['tag']}\nlaunch {doc['launch']['tag']}")
        for tag, per_node in doc["ids"].items():
            print(f"ok {tag}: {', '.join(per_node)}")


def _build_group(prof: Profile, inv: Inventory, copy: bool, progress: Reporter, index: int | None) -> JSONObject:
    from sparkctl.images import pipeline
    from sparkctl.state.ledger import Ledger

    of = "" if index is None else f" (replica {index})"
    log_dir = Ledger.for_cluster(inv.cluster.name).root / "builds"
    progress.stage("image-build", f"engine + launch image on {inv.rank0.name}{of}")
    p, steps = pipeline.build(prof, inv, log_dir=log_dir, report=progress.event)
    transfers: list = []
    if copy:
        progress.stage("image-copy", f"to every other node{of} at once over the fabric (missing layers, or a "
                                      "whole-image stream to a node lacking most)")
        transfers = pipeline.distribute_plan(p, inv, report=progress.event)
        progress.stage("image-verify", f"one ID per image on every node{of}")
    ids = pipeline.verify(p, inv) if copy else {}
    return {**p.to_json(), "steps": [s.__dict__ for s in steps],
            "transfers": [{"node": t.node, "image": t.image, "skipped": t.skipped,
                           "layers": [x.__dict__ for x in t.layers],
                           "rx_bytes": t.rx_bytes, "seconds": t.seconds, "via": t.via} for t in transfers],
            "ids": ids}


@image_app.command("ls")
def image_ls(inventory: str | None = _INVENTORY, as_json: bool = _JSON) -> None:
    """Per node: the sparkctl-built images (tags, IDs, role, labels, sizes)."""
    from sparkctl.images import manage, pipeline

    _, inv = _ctx(None, inventory)
    rows = manage.list_images(pipeline.connections(inv))
    if as_json:
        from sparkctl.cli.outputs import ImageListOutput, emit
        emit(ImageListOutput, rows)
        return
    for r in rows:
        print(f"{r['node']:<10} {r['role'] or '?':<7} {r['id'][7:19]} {r['size'] / 1e6:9.1f} MB  "
              f"{', '.join(r['tags']) or '<untagged>'}")


@image_app.command("verify")
def image_verify(profile: str = _PROFILE, inventory: str | None = _INVENTORY, as_json: bool = _JSON) -> None:
    """Check every node holds the profile's planned engine + launch images with one ID each (what up checks; a
    replicated profile: each replica's nodes its own replica's images)."""
    from sparkctl.images import pipeline

    ids: dict[str, dict[str, str]] = {}
    for _, prof, inv in _groups(profile, inventory):
        for tag, per_node in pipeline.verify(pipeline.plan(prof, inv), inv).items():
            ids.setdefault(tag, {}).update(per_node)    # the replicas' engine tag is one; launch tags are theirs
    if as_json:
        from sparkctl.cli.outputs import ImageVerifyOutput, emit
        emit(ImageVerifyOutput, ids)
        return
    for tag, per_node in ids.items():
        print(f"ok {tag}: {', '.join(per_node)} ({next(iter(per_node.values()))[7:19]})")


@image_app.command("prune")
def image_prune(inventory: str | None = _INVENTORY,
                dry_run: bool = flag("--dry-run", help="Only say what would be removed."),
                as_json: bool = _JSON) -> None:
    """Remove sparkctl-built images that no deployment in the ledger uses (base images are never touched)."""
    from rich.filesize import decimal

    from sparkctl.images import manage, pipeline
    from sparkctl.images.registry import Endpoint
    from sparkctl.state.ledger import Ledger

    _, inv = _ctx(None, inventory)
    keep = manage.images_in_use([Ledger.for_cluster(inv.cluster.name).root])
    conns = pipeline.connections(inv)
    listed = manage.list_images(conns)                     # once: the prune and the caches both read it
    rows = manage.prune_images(conns, keep, dry_run=dry_run, listed=listed)
    caches = manage.prune_registry_caches([Endpoint.of(inv, n) for n in inv.nodes], listed, rows, dry_run=dry_run)
    if as_json:
        from sparkctl.cli.outputs import ImagePruneOutput, emit
        emit(ImagePruneOutput, {"images": rows, "registry_caches": caches})
        return
    for r in rows:
        state = "would remove" if dry_run else ("FAILED to remove" if r.get("error") else "removed")
        print(f"{r['node']:<10} {state} {', '.join(r['tags']) or r['id'][7:19]}"
              + (f": {r['error']}" if r.get("error") else ""))
    for node, c in caches.items():
        if c["removed"]:
            print(f"{node:<10} registry cache: {'would drop' if dry_run else 'dropped'} {len(c['removed'])} image(s)"
                  + ("" if dry_run else f", freed {decimal(c['freed'])}"))
    print(f"{len(rows)} image(s); kept {len(keep)} reference(s) used by the ledger's deployments")
