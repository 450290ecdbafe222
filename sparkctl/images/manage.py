"""What images the nodes hold: list (``image ls``), check identity before boot (``image verify``), prune.

Only images sparkctl built (label ``org.sparkctl.role`` = engine | launch) are listed or pruned; base images
and anything else on the node are never touched. Example::

    rows = list_images({"spark-a": conn_a, "spark-b": conn_b})
    verify_images(plan, {"spark-a": conn_a, "spark-b": conn_b})      # ImageError naming node and image
    rows = list_images(conns)
    removed = prune_images(conns, keep=images_in_use(ledger) | {plan.engine_tag, plan.launch_tag}, listed=rows)
    prune_registry_caches(endpoints, rows, removed)           # and the registry caches' dead layers
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from sparkctl.errors import ImageError
from sparkctl.images.build import image_labels
from sparkctl.images.plan import INPUTS_LABEL, ROLE_LABEL, ImagePlan
from sparkctl.images.registry import prune_cache
from sparkctl.jsontypes import JSONObject
from sparkctl.nodes.fanout import fan_out, raise_first

if TYPE_CHECKING:
    from sparkctl.images.registry import Endpoint
    from sparkctl.nodes.ssh import SSHConnector


def list_images(conns: dict[str, SSHConnector]) -> list[JSONObject]:
    """One row per (node, sparkctl image): tags, ID, role, labels, size in bytes."""
    rows = []
    for node, conn in conns.items():
        r = conn.run(["docker", "images", "--no-trunc", "--filter", f"label={ROLE_LABEL}", "--format", "{{.ID}}"],
                     timeout=60, check=True)
        ids = list(dict.fromkeys(r.stdout.split()))
        if not ids:
            continue
        r = conn.run(["docker", "image", "inspect", *ids], timeout=60, check=True)
        for img in json.loads(r.stdout):
            labels = img.get("Config", {}).get("Labels") or {}
            rows.append({"node": node, "id": img["Id"], "tags": img.get("RepoTags") or [],
                         "role": labels.get(ROLE_LABEL), "size": img.get("Size"), "created": img.get("Created"),
                         "labels": {k: v for k, v in labels.items() if k.startswith("org.sparkctl.")}})
    return rows


def verify_images(plan: ImagePlan, conns: dict[str, SSHConnector]) -> dict[str, dict[str, str]]:
    """Every node has the plan's engine and launch images, with the planned inputs and one ID per image.

    Returns {image: {node: id}}; ImageError naming the node and image otherwise (what ``up`` checks before boot).
    """
    tags = ((plan.engine_tag, plan.engine_inputs_sha256), (plan.launch_tag, plan.launch_inputs_sha256))
    # every (node, image) read at once: one round trip in all (it was one per pair, in turn: 4 on two nodes)
    pairs = [(node, tag) for tag, _ in tags for node in conns]
    found_all = raise_first(fan_out(pairs, lambda pair: image_labels(conns[pair[0]], pair[1])))
    read = dict(zip(pairs, found_all, strict=True))
    out: dict[str, dict[str, str]] = {}
    for tag, sha in tags:
        out[tag] = {}
        for node in conns:
            found = read[node, tag]
            if found is None:
                raise ImageError(f"image {tag} is missing on {node}", where=f"[{node}] image verify",
                                 hint="sparkctl image build (builds on the rank-0 node and copies over the fabric)")
            image_id, labels = found
            if labels.get(INPUTS_LABEL) != sha:
                raise ImageError(f"image {tag} on {node} was not built from this plan (inputs "
                                 f"{(labels.get(INPUTS_LABEL) or 'none')[:16]}, planned {sha[:16]})",
                                 where=f"[{node}] image verify", hint=f"docker rmi {tag} on {node}, then image build")
            out[tag][node] = image_id
        if len(set(out[tag].values())) > 1:
            shown = ", ".join(f"{n}={i[:19]}" for n, i in out[tag].items())
            raise ImageError(f"image {tag} differs between nodes ({shown})", where="image verify",
                             hint="both ranks must run the same image: docker rmi the odd one, then image build")
    return out


def images_in_use(state_dirs: list[Path]) -> set[str]:
    """Image references and IDs named by any deployment record under the ledgers' state directories.

    Only ``<root>/deployments/*.json`` is read (``Ledger.deployment_path``): the state directory also holds Ansible
    artifacts and bench reports, hundreds of JSON files that name no deployment's image.
    """
    keep: set[str] = set()
    for root in state_dirs:
        for path in (root / "deployments").glob("*.json"):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(record, dict):
                continue
            keep.update(s["image"] for s in record.get("specs", [])
                        if isinstance(s, dict) and isinstance(s.get("image"), str) and s["image"])
            keep.update(v for v in (record.get("image_ids") or {}).values() if isinstance(v, str))
            for per_node in (record.get("images") or {}).values():       # engine and launch tags and IDs
                if isinstance(per_node, dict):
                    keep.update(v for v in per_node.values() if isinstance(v, str) and v)
    return keep


def prune_images(conns: dict[str, SSHConnector], keep: set[str], *, dry_run: bool = False,
                 listed: list[JSONObject] | None = None) -> list[JSONObject]:
    """Remove sparkctl-built images on every node unless a tag or ID of theirs is in ``keep``.

    Launch images go before engine images (a launch image is a child of its engine). Returns what was
    (or, with ``dry_run``, would be) removed. ``listed``: the nodes' ``list_images`` rows, when the caller has them.
    """
    removed = []
    rows = sorted(list_images(conns) if listed is None else listed, key=lambda r: r["role"] != "launch")
    keep = set(keep)
    for row in rows:   # a kept launch image keeps its engine image
        if row["role"] == "launch" and (row["id"] in keep or any(t in keep for t in row["tags"])):
            keep.add(row["labels"].get("org.sparkctl.engine-image", ""))
    for row in rows:
        if row["id"] in keep or any(t in keep for t in row["tags"]):
            continue
        if not dry_run:
            r = conns[row["node"]].run(["docker", "rmi", *(row["tags"] or [row["id"]])], timeout=300)
            if r.returncode != 0:
                row["error"] = r.output.strip()[-300:]
        removed.append(row)
    return removed


def prune_registry_caches(endpoints: list[Endpoint], listed: list[JSONObject], removed: list[JSONObject], *,
                          dry_run: bool = False) -> dict[str, JSONObject]:
    """After ``prune_images`` over the ``listed`` rows: each node's registry cache (``Endpoint``) keeps only images
    still on the nodes (listed, less what was removed; a failed ``docker rmi`` left its image there).

    Returns {node: {"removed": [repo:tag ...], "freed": bytes}}.
    """

    gone = {t for r in removed if dry_run or not r.get("error") for t in r["tags"]}
    remaining = {t for r in listed for t in r["tags"]} - gone
    return {ep.name: prune_cache(ep, remaining, dry_run=dry_run) for ep in endpoints}
