"""What `sparkctl tune` searches: the --vary grid over profile keys, candidate profiles, the winner's profile file.

``--vary speculative.num_draft_tokens=4,6,8 --vary server.mem_fraction_static=0.85,0.88`` is a grid of 3 x 2
candidates, in --vary order (the last key varies fastest). Values are read as the same text in a profile is
(sparkctl.config.loader.read_value: ``8`` an int, ``0.88`` a float, ``010`` ten, ``yes`` and ``null`` as YAML 1.2
reads them, ``flashinfer`` a string; ``env.NAME`` values stay strings); every candidate is validated as a
whole profile before anything is
deployed, so a key that does not exist or a value of the wrong type fails at once naming the --vary (exit 2).
"""
from __future__ import annotations

import copy
import itertools
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from pydantic import ValidationError

from sparkctl.config.loader import dump_yaml, read_value
from sparkctl.config.profile import Profile
from sparkctl.engines import render
from sparkctl.errors import ConfigError
from sparkctl.jsontypes import JSONObject, JSONValue
from sparkctl.resources import config_home
from sparkctl.untrusted import record_name

if TYPE_CHECKING:
    from sparkctl.config.inventory import Inventory
    from sparkctl.config.profile import Profile

_KEY_RE = re.compile(r"^(?:[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+|env\.[A-Za-z_][A-Za-z0-9_]*)$")
_NOT_TUNABLE = ("name", "path", "extends", "description", "api", "rollback_profile", "lifecycle")

Space: TypeAlias = list[tuple[str, list[JSONValue]]]   # (dotted profile key, its values) per --vary, in order


def parse_vary(items: list[str]) -> Space:
    """``["server.x=1,2"]`` -> ``[("server.x", [1, 2])]``; ConfigError naming the bad --vary."""
    out: Space = []
    for item in items:
        key, sep, rest = item.partition("=")
        key = key.strip()
        if not sep or not _KEY_RE.match(key) or not rest.strip():
            raise ConfigError(f"--vary {item!r} is not KEY=V1,V2,...", where="--vary",
                              hint="e.g. --vary speculative.num_draft_tokens=4,6,8 (a dotted profile key)")
        if key.split(".")[0] in _NOT_TUNABLE:
            raise ConfigError(f"--vary {key}: not a launch setting", where="--vary",
                              hint="vary server.*, speculative.*, model.*, image.* or env.* keys")
        if any(k == key for k, _ in out):
            raise ConfigError(f"--vary {key} given twice", where="--vary", hint="list every value in one --vary")
        values = []
        for raw in rest.split(","):
            raw = raw.strip()
            if not raw:
                raise ConfigError(f"--vary {item!r}: an empty value", where="--vary", hint="V1,V2 with no empty item")
            values.append(read_value(raw, key))   # as the same text in a profile (env.* values as written)
        if len(set(map(repr, values))) != len(values):
            raise ConfigError(f"--vary {key}: a value is listed twice", where="--vary", hint="list each value once")
        out.append((key, values))
    if not out:
        raise ConfigError("nothing to vary", where="--vary", hint="e.g. --vary speculative.num_draft_tokens=4,6,8")
    return out


def get_key(data: JSONObject, key: str) -> JSONValue:
    cur: JSONValue = data
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def set_key(data: JSONObject, key: str, value: object) -> None:
    parts = key.split(".")
    cur = data
    for part in parts[:-1]:
        nxt = cur.get(part)
        if nxt is None:
            raise ConfigError(f"--vary {key}: the profile has no {part!r} section (it is null or absent)",
                              where="--vary", hint="vary keys of a section the profile sets (e.g. speculative.* "
                                                   "needs speculative decoding on)")
        if not isinstance(nxt, dict):
            raise ConfigError(f"--vary {key}: {part!r} is not a section", where="--vary")
        cur = nxt
    cur[parts[-1]] = value


def grid(space: Space) -> list[JSONObject]:
    """Every combination, in --vary order (the last key varies fastest)."""
    keys = [k for k, _ in space]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in space))]


