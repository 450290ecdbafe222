"""sparkctl's import graph has no circle, between files or between packages, so the layers stay layers.

The graph is read with `ast` from the source, not from what happens to be imported at run time: every import
counts, wherever it is (module level, inside a function, under TYPE_CHECKING), since a function-level import is
only a circle postponed. `from sparkctl.a import b` is an edge to the module `sparkctl.a.b` when that is a file,
else to `sparkctl.a`. A package is `sparkctl.<name>` (a sub-package or a top-level file such as
`sparkctl/statefiles.py`); the package graph keeps the edges between two different packages.

A failure names each circle, e.g. ``sparkctl.config -> sparkctl.cli -> sparkctl.config``, and the file imports that
make its edges, so the fix can start from them.
"""
from __future__ import annotations

import ast
from pathlib import Path

SPARKCTL = Path(__file__).resolve().parents[2] / "sparkctl"


def _modules(root: Path) -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _targets(mods: dict[str, Path], current: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The sparkctl modules one import statement of `current` names."""
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
    """Module -> the sparkctl modules it imports (every import statement in the file)."""
    mods = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps |= _targets(mods, name, node)
        graph[name] = deps - {name}
    return graph


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        out.setdefault(package_of(mod), set()).update(package_of(d) for d in deps if package_of(d) != package_of(mod))
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component with more than one member (Tarjan), each as a path that
    returns to where it starts, e.g. ["a", "b", "a"]."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_path_in(graph, comp) for comp in components]


def _path_in(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest circle through the component's first member (breadth first inside the component)."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, set()) & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, v, start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)


def _explain(graph: dict[str, set[str]], circle: list[str], *, packages: bool) -> str:
    lines = [" -> ".join(circle)]
    for a, b in zip(circle, circle[1:], strict=False):
        edges = sorted(f"{m} imports {d}" for m, deps in graph.items() for d in deps
                       if (package_of(m), package_of(d)) == (a, b)) if packages else [f"{a} imports {b}"]
        lines += [f"    {e}" for e in edges[:5]]
    return "\n".join(lines)


def test_no_file_imports_itself_back():
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles between files:\n" + "\n".join(_explain(graph, c, packages=False) for c in found)


def test_no_package_imports_itself_back():
    graph = import_graph()
    found = circles(package_graph(graph))
    assert not found, "import circles between packages:\n" + "\n".join(_explain(graph, c, packages=True)
                                                                     for c in found)


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """Module-level, function-level, TYPE_CHECKING and relative imports all make edges; a circle of each is found
    and named, at both levels."""
    pkg = tmp_path / "sparkctl"
    for sub in ("a", "b"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("from sparkctl.b import y\n")
    (pkg / "a" / "z.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import x\n")
    (pkg / "b" / "y.py").write_text("def f():\n    import sparkctl.a.z\n")
    graph = import_graph(pkg)
    assert graph["sparkctl.a.x"] == {"sparkctl.b.y"} and graph["sparkctl.a.z"] == {"sparkctl.a.x"}
    assert graph["sparkctl.b.y"] == {"sparkctl.a.z"}
    assert circles(graph) == [["sparkctl.a.x", "sparkctl.b.y", "sparkctl.a.z", "sparkctl.a.x"]]
    assert circles(package_graph(graph)) == [["sparkctl.a", "sparkctl.b", "sparkctl.a"]]
    assert "sparkctl.b.y imports sparkctl.a.z" in _explain(graph, ["sparkctl.a", "sparkctl.b", "sparkctl.a"],
                                                          packages=True)
