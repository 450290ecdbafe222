"""What running commands on nodes returns: one command's result (`CommandResult`), and a fan-out over nodes in
parallel (`run_all` -> `GroupResult`, whose failures raise one `GroupError` naming every failed node).
The connector that produces them is `sparkctl.nodes.ssh` (and the process runtime's local runner).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sparkctl.errors import CommandFailed, NodeError
from sparkctl.nodes.fanout import fan_out

T = TypeVar("T")


@dataclass(frozen=True)
class CommandResult:
    """What one command printed on one node (argv and output already redacted)."""

    node: str
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def output(self) -> str:
        """stdout then stderr, for evidence."""
        return self.stdout + (("\n" if self.stdout and not self.stdout.endswith("\n") else "") + self.stderr
                              if self.stderr else "")

    def check(self) -> CommandResult:
        """Raise CommandFailed (argv, exit code, output tail) unless the command exited 0."""
        if self.returncode != 0:
            raise CommandFailed(node=self.node, argv=self.argv, returncode=self.returncode, output=self.output)
        return self


class GroupResult(dict[str, T | BaseException], Generic[T]):
    """Per-node results of `run_all`, like fabric's GroupResult: node name -> value or exception.

    ``succeeded`` / ``failed`` split them; one node's failure never hides the others' results.
    """

    @property
    def succeeded(self) -> dict[str, T]:
        return {k: v for k, v in self.items() if not isinstance(v, BaseException)}

    @property
    def failed(self) -> dict[str, BaseException]:
        return {k: v for k, v in self.items() if isinstance(v, BaseException)}

    def raise_for_failures(self) -> GroupResult[T]:
        """Raise GroupError naming every failed node (the successes stay readable on the error)."""
        if self.failed:
            raise GroupError(self)
        return self


class GroupError(NodeError):
    """One or more nodes failed in `run_all`; ``result`` keeps every node's outcome."""

    def __init__(self, result: GroupResult[Any]) -> None:
        failed = result.failed
        lines = []
        for name, exc in failed.items():
            text = exc.render() if hasattr(exc, "render") else f"{type(exc).__name__}: {exc}"
            lines.append(f"[{name}] {text}")
        ok = sorted(result.succeeded)
        super().__init__(f"failed on {len(failed)} of {len(result)} node(s): {', '.join(sorted(failed))}"
                         + (f" (ok: {', '.join(ok)})" if ok else ""), evidence="\n".join(lines))
        self.result = result


def run_all(nodes: Iterable[Any], fn: Callable[[Any], T], *, max_workers: int | None = None) -> GroupResult[T]:
    """Call ``fn(node)`` for every node in parallel; return node name -> value, or the exception it raised.

    ``nodes`` are inventory Nodes (or anything with ``.name``, or plain names). Example::

        res = run_all(inv.nodes, lambda n: connector_for(inv, n).run(["uptime"], check=True).stdout)
        for name, exc in res.failed.items(): ...
    """
    items = list(nodes)
    names = [getattr(n, "name", n) for n in items]
    out: GroupResult[T] = GroupResult()
    for name, o in zip(names, fan_out(items, fn, max_workers=max_workers)):
        if o.error is not None and not isinstance(o.error, Exception):
            raise o.error                    # KeyboardInterrupt / SystemExit: after every node finished
        # Outcome.value is `R | None` for both cases; a successful outcome holds fn's value (a T).
        out[str(name)] = o.value if o.error is None else o.error  # type: ignore[assignment]
    return out
