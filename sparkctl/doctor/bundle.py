"""`doctor --bundle FILE`: one redacted JSON file to attach to an issue.

One JSON document rather than a tar.gz: it opens in any editor or `jq`, a reader sees at once everything it holds
(no member to forget when checking it for secrets), the secret sweep greps it as it is, and its size is bounded
anyway (log tails, not logs). Schema ``sparkctl-doctor-bundle/1``: versions, the deployment's summary and steps,
every rank's rendered argv and env, the journal, the tail of each source read, the preflight facts and the findings.

Redaction: the record's argv and env were stored redacted (LaunchSpec.redacted); they pass again through
`redact_argv` and SECRET_ENV, and every string of the bundle through `redact` (sparkctl.redaction, the one
redaction rule) with the values of the environment variables that hold secrets here (the profile's api_key_env and
hf_token_env, and SECRET_ENV's) plus its ServerArgs field rule (``api_key='...'``).

URLs: every http(s) URL in the bundle is shown as the webhook's URL is (`sparkctl.watch.notify.shown_url`:
credentials, query string and token-like path segments as ``***``).

The path is the user's, written through `sparkctl.userfiles` (never a directory, never through a link, never its
parent created or chmod-ed; an existing file only with ``--force``); a new file is created 0600 (it holds logs and
a deployment's details), an existing one keeps its mode.
"""
from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

from sparkctl.doctor.collect import Collected, DoctorReport
from sparkctl.jsontypes import JSONObject, JSONValue
from sparkctl.redaction import REDACTED, SECRET_ENV, SECRET_OPTIONS, redact, redact_argv
from sparkctl.resources import version
from sparkctl.state.ledger import now_iso
from sparkctl.state.records import DeploymentRecord
from sparkctl.userfiles import write_user_file
from sparkctl.watch.notify import mask_urls

SCHEMA = "sparkctl-doctor-bundle/1"
TAIL_LINES = 200
TAIL_LINE_CHARS = 2000


def secret_values(rec: DeploymentRecord | None, environ: dict[str, str] | None = None) -> set[str]:
    """Values of this environment's secret variables: the record's profile's api_key_env / hf_token_env (their
    defaults when there is no record) and SECRET_ENV."""
    env = dict(os.environ if environ is None else environ)
    names = set(SECRET_ENV) | {"SPARKCTL_API_KEY", "HF_TOKEN"}
    if rec is not None:
        api = rec.profile_data.get("api") or {}
        names |= {n for n in (api.get("api_key_env"), api.get("hf_token_env")) if n}
    return {env[n] for n in names if env.get(n)}


def _scrub(value: object, secrets: set[str]) -> JSONValue:
    if isinstance(value, str):
        return mask_urls(redact(value, secrets))
    if isinstance(value, list):
        return [_scrub(v, secrets) for v in value]
    if isinstance(value, dict):
        return {mask_urls(redact(str(k), secrets)): _scrub(v, secrets) for k, v in value.items()}
    return value


def _tail(text: str) -> list[str]:
    lines = text.splitlines()[-TAIL_LINES:]
    return [ln if len(ln) <= TAIL_LINE_CHARS else f"{ln[:TAIL_LINE_CHARS]}... [{len(ln) - TAIL_LINE_CHARS} more "
            f"characters]" for ln in lines]


def bundle_data(report: DoctorReport, got: Collected, rec: DeploymentRecord | None,
                secrets: set[str]) -> JSONObject:
    """The bundle as JSON data, redacted."""
    data: JSONObject = {
        "schema": SCHEMA, "created": now_iso(),
        "versions": {"sparkctl": version(), "python": sys.version.split()[0], "platform": platform.platform(),
                     "sglang": rec.sglang_version if rec else None,
                     "images": {n: i.model_dump(mode="json") for n, i in rec.images.items()} if rec else {}},
        "report": report.model_dump(mode="json"),
        "deployment": None, "ranks": [], "journal": [],
        "log_tails": {t.name: _tail(t.text) for t in got.texts},
        "facts": [c.model_dump(mode="json") for c in rec.preflight] if rec else [],
    }
    if rec is not None:
        steps = [s.model_dump(mode="json") for s in rec.steps]
        data["deployment"] = {
            "id": rec.id, "command": rec.command, "kind": rec.command,    # kind = command: RENAMED_KEYS' way
            "profile": rec.profile, "cluster": rec.cluster, "emulated": rec.emulated,
            "status": rec.status.value, "created": rec.created, "finished": rec.finished,
            "failure": rec.failure.model_dump(mode="json") if rec.failure else None, "rollback": rec.rollback,
            "restored": rec.restored, "restore_error": rec.restore_error,
            "steps": steps, "stages": steps,                   # stages = steps: RENAMED_KEYS, until the next release
            "gates": [g.model_dump(mode="json") for g in rec.gates],
            "capacity": rec.capacity.model_dump(mode="json") if rec.capacity else None,
            "identity": rec.identity, "endpoint": rec.endpoint}
        data["ranks"] = [{"rank": s.rank, "node": s.node, "image": s.image,
                          "argv": redact_argv(list(s.argv), SECRET_OPTIONS),
                          "env": {k: REDACTED if k in SECRET_ENV else v for k, v in sorted(s.env.items())}}
                         for s in rec.specs]
        data["journal"] = [e.line() for e in rec.journal]
    return _scrub(data, secrets)


def write_bundle(path: Path, data: JSONObject, *, force: bool = False) -> Path:
    """Write the bundle at `path` through the one writer of user files (`sparkctl.userfiles`): atomic, never
    through a link, an existing file replaced only with `force` (keeping its mode), a new one 0600 (it holds a
    deployment's details); OutputPathError (exit 2) naming --bundle otherwise."""
    body = (json.dumps(data, indent=2, sort_keys=False) + "\n").encode("utf-8")
    return write_user_file(path, body, overwrite=force, option="--bundle")
