"""YAML loading and pydantic error translation.

Turns a pydantic ValidationError into one ConfigError that names the file, the key
path and the fix (with a did-you-mean for unknown keys), so a user never sees a
traceback for a typo.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Hashable
from pathlib import Path
from typing import TypeAlias

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from sparkctl.errors import ConfigError
from sparkctl.jsontypes import JSONValue


def repo_root() -> Path:
    """The shipped data root (profiles/, inventory/, patches/ ...): the checkout's root or the installed
    ``sparkctl/data/``; see sparkctl.resources."""
    from sparkctl.resources import shipped
    return shipped()


# Bounds on one YAML document (profiles and inventories are a few kB): what a hostile file may cost to read.
MAX_DOCUMENT_BYTES = 1 << 20        # 1 MiB of text
MAX_DEPTH = 32                      # nested mappings/sequences
MAX_EXPANDED_WEIGHT = 1_000_000     # nodes + scalar characters after alias expansion (a billion-laughs bound)

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_NULL = "tag:yaml.org,2002:null"

Loc: TypeAlias = tuple[int | str, ...]   # a pydantic error's location: keys and list indexes


class _Bound(yaml.YAMLError):
    """A document past one of the bounds above (reported like a syntax error: file, line, column)."""

    def __init__(self, problem: str, mark: object, hint: str) -> None:
        super().__init__(problem)
        self.problem, self.problem_mark, self.hint = problem, mark, hint


class _CoreLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema resolution and hostile-input bounds.

    - Core schema (yaml.org/spec/1.2.2 10.3): only true/false are booleans, `010` is ten, `0x1F` 31; `12:30`,
      `yes` and `2024-01-01` stay strings (PyYAML's YAML 1.1 makes them 750, true and a date); no `<<` merges.
    - The values of a top-level `env:` mapping are always the string as written (`010` stays "010").
    - A mapping refuses a key given twice (PyYAML silently keeps the last) and a key that is not a string.
    - Nesting is bounded while composing (MAX_DEPTH), and the size after alias expansion is bounded before
      anything is constructed (MAX_EXPANDED_WEIGHT): an alias bomb costs microseconds, not gigabytes.
    """

    yaml_implicit_resolvers: dict[str | None, list[tuple[str, re.Pattern[str]]]] = {}
    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Bound(f"nesting deeper than {MAX_DEPTH} levels", self.peek_event().start_mark,
                             "flatten the document: profiles and inventories nest a few levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, JSONValue]:
        seen: dict[str, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str):
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is not a string", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key].line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)

    def construct_core_int(self, node: yaml.ScalarNode) -> int:
        text = str(self.construct_scalar(node))
        sign = -1 if text.startswith("-") else 1
        body = text.lstrip("+-")
        if body.startswith("0o"):
            return sign * int(body[2:], 8)
        if body.startswith("0x"):
            return sign * int(body[2:], 16)
        return sign * int(body, 10)


_CoreLoader.add_implicit_resolver(_NULL, re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""])
_CoreLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                  list("tTfF"))
_CoreLoader.add_implicit_resolver(_INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                                  list("-+0123456789"))
_CoreLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+.0123456789"))
_CoreLoader.add_constructor(_INT, _CoreLoader.construct_core_int)


class _CoreDumper(yaml.SafeDumper):
    """SafeDumper that quotes every string `_CoreLoader` (or YAML 1.1) would read as something else: a string
    "0o17" or "0x1F" is written quoted, so what sparkctl writes reads back as what it wrote."""


for _first, _resolvers in _CoreLoader.yaml_implicit_resolvers.items():
    for _tag, _regexp in _resolvers:
        _CoreDumper.add_implicit_resolver(_tag, _regexp, [_first])


def dump_yaml(data: object) -> str:
    """YAML text of `data` that `load_yaml` reads back as `data` (block style, keys in the given order)."""
    return str(yaml.dump(data, Dumper=_CoreDumper, sort_keys=False, allow_unicode=True))


