"""Every bound of every config field holds: the field's own `Field(ge/gt/le/lt/max_length)` and its policy type's
`Bound`, both, for every field of every model a profile or an inventory is made of (walked from the models, not
listed). A value one step outside a bound is refused with that bound's error; a numeric value on the bound is
accepted. (pydantic lets a type-level Ge/Le replace a field's: `replicas: 0` and `gpus: 65` went through.)"""
from __future__ import annotations

import typing
from typing import Annotated, Any

import annotated_types as at
import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.config.values import Bound


def _models(root: type[BaseModel], seen: set[type] | None = None) -> set[type[BaseModel]]:
    seen = set() if seen is None else seen
    if root in seen:
        return seen
    seen.add(root)
    for info in root.model_fields.values():
        for t in _walk(info.annotation):
            if isinstance(t, type) and issubclass(t, BaseModel):
                _models(t, seen)
    return seen


def _walk(t: Any):
    yield t
    for arg in typing.get_args(t):
        yield from _walk(arg)


def _scalar(t: Any):
    """The annotation and, through Optional/Union and Annotated only, its alternatives (not list or dict items:
    their bounds are the items')."""
    yield t
    if typing.get_origin(t) in (typing.Union, __import__("types").UnionType) or \
            typing.get_origin(t) is Annotated:
        for arg in typing.get_args(t):
            if not isinstance(arg, (Bound, at.BaseMetadata)):
                yield from _scalar(arg)


def _bounds(info: Any) -> list[tuple[str, Any]]:
    """(kind, limit) of the field's own constraints and of every Bound in its annotation."""
    out = []
    for m in info.metadata:
        for kind in ("ge", "gt", "le", "lt", "max_length"):
            if isinstance(m, {"ge": at.Ge, "gt": at.Gt, "le": at.Le, "lt": at.Lt, "max_length": at.MaxLen}[kind]):
                out.append((kind, getattr(m, kind)))
    for t in _scalar(info.annotation):
        for m in getattr(t, "__metadata__", ()):
            if isinstance(m, Bound):
                out += [(k, getattr(m, k)) for k in ("ge", "gt", "le", "max_length") if getattr(m, k) is not None]
    return out


def _is_int(info: Any) -> bool:
    kinds = list(_scalar(info.annotation))
    return any(t is int for t in kinds) and not any(t is float for t in kinds)


CASES = [(model.__name__, name, kind, limit)
         for model in sorted(_models(Profile) | _models(Inventory), key=lambda m: m.__name__)
         for name, info in model.model_fields.items() for kind, limit in _bounds(info)]
MODELS = {m.__name__: m for m in _models(Profile) | _models(Inventory)}
ERROR = {"ge": "greater_than_equal", "gt": "greater_than", "le": "less_than_equal", "lt": "less_than",
         "max_length": "string_too_long"}


def test_the_walk_finds_the_fields_that_were_let_through():
    names = {(m, f, k) for m, f, k, _ in CASES}
    assert {("Profile", "replicas", "ge"), ("Profile", "replicas", "le"), ("ServerSettings", "tp_size", "ge"),
            ("Node", "gpus", "le")} <= names or {("Profile", "replicas", "ge")} <= names, sorted(names)[:20]
    assert len(CASES) > 40


@pytest.mark.filterwarnings("ignore::pydantic.warnings.UnsupportedFieldAttributeWarning")
@pytest.mark.parametrize("model,field,kind,limit", CASES, ids=[f"{m}.{f}:{k}={v}" for m, f, k, v in CASES])
def test_one_step_outside_a_bound_is_refused_and_the_bound_itself_accepted(model, field, kind, limit):
    info = MODELS[model].model_fields[field]
    field_type: Any = Annotated[info.annotation, info]     # a type made at run time: no static type says which
    ta = TypeAdapter[Any](field_type)
    outside: str | int | float
    if kind == "max_length":
        outside = "a" * (int(limit) + 1)
    else:
        step = 1 if _is_int(info) else max(abs(limit) * 1e-9, 1e-9)
        outside = {"ge": limit - step, "gt": limit, "le": limit + step, "lt": limit}[kind]
        outside = int(outside) if _is_int(info) else float(outside)
    with pytest.raises(ValidationError) as exc:
        ta.validate_python(outside)
    assert ERROR[kind] in {e["type"] for e in exc.value.errors()}, exc.value
    if kind in ("ge", "le"):
        on = int(limit) if _is_int(info) else float(limit)
        tight = [(k, v) for k, v in _bounds(info) if k in ("ge", "gt", "le", "lt")]
        inside = all({"ge": on >= v, "gt": on > v, "le": on <= v, "lt": on < v}[k] for k, v in tight)
        if inside:        # a looser bound of the type is not reachable past the field's own: only check those inside
            ta.validate_python(on)
