"""Rooms a person can hold (issue 33, item 6): no module in sparkctl/ longer than MAX_MODULE_LINES and no function
longer than MAX_FUNCTION_LINES, so each file and each function can be read whole.

A module's length is its line count; a function's is `end_lineno - lineno + 1` from `ast` (its decorators not
counted, its nested functions counted in it and on their own). A failure names each file or function over its
limit, e.g. ``sparkctl/deploy/replicated.py: 749 lines (limit 500)``, so the split can start from it.
"""
from __future__ import annotations

import ast
from pathlib import Path

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sparkctl"


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def long_modules() -> list[str]:
    """Each module over MAX_MODULE_LINES, as "path: N lines (limit L)"."""
    out = []
    for path in _modules():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            out.append(f"{_name(path)}: {lines} lines (limit {MAX_MODULE_LINES})")
    return out


def long_functions() -> list[str]:
    """Each function or method over MAX_FUNCTION_LINES, as "path:line name: N lines (limit L)"."""
    out = []
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    out.append(f"{_name(path)}:{node.lineno} {node.name}: {lines} lines (limit {MAX_FUNCTION_LINES})")
    return sorted(out)


def test_the_walk_sees_the_package() -> None:
    """The walk reads the package itself, not an empty directory (a passing test of nothing)."""
    names = {_name(p) for p in _modules()}
    assert "sparkctl/cli/main.py" in names and "sparkctl/deploy/apply.py" in names


def test_no_module_over_the_limit() -> None:
    over = long_modules()
    assert not over, "modules over the limit (split by what the code does):\n  " + "\n  ".join(over)


def test_no_function_over_the_limit() -> None:
    over = long_functions()
    assert not over, "functions over the limit:\n  " + "\n  ".join(over)
