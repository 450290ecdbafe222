"""The launch image's ``/etc/sparkctl/launch.json``: the rank-independent part of the rendered LaunchSpecs.

`launch_doc(specs)` compares every rank's argv and env (render builds them in the same order): what is equal
on every rank and not secret goes into the image; a value that differs between ranks (``--node-rank``,
``--host``) or names a secret file (``--config /run/sparkctl-secrets/...``, present only when the rank has
an API key) becomes a placeholder ``{"env": "SPARKCTL_ARG_NODE_RANK"}`` that the
entrypoint (`sparkctl.images.entrypoint`) fills from the container's environment, and env keys that differ
(``SGLANG_HOST_IP``, ``NCCL_SOCKET_IFNAME`` ...) or name a secret file (``HF_TOKEN_PATH``) are listed in
``rank_env`` / ``optional_env``: the
container must carry them. `rank_environment(doc, spec)` is what a runtime passes to one rank's container.
The document holds no secret: its hash names the launch image. Example::

    doc = launch_doc(render(profile, inventory, environ=SECRET_PLACEHOLDERS).specs, profile="d5")
    doc["argv"][:3]                              # ['python3', '-m', 'sglang.launch_server']
    rank_environment(doc, specs[1])["SPARKCTL_ARG_NODE_RANK"]   # '1'
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence

from sparkctl.errors import ConfigError
from sparkctl.jsontypes import JSONObject
from sparkctl.redaction import SECRET_ENV
from sparkctl.sglang.launch import SECRETS_MOUNT, LaunchSpec

LAUNCH_JSON = "/etc/sparkctl/launch.json"
SCHEMA = 1
ARG_ENV_PREFIX = "SPARKCTL_ARG_"
SECRET_PLACEHOLDER = "sparkctl-secret-placeholder"   # rendered in place of API key / HF token for the image


def _arg_env(flag: str) -> str:
    return ARG_ENV_PREFIX + re.sub(r"[^A-Z0-9]+", "_", flag.lstrip("-").upper())


def launch_doc(specs: Sequence[LaunchSpec], *, profile: str) -> JSONObject:
    """The rank-independent launch document of ``specs`` (one per rank, from one render)."""
    if not specs:
        raise ConfigError("no ranks to build a launch image for")
    argvs = [s.argv for s in specs]
    if len({len(a) for a in argvs}) != 1:
        raise ConfigError("ranks differ in argv length; a launch image needs the same flags on every rank",
                          hint="per-rank extra_args are not supported in launch images")
    secret_flags = frozenset().union(*(s.secret_options for s in specs))

    def secret_file(token: str | None) -> bool:
        """The path of a secret file (present only when the rank has that secret)."""
        return token is not None and token.startswith(SECRETS_MOUNT + "/")

    def optional_at(i: int, tokens: tuple[str, ...]) -> bool:
        """By field, never by value: the value of a secret flag (``--api-key X``), or a secret file's path. A number
        that happens to equal a secret stays a plain flag value."""
        return (i > 0 and argvs[0][i - 1] in secret_flags) or any(secret_file(t) for t in tokens)
    argv: list[str | JSONObject] = []      # a token every rank shares, or where its value comes from
    for i, tokens in enumerate(zip(*argvs)):
        if len(set(tokens)) == 1 and not optional_at(i, tokens):
            argv.append(tokens[0])
            continue
        flag = argvs[0][i - 1] if i else ""
        if not flag.startswith("--") or any(t.startswith("--") for t in tokens):
            raise ConfigError(f"rank-specific token {tokens[0]!r} at argv[{i}] is not a flag value",
                              hint="only flag values may differ between ranks")
        secret = optional_at(i, tokens)
        # a secret flag is dropped with its value when the container has no value for it (as render does)
        argv.append({"env": _arg_env(flag), **({"optional": True} if secret else {})})
    keys = set().union(*(s.env for s in specs))
    env, rank_env, optional_env = {}, [], []
    for key in sorted(keys):
        seen = {s.env.get(key) for s in specs}
        if key in SECRET_ENV or any(secret_file(v) for v in seen):
            optional_env.append(key)
        elif len(seen) == 1 and None not in seen:
            env[key] = seen.pop()
        else:
            rank_env.append(key)
    return {"schema": SCHEMA, "profile": profile, "sglang_version": specs[0].sglang_version,
            "argv": argv, "env": env, "rank_env": rank_env, "optional_env": optional_env}


def rank_environment(doc: JSONObject, spec: LaunchSpec) -> dict[str, str]:
    """The environment one rank's container needs on top of the image: placeholder values + ``rank_env``.

    Walks the document's argv against the rank's rendered argv, so a spec that the image cannot reproduce
    (another profile, another render) is refused instead of started with the wrong flags.
    """
    out: dict[str, str] = {}
    argv, items, j, skip = spec.argv, doc["argv"], 0, False
    for i, item in enumerate(items):
        if isinstance(item, str):
            if j < len(argv) and argv[j] == item:
                j += 1
                continue
            following = items[i + 1] if i + 1 < len(items) else None
            if isinstance(following, dict) and following.get("optional"):
                skip = True                       # an optional (secret) flag this render left out
                continue
        elif skip:
            skip = False
            continue
        elif j < len(argv):
            out[item["env"]] = argv[j]
            j += 1
            continue
        raise ConfigError(f"rank {spec.rank}'s argv does not match the launch image of profile {doc['profile']} "
                          f"(at {item!r}, argv[{j}] = {argv[j] if j < len(argv) else 'end'!r})",
                          hint="build the launch image from the same profile and inventory (sparkctl image build)")
    if j != len(argv):
        raise ConfigError(f"rank {spec.rank}'s argv has {len(argv) - j} token(s) the launch image lacks: {argv[j:]}",
                          hint="build the launch image from the same profile and inventory (sparkctl image build)")
    out.update({k: spec.env[k] for k in [*doc["rank_env"], *doc["optional_env"]] if k in spec.env})
    return {k: v for k, v in out.items() if v != SECRET_PLACEHOLDER}


def doc_bytes(doc: JSONObject) -> bytes:
    """Canonical JSON of the document (what goes into the image and into its hash)."""
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def doc_sha256(doc: JSONObject) -> str:
    return hashlib.sha256(doc_bytes(doc)).hexdigest()
