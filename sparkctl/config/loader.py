"""YAML loading and pydantic error translation.

Turns a pydantic ValidationError into one ConfigError that names the file, the key
path and the fix (with a did-you-mean for unknown keys), so a user never sees a
traceback for a typo.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from sparkctl.errors import ConfigError


def repo_root() -> Path:
    """The shipped data root, ``sparkctl/data/`` (profiles/, inventory/, patches/ ...): see sparkctl.resources."""
    from sparkctl.resources import shipped
    return shipped()


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (PyYAML silently keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key].line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


_TEXT_HINT = ("profiles and inventories are UTF-8 YAML text: check that this is the file you meant "
              "(or re-save it as UTF-8)")


def read_yaml(path: Path) -> Any:
    """Read one YAML document; a missing file or a syntax error is a ConfigError."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})", where=str(path),
                          hint=_TEXT_HINT) from None
    except FileNotFoundError:
        raise ConfigError("file not found", where=str(path),
                          hint="check the path (or the name passed to --profile / --inventory)") from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", where=str(path)) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.reader.ReaderError as exc:  # a binary file that happens to decode: NUL and other control characters
        raise ConfigError(f"not a YAML text file: control character #x{exc.character:04x} at offset {exc.position}",
                          where=str(path), hint=_TEXT_HINT) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        hint = ("each key may appear once in a mapping: rename or merge the duplicates" if "duplicate key" in problem
                else "fix the YAML syntax at that line")
        raise ConfigError(f"invalid YAML: {problem}", where=loc, hint=hint) from None


def refusal(message: str, hint: str) -> PydanticCustomError:
    """Raise from a pydantic validator: `message` becomes the error, `hint` its `fix:` line (config_error_from)."""
    return PydanticCustomError("sparkctl_refusal", message.replace("{", "{{").replace("}", "}}"), {"hint": hint})


def origin_of(origin: dict[str, str], key: str, default: str) -> str:
    """The file that set `key` (a.b.c), else the file that set its nearest parent, else `default`."""
    parts = key.split(".")
    while parts:
        found = origin.get(".".join(parts))
        if found:
            return found
        parts.pop()
    return default


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """Walk a model class along a pydantic error location to find the model holding the last key."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or current is None:
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return None
        ann = fields[part].annotation
        current = _first_model(ann)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _first_model(ann: Any) -> Any:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _described(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """The key's own description as the fix for an out-of-range or wrong-type value."""
    holder = _model_at(model, loc)
    field = holder.model_fields.get(str(loc[-1])) if holder and loc else None
    return f"{loc[-1]} is {field.description}" if field and field.description else None


def key_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def did_you_mean(word: str, candidates: list[str]) -> str | None:
    match = difflib.get_close_matches(word, candidates, n=1, cutoff=0.5)
    return match[0] if match else None


def config_error_from(exc: ValidationError, model: type[BaseModel], where: str,
                      prefix: tuple[Any, ...] = (), origin: dict[str, str] | None = None) -> ConfigError:
    """One ConfigError for the first problem in a ValidationError (others listed as evidence)."""
    messages = []
    first: ConfigError | None = None
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = key_path(prefix + loc)
        hint: str | None = None
        if err["type"] == "extra_forbidden":
            holder = _model_at(model, loc)
            names = list(holder.model_fields) if holder else []
            guess = did_you_mean(str(loc[-1]), names)
            msg = f"unknown key '{loc[-1]}'"
            hint = (f"did you mean '{guess}'?" if guess else
                    f"remove it; known keys here: {', '.join(sorted(names))}" if names else "remove it")
        elif err["type"] == "missing":
            msg = "required key is missing"
            hint = f"add '{loc[-1]}'"
        else:
            msg = err["msg"]
            if "input" in err and not isinstance(err["input"], (dict, list)) and err["type"] != "sparkctl_refusal":
                msg += f" (got {err['input']!r})"
            ctx_hint = (err.get("ctx") or {}).get("hint") if isinstance(err.get("ctx"), dict) else None
            hint = ctx_hint or _described(model, loc)
        src = origin_of(origin or {}, key_path(prefix + loc), where)
        text = f"{path}: {msg}"
        messages.append(text)
        if first is None:
            first = ConfigError(f"{path}: {msg}", where=src, hint=hint)
    if first is None:  # pydantic always reports at least one error; keep a clear message regardless
        first = ConfigError(str(exc), where=where)
    if len(messages) > 1:
        first.evidence = "other problems:\n" + "\n".join(messages[1:])
    return first
