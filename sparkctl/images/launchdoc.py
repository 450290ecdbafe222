"""The launch image's ``/etc/sparkctl/launch.json``: the rank-independent part of the rendered LaunchSpecs.

`launch_doc(specs)` compares every rank's argv and env (render builds them in the same order): what is equal
on every rank and not secret goes into the image; a value that differs between ranks (``--node-rank``,
``--host``) or names a secret file (``--config /run/sparkctl-secrets/...``, present only when the rank has
an API key) becomes a placeholder ``{"env": "SPARKCTL_ARG_NODE_RANK"}`` that the
entrypoint (`sparkctl.images.entrypoint`) fills from the container's environment, and env keys that differ
(``SGLANG_HOST_IP``, ``NCCL_SOCKET_IFNAME`` ...) or name a secret file (``HF_TOKEN_PATH``) are listed in
``rank_env`` / ``optional_env``: the
container must carry them. `rank_environment(doc, spec)` is what a runtime passes to one rank's container.
The document holds no secret: its hash names the launch image.

Schema 1 is a document whose ranks carry the same flags in the same order (every SGLang render; a one-node vLLM
one). When some ranks carry flags that others do not (vLLM: rank 0 serves the API with ``--host H --port P``, ranks
> 0 are ``--headless`` in their place), the document is schema 2: the ranks' argvs are aligned flag by flag (a flag
and the values after it), the flags every rank has stay as in schema 1, and each run of flags that only some ranks
have becomes ``{"if": "SPARKCTL_FLAG_<first flag>", "argv": [...]}``: the container says ``=1`` (this rank carries
them) or ``=0``. A schema-2 document needs `sparkctl.images.entrypoint_rankflags` (plan.py ships the entrypoint
that reads the document's schema), and ``--print`` of either shows the argv a rank runs. Example::

    doc = launch_doc(render(profile, inventory, environ=SECRET_PLACEHOLDERS).specs, profile="d5")
    doc["argv"][:3]                              # ['python3', '-m', 'sglang.launch_server']
    rank_environment(doc, specs[1])["SPARKCTL_ARG_NODE_RANK"]   # '1'
"""
from __future__ import annotations

import difflib
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
SCHEMA_RANK_FLAGS = 2            # flags some ranks carry and others do not (entrypoint_rankflags)
ARG_ENV_PREFIX = "SPARKCTL_ARG_"
FLAG_ENV_PREFIX = "SPARKCTL_FLAG_"
SECRET_PLACEHOLDER = "sparkctl-secret-placeholder"   # rendered in place of API key / HF token for the image


def _arg_env(flag: str) -> str:
    return ARG_ENV_PREFIX + re.sub(r"[^A-Z0-9]+", "_", flag.lstrip("-").upper())


def _flag_env(flag: str) -> str:
    return FLAG_ENV_PREFIX + re.sub(r"[^A-Z0-9]+", "_", flag.lstrip("-").upper())


def _units(argv: Sequence[str]) -> list[tuple[str, ...]]:
    """An argv as its units: the tokens before the first flag, then each ``--flag`` with the values after it."""
    units: list[list[str]] = [[]]
    for token in argv:
        if token.startswith("--"):
            units.append([])
        units[-1].append(token)
    return [tuple(u) for u in units]


def _unit_key(unit: tuple[str, ...]) -> str:
    return unit[0] if unit and unit[0].startswith("--") else ""


def _aligned(argvs: list[list[str]]) -> list[tuple[frozenset[int], list[tuple[str, ...]]]] | None:
    """The ranks' argvs merged unit by unit: [(ranks that carry it, [that unit on each of them, rank order])], or None
    when every rank carries the same flags in the same order (schema 1)."""
    per_rank = [_units(a) for a in argvs]
    keys = [[_unit_key(u) for u in units] for units in per_rank]
    if all(k == keys[0] for k in keys):
        return None
    merged: list[tuple[set[int], dict[int, tuple[str, ...]]]] = [({0}, {0: u}) for u in per_rank[0]]
    for r, units in enumerate(per_rank[1:], 1):
        base = [_unit_key(next(iter(m[1].values()))) for m in merged]
        out: list[tuple[set[int], dict[int, tuple[str, ...]]]] = []
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=base, b=keys[r], autojunk=False).get_opcodes():
            if tag == "equal":
                for m, u in zip(merged[i1:i2], units[j1:j2], strict=True):
                    m[0].add(r)
                    m[1][r] = u
                    out.append(m)
                continue
            out.extend(merged[i1:i2])                      # what this rank lacks, then what only it has
            out.extend(({r}, {r: u}) for u in units[j1:j2])
        merged = out
    return [(frozenset(ranks), [by_rank[r] for r in sorted(by_rank)]) for ranks, by_rank in merged]


def launch_doc(specs: Sequence[LaunchSpec], *, profile: str) -> JSONObject:
    """The rank-independent launch document of ``specs`` (one per rank, from one render)."""
    if not specs:
        raise ConfigError("no ranks to build a launch image for")
    argvs = [s.argv for s in specs]
    aligned = _aligned(argvs)
    if aligned is not None:
        return _rank_flags_doc(specs, aligned, profile=profile)
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
    return {"schema": SCHEMA, "profile": profile, "sglang_version": specs[0].sglang_version,
            "argv": argv, **_env_doc(specs), **_engine_key(specs)}