def _expanded_weight(root: yaml.Node) -> int:
    """Nodes plus scalar characters of the document once every alias is expanded, computed once per node (an
    alias is the very node object of its anchor); a recursive alias is refused. Depth is already bounded."""
    weight: dict[int, int] = {}
    active: set[int] = set()

    def visit(node: yaml.Node) -> int:
        key = id(node)
        if key in weight:
            return weight[key]
        if key in active:
            raise _Bound("an alias refers to a node that contains it (a recursive alias)", node.start_mark,
                         "replace the alias with the value it should stand for")
        active.add(key)
        if isinstance(node, yaml.ScalarNode):
            total = 1 + len(node.value)
        elif isinstance(node, yaml.SequenceNode):
            total = 1 + sum(visit(child) for child in node.value)
        else:
            total = 1 + sum(visit(k) + visit(v) for k, v in node.value)
        active.discard(key)
        weight[key] = min(total, MAX_EXPANDED_WEIGHT + 1)
        return weight[key]

    return visit(root)


def _heaviest(root: yaml.Node) -> tuple[yaml.Node, str]:
    """The top-level key whose value is the largest once expanded (where an alias bomb sits), for the error."""
    if isinstance(root, yaml.MappingNode) and root.value:
        key, value = max(root.value, key=lambda kv: _expanded_weight(kv[1]))
        return value, f"key {key.value!r} " if isinstance(key, yaml.ScalarNode) else ""
    return root, "the document "


def _env_as_written(root: yaml.Node) -> None:
    """Every plain scalar under a top-level `env:` mapping is read as the string it spells (not 8 for `010`);
    an empty or null value stays null (refused with its fix by the profile loader)."""
    if not isinstance(root, yaml.MappingNode):
        return
    for key, value in root.value:
        if isinstance(key, yaml.ScalarNode) and key.value == "env" and isinstance(value, yaml.MappingNode):
            for _, item in value.value:
                if isinstance(item, yaml.ScalarNode) and item.style is None and item.tag != _NULL:
                    item.tag = _STR


_TEXT_HINT = ("profiles and inventories are UTF-8 YAML text: check that this is the file you meant "
              "(or re-save it as UTF-8)")


def read_yaml(path: Path) -> JSONValue:
    """Read one YAML document; a missing file or a syntax error is a ConfigError."""
    try:
        with open(path, "rb") as fh:          # at most one byte past the bound: /dev/zero is refused, not read
            data = fh.read(MAX_DOCUMENT_BYTES + 1)
        if len(data) > MAX_DOCUMENT_BYTES:
            raise ConfigError(f"more than the {MAX_DOCUMENT_BYTES} bytes a profile or inventory may have",
                              where=str(path), hint="check that this is the file you meant")
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})", where=str(path),
                          hint=_TEXT_HINT) from None
    except FileNotFoundError:
        raise ConfigError("file not found", where=str(path),
                          hint="check the path (or the name passed to --profile / --inventory)") from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", where=str(path),
                          hint="give the path of a readable YAML file") from None
    return load_yaml(text, str(path))


def load_yaml(text: str, where: str) -> JSONValue:
    """One YAML document read the one way sparkctl reads YAML (`_CoreLoader`: YAML 1.2 core schema, bounds,
    duplicate keys refused, a top-level `env:` mapping's values as written); errors are a ConfigError at `where`
    (with line and column). `read_yaml` (profiles, inventories) and `read_value` (tune's --vary) both come here.
    """
    loader: _CoreLoader | None = None
    try:
        loader = _CoreLoader(text)
        root = loader.get_single_node()
        if root is None:
            return None
        if _expanded_weight(root) > MAX_EXPANDED_WEIGHT:
            node, what = _heaviest(root)
            raise _Bound(f"{what}expands to more than {MAX_EXPANDED_WEIGHT} nodes and characters through its "
                         "aliases (an alias bomb?)", node.start_mark, "write the values out, or use fewer nested "
                         "aliases")
        _env_as_written(root)
        return loader.construct_document(root)
    except yaml.reader.ReaderError as exc:  # a binary file that happens to decode: NUL and other control characters
        raise ConfigError(f"not a YAML text file: control character #x{exc.character:04x} at offset {exc.position}",
                          where=where, hint=_TEXT_HINT) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        problem = getattr(exc, "problem", None) or str(exc)
        hint = (getattr(exc, "hint", None) or
                ("each key may appear once in a mapping: rename or merge the duplicates" if "duplicate key" in problem
                 else "quote the key (keys are names)" if "is not a string" in problem
                 else "fix the YAML syntax at that line"))
        raise ConfigError(f"invalid YAML: {problem}", where=loc, hint=hint) from None
    finally:
        if loader is not None:
            loader.dispose()


