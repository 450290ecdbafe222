"""deploy/ is layered: its import graph (every import, TYPE_CHECKING and function-local ones included) has no
cycle, nothing imports the commands but the doors above deploy/, and the crash points come from the steps."""
from __future__ import annotations

import ast
from pathlib import Path

from sparkctl.deploy.steps import COMMANDS, crash_points
from sparkctl.nodes.fanout import fan_out, raise_first
from testrig.imports import import_graph, subgraph

DEPLOY = Path(__file__).resolve().parents[2] / "sparkctl" / "deploy"


def _graph() -> dict[str, set[str]]:
    """deploy/'s files by name -> the deploy/ files each imports (testrig.imports: every import, wherever it is,
    module level, function, TYPE_CHECKING)."""
    return subgraph(import_graph(), "sparkctl.deploy")


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None
    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_deploy_import_graph_is_acyclic():
    graph = _graph()
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_nothing_below_the_commands_imports_them_and_the_cluster_imports_no_layer_above():
    graph = _graph()
    # replicated composes them (one `up` per replica, its steps in replica_steps); the door chooses between them:
    # they sit above them, and nothing in deploy/ imports the door
    assert not [m for m, deps in graph.items() if "commands" in deps and m not in ("replicated", "replica_steps",
                                                                                    "door")]
    assert not [m for m, deps in graph.items() if "door" in deps]
    assert graph["cluster"] <= {"progress", "runtimes"}


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_fan_out_keeps_every_outcome_when_one_node_fails():
    def work(n: int) -> int:
        if n == 1:
            raise ValueError("node 1 refused")
        return n * 10
    outcomes = fan_out([0, 1, 2], work)
    assert [o.value for o in outcomes] == [0, None, 20] and [o.ok for o in outcomes] == [True, False, True]
    assert str(outcomes[1].error) == "node 1 refused"
    try:
        raise_first(outcomes)
    except ValueError as exc:
        assert "node 1" in str(exc)
    else:
        raise AssertionError("raise_first did not raise")


def test_crash_points_are_every_boundary_of_every_step():
    points = list(crash_points())
    assert len(points) == 2 * sum(len(s) for s in COMMANDS.values()) and len(set(points)) == len(points)
    assert ("up", "hand-off", "before") in points and ("rollback", "restore-boot", "after") in points


def test_every_parallel_call_goes_through_the_one_fan_out():
    """No thread pool of its own anywhere in sparkctl/ (a `pool.map` drops the other nodes' outcomes on the first
    error): the only executor is the fan-out's (`sparkctl.nodes.fanout`, imported from there by every layer)."""
    root = DEPLOY.parent
    pools = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if "ThreadPoolExecutor" in p.read_text() or "concurrent.futures" in p.read_text())
    assert pools == ["nodes/fanout.py"], pools
    assert not (root / "deploy" / "fanout.py").exists()      # no re-export: one module, one name


def test_run_all_keeps_every_node_and_runs_on_the_fan_out():
    from sparkctl.nodes.fanout import GroupError, run_all
    res = run_all(["a", "b", "c"], lambda n: 1 / 0 if n == "b" else n.upper())
    assert res.succeeded == {"a": "A", "c": "C"} and isinstance(res.failed["b"], ZeroDivisionError)
    try:
        res.raise_for_failures()
    except GroupError as exc:
        assert "b" in exc.message and "ok: a, c" in exc.message
    else:
        raise AssertionError("raise_for_failures did not raise")


def test_preflight_runs_every_node_before_raising():
    from sparkctl.deploy.preflight import run_preflight
    from sparkctl.errors import PreflightError
    from sparkctl.state.records import CheckResult
    seen: list[str] = []

    class Spec:
        def __init__(self, node: str) -> None:
            self.node = node

    def checks(spec: Spec) -> list[CheckResult]:
        seen.append(spec.node)
        if spec.node == "n0":
            raise ValueError("a bug on n0")
        return [CheckResult.failing(spec.node, "disk", "full", "free some")]
    try:   # Spec stands in for LaunchSpec (run_preflight reads its .node only): the ignores below say so
        run_preflight([Spec("n0"), Spec("n1")], checks)  # type: ignore[list-item, arg-type]
    except ValueError:
        pass
    else:
        raise AssertionError("a non-sparkctl error must propagate")
    assert sorted(seen) == ["n0", "n1"]
    try:
        run_preflight([Spec("n1"), Spec("n2")], lambda s: checks(s))  # type: ignore[list-item, arg-type]
    except PreflightError as exc:
        assert "[n1]" in exc.render() and "[n2]" in exc.render()
    else:
        raise AssertionError("failed checks must raise PreflightError")