def _engine_key(specs: Sequence[LaunchSpec]) -> JSONObject:
    """The engine, in every document but SGLang's (whose documents are hashed into deployed launch tags as they
    are: `sglang_version` holds the engine's release, the name from when SGLang was the only engine)."""
    return {} if specs[0].engine == "sglang" else {"engine": specs[0].engine}


def _secret_file(token: str | None) -> bool:
    """The path of a secret file (present only when the rank has that secret)."""
    return token is not None and token.startswith(SECRETS_MOUNT + "/")


def _env_doc(specs: Sequence[LaunchSpec]) -> JSONObject:
    keys = set().union(*(s.env for s in specs))
    env, rank_env, optional_env = {}, [], []
    for key in sorted(keys):
        seen = {s.env.get(key) for s in specs}
        if key in SECRET_ENV or any(_secret_file(v) for v in seen):
            optional_env.append(key)
        elif len(seen) == 1 and None not in seen:
            env[key] = seen.pop()
        else:
            rank_env.append(key)
    return {"env": env, "rank_env": rank_env, "optional_env": optional_env}


def _unit_items(units: list[tuple[str, ...]], secret_flags: frozenset[str]) -> list[str | JSONObject]:
    """One unit as the ranks that carry it have it: a token they share, or where its value comes from."""
    if len({len(u) for u in units}) != 1:
        raise ConfigError(f"flag {units[0][0]!r} has a different number of values on different ranks: "
                          f"{[list(u) for u in units]}", hint="only flag values may differ between ranks")
    items: list[str | JSONObject] = []
    flag = units[0][0]
    for i, tokens in enumerate(zip(*units)):
        secret = (i > 0 and flag in secret_flags) or any(_secret_file(t) for t in tokens)
        if len(set(tokens)) == 1 and not secret:
            items.append(tokens[0])
        elif i == 0 or not flag.startswith("--"):
            raise ConfigError(f"rank-specific token {tokens[0]!r} is not a flag value",
                              hint="only flag values may differ between ranks")
        else:
            items.append({"env": _arg_env(flag), **({"optional": True} if secret else {})})
    return items


def _rank_flags_doc(specs: Sequence[LaunchSpec], aligned: list[tuple[frozenset[int], list[tuple[str, ...]]]], *,
                    profile: str) -> JSONObject:
    """Schema 2: the flags every rank carries as in schema 1, each run of flags only some ranks carry as an
    ``{"if": SPARKCTL_FLAG_<first flag>, "argv": [...]}`` item (module docstring)."""
    secret_flags = frozenset().union(*(s.secret_options for s in specs))
    everyone = frozenset(range(len(specs)))
    argv: list[str | JSONObject] = []
    names: set[str] = set()
    run: tuple[frozenset[int], list[str | JSONObject]] | None = None
    for ranks, units in aligned:
        items = _unit_items(units, secret_flags)
        if ranks == everyone:
            run = None
            argv.extend(items)
            continue
        if not units[0] or not units[0][0].startswith("--"):
            raise ConfigError("ranks differ before their first flag (the command or the model)",
                              hint="only flags may differ between ranks")
        if run is not None and run[0] == ranks:
            run[1].extend(items)                  # the next flag of the same ranks: the same switch
            continue
        name = _flag_env(units[0][0])
        if name in names:
            raise ConfigError(f"flag {units[0][0]} is present on some ranks in two places",
                              hint="per-rank extra_args are not supported in launch images")
        names.add(name)
        run = (ranks, items)
        argv.append({"if": name, "argv": items})
    return {"schema": SCHEMA_RANK_FLAGS, "profile": profile, "sglang_version": specs[0].sglang_version,
            "argv": argv, **_env_doc(specs), **_engine_key(specs)}


def _walk(items: list, argv: list[str], j: int, out: dict[str, str], spec: LaunchSpec, doc: JSONObject) -> int:
    """Match ``items`` against ``argv`` from ``j``: fills ``out`` with the placeholder values and switches; returns
    where the match ended. ConfigError when the rank's argv is not what the document reproduces."""
    skip = False
    for i, item in enumerate(items):
        if isinstance(item, str):
            if j < len(argv) and argv[j] == item:
                j += 1
                continue
            following = items[i + 1] if i + 1 < len(items) else None
            if isinstance(following, dict) and following.get("optional"):
                skip = True                       # an optional (secret) flag this render left out
                continue
        elif "if" in item:
            head = item["argv"][0]
            present = j < len(argv) and argv[j] == head
            out[item["if"]] = "1" if present else "0"
            if present:
                j = _walk(item["argv"], argv, j, out, spec, doc)
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
    return j


def rank_environment(doc: JSONObject, spec: LaunchSpec) -> dict[str, str]:
    """The environment one rank's container needs on top of the image: placeholder values + ``rank_env``.

    Walks the document's argv against the rank's rendered argv, so a spec that the image cannot reproduce
    (another profile, another render) is refused instead of started with the wrong flags.
    """
    out: dict[str, str] = {}
    argv = spec.argv
    j = _walk(doc["argv"], argv, 0, out, spec, doc)
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
