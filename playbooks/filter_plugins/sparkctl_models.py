"""Ansible filter ``sparkctl_sync_plan``: which model files to copy from which node to which, from the
nodes' checksum manifests (sparkctl/prepare/model_manifest.py). Pure: the controller sees manifests, never data.

Source of a model: the node whose manifest most nodes share, then the one with the most files, then rank 0
(so on a two-node tie rank 0's copy wins). rsync runs on rank 0 (the only node with the fabric key), so every
copy has rank 0 at one end: a push when rank 0 is the source, a pull when it is the target.
"""
from __future__ import annotations

import json

from sparkctl.jsontypes import JSONObject


def sync_plan(manifests: JSONObject, models: list[str], rank0: str) -> list[JSONObject]:
    """``manifests``: host -> {model: {"status", "files": {relpath: sha256}}} (hosts that did not answer: absent
    or None). Returns one entry per (model, target) that differs: model, source, target, push, files, extra.
    Raises ValueError when a model is on no node, or a copy would not involve rank 0."""
    plan = []
    hosts = [h for h, m in manifests.items() if m]
    for model in models:
        have = {h: manifests[h][model]["files"] for h in hosts if manifests[h].get(model, {}).get("files")}
        if not have:
            raise ValueError(f"model directory {model!r} is on no node (looked on {', '.join(hosts)})")
        keys = {h: json.dumps(files, sort_keys=True) for h, files in have.items()}
        source = sorted(have, key=lambda h: (-list(keys.values()).count(keys[h]), -len(have[h]), h != rank0, h))[0]
        src = have[source]
        for target in hosts:
            if target == source:
                continue
            dst = have.get(target, {})
            files = sorted(rel for rel, digest in src.items() if dst.get(rel) != digest)
            extra = sorted(rel for rel in dst if rel not in src)
            if not files and not extra:
                continue
            if rank0 not in (source, target):
                raise ValueError(f"{model}: {target} needs files from {source}, but copies run from rank 0 "
                                 f"({rank0}); put the model on {rank0} first")
            plan.append({"model": model, "source": source, "target": target, "push": source == rank0,
                         "files": files, "extra": extra})
    return plan


class FilterModule:
    def filters(self) -> JSONObject:
        return {"sparkctl_sync_plan": sync_plan}
