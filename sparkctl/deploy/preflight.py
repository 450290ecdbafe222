"""Preflight: read-only checks on every node, in parallel, before anything changes.

Each check names the node, what was checked, what was seen and what to do. The
runtime of a node gathers its facts (`runtime.gather(spec)`), `preflight_rules.evaluate`
judges them; this module runs that on all nodes at once and raises one PreflightError
listing every failure.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from sparkctl.deploy.fanout import fan_out, raise_first
from sparkctl.errors import PreflightError, SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.launch import LaunchSpec


class Severity(StrEnum):
    OK = "ok"
    WARN = "warning"      # passes, but worth reading (a test node without nvidia-smi, a small MTU)
    FAIL = "failed"       # blocks the deployment


@dataclass(frozen=True)
class Check:
    node: str
    name: str
    severity: Severity
    seen: str
    fix: str = ""

    @classmethod
    def passing(cls, node: str, name: str, seen: str) -> Check:
        return cls(node, name, Severity.OK, seen)

    @classmethod
    def warning(cls, node: str, name: str, seen: str) -> Check:
        return cls(node, name, Severity.WARN, seen)

    @classmethod
    def failing(cls, node: str, name: str, seen: str, fix: str) -> Check:
        return cls(node, name, Severity.FAIL, seen, fix)

    @property
    def ok(self) -> bool:
        return self.severity is not Severity.FAIL

    @property
    def line(self) -> str:
        """`name: seen`, with `warning:` before a warning's text."""
        return f"{self.name}: " + ("warning: " if self.severity is Severity.WARN else "") + self.seen

    def as_dict(self) -> JSONObject:
        return {"node": self.node, "name": self.name, "ok": self.ok, "severity": self.severity.value,
                "seen": self.seen, "fix": self.fix}


def ports_of(spec: LaunchSpec) -> list[tuple[str, int, str]]:
    """(bind address, port, what) this rank will listen on (the LaunchSpec answers: `spec.listen_ports()`)."""
    return spec.listen_ports()


def run_preflight(specs: list[LaunchSpec], checks_for: Callable[[LaunchSpec], list[Check]],
                  then: Callable[[], list[Check]] | None = None) -> list[Check]:
    """Run every node's checks in parallel, then the cross-node ones (``then``, e.g.
    ``sparkctl.deploy.host_checks.CrossNodeChecks.checks``); raise PreflightError naming each failed node and check."""
    results = raise_first(fan_out(specs, _safe(checks_for)))   # every node's checks run to the end first
    checks = [c for per_node in results for c in per_node]
    if then is not None:
        checks += then()
    failed = [c for c in checks if not c.ok]
    if failed:
        first = failed[0]
        raise PreflightError(f"{first.name}: {first.seen}", where=f"[{first.node}] preflight", hint=first.fix or None,
                             evidence="\n".join(f"[{c.node}] {c.name}: {c.seen}" + (f" -> {c.fix}" if c.fix else "")
                                                for c in failed[1:]) or None, checks=checks)
    return checks


def _safe(fn: Callable[[LaunchSpec], list[Check]]) -> Callable[[LaunchSpec], list[Check]]:
    """A known failure on one node (SSH refused, a command failed) is that node's failed check; anything else is
    a sparkctl bug and propagates to the CLI's debug-log boundary."""
    def run(spec: LaunchSpec) -> list[Check]:
        try:
            return fn(spec)
        except SparkctlError as exc:
            return [Check.failing(spec.node, "preflight", exc.message, exc.hint or "see the message")]
    return run
