"""Issue 31 item 8: a missing optional extra is named with the command that installs it, never an internal error,
and usage errors print as text whatever click prints them.

In-process here (an extra made missing with ``sys.modules[name] = None``, which makes its import raise
ModuleNotFoundError as an absent package does); tests/install/test_wheel.py runs the same table from a real install
without the extras, and tests/install/test_typer_range.py the usage cases under each typer of the pinned range.
"""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from sparkctl.extras import EXTRAS, MODULES
from testrig import usage_cases
from testrig.usage_cases import NEEDS, SPARKS

REPO = Path(__file__).resolve().parents[2]

NEEDS_CASES = [(extra, argv) for extra, argvs in NEEDS.items() for argv in argvs]


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def test_extras_are_pyprojects_and_each_is_exercised():
    extras = {k: tuple(v) for k, v in _pyproject()["project"]["optional-dependencies"].items() if k != "test"}
    assert extras == EXTRAS, "sparkctl/extras.py's EXTRAS must list pyproject.toml's extras as written"
    assert set(MODULES.values()) == set(EXTRAS) == set(NEEDS)


def _extra_imports(tree: ast.AST) -> list[tuple[int, str, str | None]]:
    """(line, module, the extra of the enclosing `with needed(EXTRA, ...)` or None) of every import of an extra's
    module outside `if TYPE_CHECKING:`."""
    found: list[tuple[int, str, str | None]] = []

    def visit(node: ast.AST, extra: str | None) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.orelse:
                visit(stmt, extra)
            return
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                if (isinstance(call, ast.Call) and ast.unparse(call.func).endswith("needed") and call.args
                        and isinstance(call.args[0], ast.Constant)):
                    extra = str(call.args[0].value)
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found.extend((node.lineno, n, extra) for n in names if n.split(".")[0] in MODULES)
        for child in ast.iter_child_nodes(node):
            visit(child, extra)
    visit(tree, None)
    return found


def test_every_import_of_an_extras_package_is_inside_needed_for_that_extra():
    base = {r.split(">")[0].split("=")[0].split("<")[0].strip().lower().replace("-", "_")
            for r in _pyproject()["project"]["dependencies"]}
    seen, wrong = 0, []
    for path in sorted((REPO / "sparkctl").rglob("*.py")):
        for line, module, extra in _extra_imports(ast.parse(path.read_text(encoding="utf-8"))):
            top = module.split(".")[0]
            if top in base:        # also a base dependency (prometheus_client): always installed
                continue
            seen += 1
            if extra != MODULES[top]:
                inside = f" (inside needed({extra!r}))" if extra else ""
                wrong.append(f"{path.relative_to(REPO)}:{line}: import {module} outside "
                             f"`with needed({MODULES[top]!r}, ...)`{inside}")
    assert seen >= 6, seen           # paramiko x3, fabric, ansible_runner x2: the reader still finds them
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(("extra", "argv"), NEEDS_CASES, ids=[f"{e}:{' '.join(a[:3])}" for e, a in NEEDS_CASES])
def test_a_missing_extra_is_named_with_its_install_command(cli, state_dir, profiles_dir, monkeypatch, extra, argv):
    from testrig.embedded import write_replicated_profile
    write_replicated_profile(profiles_dir / "two.yml", 8)
    for module, of in MODULES.items():
        if of == extra:
            monkeypatch.setitem(__import__("sys").modules, module, None)   # import raises ModuleNotFoundError
    code, out, err = cli(*[a.replace("{replicated}", "two") for a in argv])
    assert code == 2, (code, err)
    assert "internal error" not in err and "Traceback" not in err
    assert f"needs the optional `{extra}` extra" in err, err
    assert f"pip install 'sparkctl[{extra}]'" in err and "pipx inject sparkctl '" in err, err
    assert not (state_dir / "desk" / "deployments").exists() or extra != "nodes"   # nothing was started


@pytest.mark.parametrize("case", usage_cases.cases(), ids=lambda c: c.id)
def test_usage_errors_and_help_are_text(case):
    code, out, err = usage_cases.run(case)
    assert usage_cases.problems(case, code, out, err) == []


def test_the_usage_cases_cover_every_command_and_kind():
    cases = usage_cases.cases()
    kinds = {c.kind for c in cases}
    assert {"help", "unknown-option", "missing", "bad-number", "unknown-command", "did-you-mean"} <= kinds
    helped = {c.argv[:-1] for c in cases if c.kind == "help"}
    assert {("up",), ("image", "plan"), ("bench", "diff"), ()} <= helped and len(helped) >= 25, sorted(helped)


@pytest.mark.parametrize("closed", [1, 2], ids=["stdout-closed", "stderr-closed"])
@pytest.mark.parametrize(("argv", "code"), [(["statu"], 2), (["--help"], 0), (["render", "-p", "no-such"], 2),
                                            (["render", "-p", "d5", "--json"], 0)])
def test_a_closed_stream_is_not_an_internal_error_and_errors_never_reach_stdout(tmp_path, closed, argv, code):
    """`sparkctl ... 2>&-` (Python then has sys.stderr None, and print(file=None) writes to stdout)."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "SPARKCTL_STATE_DIR": str(tmp_path / "state"), "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "sparkctl", *argv], capture_output=True, text=True, timeout=60,
                         env=env, cwd=tmp_path, preexec_fn=lambda: os.close(closed), check=False)
    assert res.returncode == code, res
    assert "sparkctl: internal error" not in res.stdout + res.stderr and "Traceback" not in res.stdout + res.stderr, res
    if closed == 2:
        assert "Error" not in res.stdout and "no profile named" not in res.stdout, res.stdout


@pytest.mark.parametrize("dependency", ["cryptography", "invoke"])
@pytest.mark.parametrize("argv", [["preflight", "-p", "d5"], ["status"], ["image", "ls"]])
def test_an_extra_whose_own_dependency_is_missing_says_reinstall(cli, state_dir, monkeypatch, dependency, argv):
    """paramiko and fabric are there (so `require` passes) but what they import is not: a damaged install, said
    once as such (exit 2), never one node's failed check or an internal error."""
    import sys
    for name in [m for m in sys.modules if m.split(".")[0] in ("paramiko", "fabric", dependency)]:
        monkeypatch.delitem(sys.modules, name)                  # imported afresh, so the missing one is met
    monkeypatch.setitem(sys.modules, dependency, None)
    code, out, err = cli(*argv, "--inventory", SPARKS)
    assert code == 2, err
    assert "needs the optional `nodes` extra, which is incomplete here" in err and f"import '{dependency}" in err, err
    assert "pip install --force-reinstall 'sparkctl[nodes]'" in err and "preflight:" not in err, err
