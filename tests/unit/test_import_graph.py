"""sparkctl's import graph has no circle, between files or between packages, so the layers stay layers.

The graph is testrig.imports's (read with `ast` from the source: every import counts, wherever it is, since a
function-level import is only a circle postponed; a package is `sparkctl.<name>`, and the package graph keeps the
edges between two different packages).

A failure names each circle, e.g. ``sparkctl.config -> sparkctl.cli -> sparkctl.config``, and the file imports that
make its edges, so the fix can start from them.
"""
from __future__ import annotations

from pathlib import Path

from testrig.imports import import_graph, package_graph, package_of


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


# Where an import of sparkctl is made inside a function, and the measured start-up cost that keeps it there
# (docs/architecture.md "Imports"): anywhere else an import is at the top of its module.
DEFERRED = {
    "sparkctl.cli": "a command's library loads when the command runs: `import sparkctl.cli.main` 0.09 s, every "
                    "module of sparkctl +0.75 s (`sparkctl --help`, completion, exit-2 errors stay fast)",
    "sparkctl.config.loader": "on the CLI's entry path (above)",
    "sparkctl.sim.engine": "a worker rank never loads the HTTP API or the scheduler (0.07 s; 0.17 s with them)",
    "sparkctl.sim.vllm_engine": "a headless vLLM rank never loads the HTTP API or the scheduler (0.068 s; 0.095 s "
                                "with them)",
    "sparkctl.sim.args": "the emulator's argument parser loads the SGLang dialect only to parse (emulator start)",
    "sparkctl.sim.decoding": "the emulator's rank 0 loads its performance model when it first decodes",
    "sparkctl.deploy.runtimes": "the docker runtime is an optional extra (sparkctl[nodes]): its ImportError is a "
                                "ConfigError naming the extra",
    "sparkctl.nodes.process": "a probe: can the emulator be imported on this node",
    "sparkctl.deploy.commands": "`repair` loads its library when it runs (deploy.repair with the tune journal and "
                                "the router's container: 17 ms of `import sparkctl.deploy.commands`; `up` never "
                                "repairs)",
    "sparkctl.state.ledger": "a bench run's record (state.runs) loads when one is read: 19 ms of every command "
                             "that opens the ledger; `up` reads none",
    "sparkctl.deploy.image_stage": "the image pipeline (sparkctl.images) loads for a docker cluster only: 16 ms of "
                                   "`import sparkctl.deploy.apply`; a process-runtime `up` has no image",
    "sparkctl.deploy.cluster": "the HTTP client (sparkctl.sglang.client: httpx, httpcore, h11, ssl; 87 modules) "
                               "loads with the first client, after the engines started: exec -> first rank started "
                               "0.84 -> 0.66 s on the embedded cluster (the router's httpx deferred with it)",
    "sparkctl.deploy.door": "the replicated deployment (deploy.replicated, its steps, the router's client, launch "
                            "and container) loads when replicas run or are asked for: 6 ms of `import "
                            "sparkctl.deploy.door`, which one group's `up` never needs",
}


def test_imports_are_at_the_top_except_where_a_measured_start_up_cost_keeps_them():
    from testrig.imports import deferred_imports
    found = deferred_imports()
    unexplained = {m: lines for m, lines in found.items()
                   if not any(m == k or m.startswith(k + ".") for k in DEFERRED)}
    assert not unexplained, f"imports inside functions with no measured reason (move them to the top): {unexplained}"


def test_the_cli_entry_loads_no_command_library():
    """What `sparkctl --help` imports: the CLI's own modules and the config loader, none of deploy/, nodes/, the
    images or the bench, and none of the heavy libraries (what DEFERRED["sparkctl.cli"] keeps it to)."""
    import subprocess
    import sys
    probe = ("import sys, sparkctl.cli.main; print(' '.join(sorted(m for m in sys.modules if m.startswith("
             "('sparkctl', 'httpx', 'paramiko', 'fabric', 'docker', 'rich', 'jinja2', 'ansible_runner')))))")
    loaded = set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                cwd=str(Path(__file__).resolve().parents[2])).stdout.split())
    heavy = {m for m in loaded if not m.startswith("sparkctl")}
    assert not heavy, heavy
    below = {m for m in loaded if m.split(".")[1:2] and m.split(".")[1] not in ("cli", "config", "errors",
                                                                               "jsontypes", "resources",
                                                                               "enginenames")}
    assert not below, below


def test_the_up_path_loads_no_command_line_of_httpx():
    """What `sparkctl up` imports (the CLI, the deploy path, the engines' clients) loads httpx but not its command-line
    client (click, rich, pygments: 17 % of the path's import time, sparkctl.cli.WithoutHttpxCLI), while a program
    that imports only sparkctl's library keeps httpx's command line."""
    import subprocess
    import sys
    repo = str(Path(__file__).resolve().parents[2])

    def loaded(modules: str) -> set[str]:
        probe = (f"import sys, {modules}; print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
                 "('httpx', 'click', 'rich', 'pygments'))))")
        return set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                  cwd=repo).stdout.split())

    up = loaded("sparkctl.cli.main, sparkctl.deploy.door, sparkctl.deploy.apply, sparkctl.sglang.client, "
                "sparkctl.router.client")
    assert "httpx" in up and "httpx._client" in up, up
    assert not {m for m in up if m.split(".")[0] in ("click", "rich", "pygments")} and "httpx._main" not in up, up
    library = loaded("sparkctl.sglang.client")
    assert "httpx._main" in library or "click" not in library, library    # httpx's own rule where click is absent