def candidate_profile(base: Profile, changes: JSONObject, name: str) -> Profile:
    """The base profile with `changes` applied, validated; ConfigError naming the --vary that does not fit."""
    data = base.model_dump(mode="json")
    for key, value in changes.items():
        set_key(data, key, value)
    data["name"] = name
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(map(str, err["loc"]))
        raise ConfigError(f"--vary {', '.join(f'{k}={v}' for k, v in changes.items())}: {loc}: {err['msg']}",
                          where="--vary", hint="a key the profile schema knows, with a value of its type "
                                               "(`sparkctl schema profile`)") from None


def baseline_values(base: Profile, space: Space) -> JSONObject:
    data = base.model_dump(mode="json")
    return {k: get_key(data, k) for k, _ in space}


def _nest(changes: JSONObject) -> JSONObject:
    out: JSONObject = {}
    for key, value in changes.items():
        cur = out
        parts = key.split(".")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = value
    return out


def winner_profile_text(base_name: str, changes: JSONObject, run_id: str, note: str) -> str:
    """A profile that `extends:` the original with only the changed keys, and a comment naming the tune run."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    head = [f"# Written by `sparkctl tune` run {run_id} ({stamp}).",
            f"# {note}",
            f"# Only the keys the tune changed from {base_name}; everything else comes from {base_name}."]
    body = {"description": f"{base_name} tuned by run {run_id}", "extends": base_name, **_nest(changes)}
    return "\n".join(head) + "\n" + dump_yaml(body)


def winner_dir() -> Path:
    """Where the winner's profile goes: $SPARKCTL_PROFILES_DIR, else the user's profiles directory."""
    import os

    env = os.environ.get("SPARKCTL_PROFILES_DIR")
    return Path(env) if env else config_home() / "profiles"


WINNER_WHERE = "the tuned profile (SPARKCTL_PROFILES_DIR or ~/.config/sparkctl/profiles)"


def winner_path(profile: str, run_id: str) -> Path:
    """The winner's profile file: ``<winner_dir>/<profile>-tuned-<run start, lower case>.yml`` (a file name built
    from two plain names, never a path taken from the journal)."""
    where = "the tune journal (runs/<id>/tune.json)"
    run_tag = record_name(run_id, 'run_id', where).split('-')[0].lower()
    name = f"{record_name(profile, 'profile', where)}-tuned-{run_tag}"
    return winner_dir() / f"{name}.yml"


def copy_changes(changes: JSONObject) -> JSONObject:
    return copy.deepcopy(changes)


def launch_identity(profile: Profile, inventory: Inventory) -> str:
    """What the engine runs for `profile` on `inventory`: every rank's rendered argv and environment, the image
    settings, and the router's settings when there are replicas. Two profiles with the same identity run the same."""
    import json

    specs = [[s.rank, s.node, list(s.argv), dict(s.env)] for s in render(profile, inventory).specs]
    router = profile.router.model_dump(mode="json") if profile.replicas > 1 else None
    return json.dumps([specs, profile.image.model_dump(mode="json"), profile.replicas, router], sort_keys=True,
                      default=str)


def _candidate_identity(base: Profile, key: str, value: JSONValue, inventory: Inventory) -> str:
    """The launch identity of the base with one --vary value; a value the profile's engine cannot run (a setting
    it has no counterpart for, e.g. server.max_total_tokens on vLLM) refused naming the --vary, not the profile
    file (which does not hold it)."""
    try:
        return launch_identity(candidate_profile(base, {key: value}, base.name), inventory)
    except ConfigError as exc:
        if exc.where == "--vary":
            raise
        raise ConfigError(f"--vary {key}={value}: {exc.message}", where="--vary", hint=exc.hint) from None


def refuse_inert_keys(base: Profile, space: Space, inventory: Inventory) -> None:
    """Only keys that change what the engine runs are tunable: a --vary key for which every value renders the
    same launch as the base profile (warm-up, expectations, the router's keys without replicas...) is refused
    before anything is deployed, naming it."""
    same = launch_identity(base, inventory)
    for key, values in space:
        if all(_candidate_identity(base, key, v, inventory) == same for v in values):
            hint = ("router.* keys change what runs only with replicas > 1" if key.startswith("router.") else
                    "vary server.*, speculative.*, model.*, image.* or env.* keys")
            raise ConfigError(f"--vary {key}: not a setting of what the engine runs (every value renders the same "
                              f"launch as {base.name}: argv, environment, image)", where="--vary", hint=hint)
