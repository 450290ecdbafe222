"""Generated values for every numeric option of every command: parsed into a finite number inside the option's
range, or refused as a usage error (exit 2) naming the flag. The options are found by walking the real click
command tree, so a new numeric option is covered without touching this file. Only parsing runs (click's
make_context): no command body, so nothing is deployed or stopped."""
from __future__ import annotations

import math
import typing
from typing import Any

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st

from testrig.mutations import ci_settings, run_cli


def _numeric_options() -> list[tuple[list[str], Any]]:
    import typer.main

    from sparkctl.cli.main import app
    out = []

    def walk(cmd: Any, path: list[str]) -> None:
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            walk(sub, path + [name])
        for param in getattr(cmd, "params", []):
            if param.opts and param.opts[0].startswith("--") and not param.is_flag and _is_number(param):
                out.append((path, param))

    walk(typer.main.get_command(app), [])
    return out


def _parser(param: Any) -> Any:
    return getattr(getattr(param, "type_descriptor", None) and param.type_descriptor.parameter_info, "parser", None)


def _is_number(param: Any) -> bool:
    ann = param.type_descriptor.annotation
    args = typing.get_args(ann) or (ann,)
    return any(a in (int, float) for a in args)


OPTIONS = _numeric_options()
NUMBER_TEXT = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "-nan", "inf", "-inf", "1e999", "-0", "0", "0.0", "1", "2.5", "-5", "-3", " 7", "0x10",
                     "1_000", "", "ten", "1e3", "5e-324", "2147483648", "9" * 40]),
    st.text(max_size=8),
)


def test_the_walk_finds_the_options_issue_16_names():
    names = {param.opts[0] for _, param in OPTIONS}
    assert {"--boot-timeout", "--tail", "--rank", "--runs"} <= names, names


def _walk_to(path: list[str]) -> Any:
    import typer.core
    import typer.main

    from sparkctl.cli.main import app
    cmd = typer.main.get_command(app)
    for name in path:
        assert isinstance(cmd, typer.core.TyperGroup), (path, name)
        cmd = cmd.commands[name]
    return cmd


@pytest.mark.parametrize("path,param", OPTIONS, ids=[f"{' '.join(p)} {o.opts[0]}" for p, o in OPTIONS])
@ci_settings(max_examples=40)
@given(text=NUMBER_TEXT)
def test_numeric_options_parse_in_range_or_exit_2_naming_the_flag(path, param, text):
    cmd = _walk_to(path)
    required = [p for p in cmd.params if p.required and p.opts and p.opts[0].startswith("--")]
    args = [a for p in required if p is not param for a in (p.opts[0], "d5")]
    opt = param.opts[0]
    try:
        ctx = cmd.make_context(path[-1], args + [f"{opt}={text}"])
    except typer.TyperException as exc:
        assert getattr(exc, "exit_code", None) == 2, repr(exc)
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        assert f"Invalid value for '{opt}'" in message, message
        return
    value = ctx.params[param.name]
    assert isinstance(value, (int, float)) and not isinstance(value, bool), value
    assert math.isfinite(value), f"{opt}={text!r} parsed as {value!r}"
    low = -math.inf if param.min is None else param.min
    high = math.inf if param.max is None else param.max
    assert low <= value <= high
    parser = _parser(param)
    if parser is not None:  # a cli/bounds.py type: the parsed value is what its own parse of the text gives
        assert parser(text) == value


def test_a_bad_number_stops_before_the_command_runs(tmp_path, monkeypatch):
    """Through main(): exit 2, the flag named, and no state directory created (nothing was touched)."""
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(tmp_path / "state"))
    code, out, err = run_cli("up", "--profile", "d5", "--boot-timeout", "-5")
    assert code == 2 and "Invalid value for '--boot-timeout'" in err and out == ""
    assert not (tmp_path / "state").exists()
