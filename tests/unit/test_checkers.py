"""The type checker and the linter over the whole tree (sparkctl/ and the code that tests and measures it: tests/,
testrig/, benchmarks/, scripts/), as CI runs them (./bin/test): no error, or the test fails with their output.

Both tools are pinned in pyproject.toml's `test` extra (bin/_bootstrap installs it) and configured there
([tool.mypy], [tool.ruff]). On a laptop without them the tests skip with the reason; under CI=true a missing
tool fails (testenv.need_module), since there a missing tool is a broken install, never a reason to skip.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from testrig.testenv import in_ci, need_module

ROOT = Path(__file__).resolve().parents[2]


def _pinned(name: str) -> str | None:
    """The version the test extra pins for `name` (``name==X``), or None."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    for req in extra:
        m = re.fullmatch(rf"{re.escape(name)}==(\S+)", req.strip())
        if m:
            return m.group(1)
    return None


def _run(args: list[str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _version_note(tool: str, installed: str) -> str:
    pinned = _pinned(tool)
    if pinned and pinned != installed:
        return f" (installed {tool} {installed}, the test extra pins {pinned}: results may differ)"
    return ""


def test_mypy_reports_no_error_over_the_checked_tree():
    mypy_version = need_module("mypy.version", "mypy checks the types of the tree (pip install -e '.[test]')")
    files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert {"sparkctl", "tests", "testrig", "benchmarks", "scripts"} <= set(files), f"[tool.mypy] files = {files}"
    res = _run(["mypy"])         # files, plugins and strictness: [tool.mypy] in pyproject.toml
    if res.returncode != 0:
        pytest.fail(f"mypy found errors{_version_note('mypy', mypy_version.__version__)}:\n"
                    f"{res.stdout}{res.stderr}", pytrace=False)


# Every place the project keeps Python: one left out rots (issue 33 found 177 errors in the four that were). A new
# top-level directory or file of Python must be added here; the test below says so.
RUFF_CHECKED = ("sparkctl", "tests", "testrig", "benchmarks", "scripts", "playbooks", "setup.py")


def _python_places() -> set[str]:
    """Top-level names under which the project's own Python lives: what git tracks (a build/ or dist/ that an
    editable install or a wheel build leaves, and .venv, are not the project's); outside a git checkout, the
    directory minus what .gitignore names."""
    res = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--", "*.py"], capture_output=True, text=True)
    if res.returncode == 0:
        return {path.split("/", 1)[0] for path in res.stdout.split("\0") if path}
    ignored = {"build", "dist", "__pycache__"}
    return {p.name for p in ROOT.iterdir()
            if not p.name.startswith(".") and p.name not in ignored and not p.name.endswith(".egg-info")
            and (p.suffix == ".py" if p.is_file() else any(p.rglob("*.py")))}


def test_ruff_checks_every_place_that_holds_python():
    unchecked = sorted(_python_places() - set(RUFF_CHECKED))
    assert unchecked == [], f"Python in {unchecked} that ruff does not check: add them to RUFF_CHECKED"


def test_ruff_reports_no_error_over_the_whole_tree():
    need_module("ruff", "ruff lints the tree (pip install -e '.[test]')")
    version = _run(["ruff", "--version"], timeout=60)
    paths = [p for p in RUFF_CHECKED if (ROOT / p).exists()]
    res = _run(["ruff", "check", "--no-cache", *paths], timeout=300)   # rules: [tool.ruff] in pyproject.toml
    if res.returncode != 0:
        installed = version.stdout.strip().rpartition(" ")[2]
        pytest.fail(f"ruff found errors{_version_note('ruff', installed)}:\n{res.stdout}{res.stderr}",
                    pytrace=False)


def test_the_checkers_are_pinned_in_the_test_extra():
    """A new release brings new rules and new inference: CI must not turn red on unchanged code."""
    assert _pinned("mypy") and _pinned("ruff"), "pin mypy and ruff (name==X) in pyproject.toml's test extra"


def test_under_ci_the_installed_checkers_are_the_pinned_ones():
    if not in_ci():
        pytest.skip("a laptop may run other versions (the checker tests then name both)")
    from importlib.metadata import version
    for tool in ("mypy", "ruff"):
        assert version(tool) == _pinned(tool), f"{tool} {version(tool)} installed, {_pinned(tool)} pinned"


ANY_BUDGET = 100     # issue 26 asked for under 150 (601 before it); 89 when this test was written


def _annotations_naming_any(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        anns: list[ast.expr] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            anns = [x.annotation for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                    if x is not None and x.annotation is not None]
            anns += [node.returns] if node.returns is not None else []
        elif isinstance(node, ast.AnnAssign):
            anns = [node.annotation]
        lines += [an.lineno for an in anns
                  if any(isinstance(x, ast.Name) and x.id == "Any" or isinstance(x, ast.Attribute) and x.attr == "Any"
                         for x in ast.walk(an))]
    return lines


def test_any_stays_where_a_value_is_arbitrary():
    """`Any` in an annotation says nothing about the value; JSON is named `JSONObject`, `JSONValue` or `JSONMapping`
    (sparkctl/jsontypes.py), everything else has its own type. The budget keeps the count from creeping back."""
    found = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "sparkctl").rglob("*.py"))
             if (n := len(_annotations_naming_any(ast.parse(p.read_text()))))}
    total = sum(found.values())
    top = ", ".join(f"{p} {n}" for p, n in sorted(found.items(), key=lambda kv: -kv[1])[:8])
    assert total <= ANY_BUDGET, f"{total} annotations name Any (budget {ANY_BUDGET}); most in: {top}"
