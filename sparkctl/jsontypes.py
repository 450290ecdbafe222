"""The name sparkctl's annotations give JSON data.

``JSONObject`` is a JSON object as ``json.loads`` (or ``yaml.safe_load`` of a mapping) gives it and ``json.dumps``
takes it: string keys, values of any JSON type. It is an alias of ``dict[str, Any]``, not a new type: it says the
``Any`` is arbitrary JSON (what the engine answered, a card's sections, a record's free-form parts), the one place
the style guide keeps ``Any``. A dict of something else has its own precise type. ``JSONValue`` is one value of
any JSON type (what a JSON or YAML document, or one key of it, holds): the same ``Any``, named for what it is.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

JSONObject: TypeAlias = dict[str, Any]
JSONValue: TypeAlias = Any
JSONMapping: TypeAlias = Mapping[str, Any]   # a JSON object only read: a dict or any read-only mapping


def renamed_keys(data: JSONObject, renamed: dict[str, str]) -> JSONObject:
    """`data` with each key of `renamed` (old name -> new name) under its new name: how a record or a handle that
    an older sparkctl wrote reads after a rename. An old key beside its new one is dropped (the new one wins)."""
    return {renamed.get(k, k): v for k, v in data.items() if not (k in renamed and renamed[k] in data)}


__all__ = ["JSONMapping", "JSONObject", "JSONValue", "renamed_keys"]
