"""The name sparkctl's annotations give JSON data.

``JSONObject`` is a JSON object as ``json.loads`` (or ``yaml.safe_load`` of a mapping) gives it and ``json.dumps``
takes it: string keys, values of any JSON type. It is an alias of ``dict[str, Any]``, not a new type: it says the
``Any`` is arbitrary JSON (what the engine answered, a card's sections, a record's free-form parts), the one place
the style guide keeps ``Any``. A dict of something else has its own precise type.
"""
from __future__ import annotations

from typing import Any, TypeAlias

JSONObject: TypeAlias = dict[str, Any]

__all__ = ["JSONObject"]