def read_value(text: str, key: str) -> JSONValue:
    """The value `text` is when a profile sets the dotted `key` to it: ``read_value("010", "server.x")`` is 10,
    ``"yes"`` stays "yes", ``env.NAME`` values stay the string as written (``null``/``~`` are null, as in the
    file). Read by `load_yaml` as the document ``{key: text}``, so a --vary value and the same text in a profile
    are one value; text that is no YAML value on its own (``[1``, ``a: b``) is the string itself, as before."""
    parts = key.split(".")
    doc = "".join(f"{'  ' * i}{part}:\n" for i, part in enumerate(parts[:-1]))
    doc += f"{'  ' * (len(parts) - 1)}{parts[-1]}: {text}\n"
    try:
        data = load_yaml(doc, key)
        for part in parts:
            data = data[part]
    except (ConfigError, KeyError, TypeError):
        return text
    if isinstance(data, dict):         # "a: b" read as a nested mapping: not the one value the text spells
        return text
    return data


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
        if parts[-1].endswith("]"):       # extra_args[0] -> extra_args (a list is set as a whole)
            parts[-1] = parts[-1][:parts[-1].index("[")]
            if parts[-1]:
                continue
        parts.pop()
    return default


def _model_at(model: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """Walk a model class along a pydantic error location to find the model holding the last key."""
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if isinstance(part, int) or current is None:
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return None
        ann = fields[part].annotation
        current = _first_model(ann)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _first_model(ann: object) -> type[BaseModel] | None:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in getattr(ann, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _described(model: type[BaseModel], loc: Loc) -> str | None:
    """The key's own description as the fix for an out-of-range or wrong-type value."""
    holder = _model_at(model, loc)
    field = holder.model_fields.get(str(loc[-1])) if holder and loc else None
    return f"{loc[-1]} is {field.description}" if field and field.description else None


def key_path(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def did_you_mean(word: str, candidates: list[str]) -> str | None:
    match = difflib.get_close_matches(word, candidates, n=1, cutoff=0.5)
    return match[0] if match else None


def config_error_from(exc: ValidationError, model: type[BaseModel], where: str,
                      prefix: Loc = (), origin: dict[str, str] | None = None) -> ConfigError:
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
        elif isinstance(err.get("input"), bool) and err["type"] in ("int_type", "float_type"):
            msg = f"{str(err['input']).lower()} is a boolean, not a number"
            hint = ("write the number itself (YAML reads true/false as booleans); "
                    + (_described(model, loc) or "see the field's description"))
        elif err.get("input", 0) is None and err["type"].endswith(("_type", "_parsing")):
            msg = "null is not a value here"
            hint = f"give a value or remove the key ({_described(model, loc) or 'see `sparkctl schema`'})"
        elif err["type"] == "string_type" and isinstance(err.get("input"), (int, float, bool)):
            msg = f"{err['input']!r} is a {type(err['input']).__name__}, not a string"
            hint = f'quote it: {loc[-1]}: "{err["input"]}"'
        else:
            msg = err["msg"]
            if "input" in err and not isinstance(err["input"], (dict, list)) and err["type"] != "sparkctl_refusal":
                msg += f" (got {err['input']!r})"
            ctx_hint = (err.get("ctx") or {}).get("hint") if isinstance(err.get("ctx"), dict) else None
            hint = ctx_hint or _described(model, loc)
        hint = hint or ("see `sparkctl schema profile` or `sparkctl schema inventory` for what this key takes")
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