def test_one_step_vocabulary_feeds_the_plan_apply_and_the_crash_points():
    """Each step of `up` is one typed class named from deploy/steps.py, in UP_STEPS' order; each runner table has a
    function for every class it runs (no step without its effect, no effect without its step), made once and
    read-only (no module adds to another's table on import); every name is a crash point."""
    from types import MappingProxyType

    from sparkctl.deploy import apply, replica_steps, steps
    from sparkctl.deploy.plan import REPLICATED_STEP_TYPES, STEP_TYPES
    assert set(apply.RUNNERS) == set(STEP_TYPES)          # replica_steps is imported above: apply's table unchanged
    assert set(replica_steps.RUNNERS) == set(REPLICATED_STEP_TYPES)
    assert all(replica_steps.RUNNERS[t].__module__ == replica_steps.__name__ for t in REPLICATED_STEP_TYPES)
    assert isinstance(apply.RUNNERS, MappingProxyType) and isinstance(replica_steps.RUNNERS, MappingProxyType)
    assert [t.name for t in STEP_TYPES] == [s for s in steps.UP_STEPS if s != steps.SETTLE]
    assert [t.name for t in REPLICATED_STEP_TYPES] == list(steps.REPLICATED_STEPS)
    points = set(crash_points())
    assert all(("up", t.name, when) in points for t in STEP_TYPES for when in ("before", "after"))
    rpoints = set(steps.replicated_crash_points())
    assert all((steps.REPLICATED_COMMAND, t.name, when) in rpoints for t in REPLICATED_STEP_TYPES
               for when in ("before", "after"))
    assert {t.name for t in STEP_TYPES if not t.idempotent} == {steps.STOP_OLD, steps.BOOT, steps.HAND_OFF}
    assert {t.name for t in REPLICATED_STEP_TYPES if not t.idempotent} == {steps.ROUTER_START, steps.REPLICA_UP,
                                                                            steps.HAND_OFF}


def test_no_step_name_is_spelled_outside_the_step_list():
    """A step name written as a string anywhere in deploy/ (or tune/ and bench/, whose trials and comparison arms are
    steps too) but steps.py is a second list that can drift. The compare transaction's steps and its ledger kinds
    count too."""
    from sparkctl.deploy import steps
    names = set(steps.UP_STEPS + steps.RESTORE_STEPS + steps.REPLICATED_STEPS + steps.TUNE_STEPS
                + steps.COMPARE_STEPS + steps.TRANSACTION_COMMANDS) - {steps.PREFLIGHT, steps.VERIFY}
    found = []
    for path in sorted([*DEPLOY.glob("*.py"), *(DEPLOY.parent / "tune").glob("*.py"),
                        *(DEPLOY.parent / "bench").glob("*.py")]):
        if path.name == "steps.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.name}:{node.lineno}: {node.value!r}")
    assert not found, found


def test_only_deploy_chooses_between_one_group_and_replicas():
    """Outside deploy/ nothing imports the replicated deployment to decide for itself (bench, the watcher, the CLI
    ask `deploy.door`: `deployed()`, `up`, `status`); the choice lives in one place."""
    names = {"is_replicated", "ReplicatedDeployer", "Record", "replica_inventory"}
    modules = {"sparkctl.deploy.replicated", "sparkctl.deploy.replica_steps", "sparkctl.state.replicated"}
    found = []
    for path in sorted((DEPLOY.parent).rglob("*.py")):
        if DEPLOY in path.parents or path == DEPLOY.parent / "state" / "replicated.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                found += [f"{path.relative_to(DEPLOY.parent)}:{node.lineno}: {a.name}" for a in node.names
                          if a.name in names]
    assert not found, found


# What a Deployer does to the cluster (deploy/commands.py). Outside deploy/ and cli/ it is asked of the door only.
ACTIONS = {"up", "rollback", "down", "repair"}


def _outside_calls(tree_root: Path) -> list[str]:
    """Every call `X.up/rollback/down/repair(...)` in sparkctl/ outside deploy/ and cli/ whose X is not the door."""
    found = []
    for path in sorted(tree_root.rglob("*.py")):
        rel = path.relative_to(tree_root).as_posix()
        if rel.startswith(("deploy/", "cli/")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ACTIONS \
                    and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "door"):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node.func)}")
    return found


def test_every_change_from_outside_deploy_goes_through_the_door():
    """bench, tune and the watcher (its restarts and its crash-loop rollback) change the cluster only through
    `deploy.door` (`door.up` / `rollback` / `restore`, `Deployed.restart`), never a Deployer's own methods: the door
    is where one group or replicas is chosen and the transaction's command set (docs/architecture.md)."""
    assert _outside_calls(DEPLOY.parent) == []


def test_the_door_check_finds_a_side_door(tmp_path):
    (tmp_path / "watch").mkdir()
    (tmp_path / "watch" / "x.py").write_text("def f(d, door):\n    door.rollback(d)\n    d.rollback(None)\n")
    assert _outside_calls(tmp_path) == ["watch/x.py:3: d.rollback"]


def test_the_doctor_reads_and_changes_nothing():
    """doctor/ diagnoses from what it reads: of deploy/ it imports only the readers (the cluster's handles, what runs,
    typed results, runtimes), no command, step runner or the door."""
    readers = {"cluster", "observe", "results", "runtimes"}
    imported = {dep.removeprefix("sparkctl.deploy.") for mod, deps in import_graph().items()
                if mod.startswith("sparkctl.doctor.") for dep in deps if dep.startswith("sparkctl.deploy.")}
    assert imported and imported <= readers, sorted(imported)
