"""The one reader of sparkctl's import graph (tests/unit/test_import_graph.py, tests/unit/test_deploy_layers.py).

The graph is read with `ast` from the source, not from what happens to be imported at run time: every import
counts, wherever it is (module level, inside a function, under TYPE_CHECKING), since a function-level import is
only a circle postponed. `from sparkctl.a import b` is an edge to the module `sparkctl.a.b` when that is a file,
else to `sparkctl.a`; relative imports resolve against the importing file. A package is `sparkctl.<name>` (a
sub-package or a top-level file such as `sparkctl/statefiles.py`); the package graph keeps the edges between two
different packages.
"""
from __future__ import annotations

import ast
from pathlib import Path

SPARKCTL = Path(__file__).resolve().parents[1] / "sparkctl"


def modules(root: Path) -> dict[str, Path]:
    """Every module under the package directory `root`, by dotted name (a package by its `__init__.py`)."""
    mods: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _targets(mods: dict[str, Path], current: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The modules of `mods` one import statement of `current` names."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in mods}
    if node.level:                                        # relative: from . import x, from ..a import b
        base = current.split(".")
        if mods[current].name != "__init__.py":
            base = base[:-1]
        base = base[:len(base) - (node.level - 1)]
        module = ".".join([*base, *([node.module] if node.module else [])])
    else:
        module = node.module or ""
    out = set()
    for alias in node.names:
        sub = f"{module}.{alias.name}"
        out.add(sub if sub in mods else module)
    return out & mods.keys()


def import_graph(root: Path = SPARKCTL) -> dict[str, set[str]]:
    """Module -> the modules under `root` it imports (every import statement in the file)."""
    mods = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps |= _targets(mods, name, node)
        graph[name] = deps - {name}
    return graph


def package_of(module: str) -> str:
    """`sparkctl.a.b.c` -> `sparkctl.a`."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded to packages: the edges between two different packages."""
    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        out.setdefault(package_of(mod), set()).update(package_of(d) for d in deps if package_of(d) != package_of(mod))
    return out


def subgraph(graph: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The modules directly in `package` (its files, not its sub-packages' nor the package itself), by their last
    name, and the edges between them: `sparkctl.deploy` -> {"cluster": {"progress", "runtimes"}, ...}."""
    prefix = package + "."

    def local(module: str) -> str | None:
        rest = module[len(prefix):] if module.startswith(prefix) else ""
        return rest if rest and "." not in rest else None

    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        name = local(mod)
        if name is not None:
            out[name] = {d for d in map(local, deps) if d is not None} - {name}
    return out


def deferred_imports(root: Path = SPARKCTL) -> dict[str, list[int]]:
    """Module -> the lines of its imports of `root`'s modules made inside a function (run when the function runs,
    not when the module loads), TYPE_CHECKING-only imports left out."""
    mods = modules(root)
    out: dict[str, list[int]] = {}

    def walk(node: ast.AST, name: str, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                walk(ast.Module(body=child.orelse, type_ignores=[]), name, in_function)
                continue
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)) and _targets(mods, name, child):
                out.setdefault(name, []).append(child.lineno)
            walk(child, name, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    for name, path in mods.items():
        walk(ast.parse(path.read_text(), str(path)), name, False)
    return out
