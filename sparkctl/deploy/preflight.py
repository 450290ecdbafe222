"""Preflight: read-only checks on every node, in parallel, before anything changes.

Each check names the node, what was checked, what was seen and what to do. The
runtime of a node gathers its facts (`runtime.gather(spec)`), `preflight_rules.evaluate`
judges them; this module runs that on all nodes at once and raises one PreflightError
listing every failure.
"""
from __future__ import annotations

from collections.abc import Callable

from sparkctl.errors import MissingExtraError, PreflightError, SparkctlError
from sparkctl.nodes.fanout import fan_out, raise_first
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.state.records import CheckResult


def ports_of(spec: LaunchSpec) -> list[tuple[str, int, str]]:
    """(bind address, port, what) this rank will listen on (the LaunchSpec answers: `spec.listen_ports()`)."""
    return spec.listen_ports()


def run_preflight(specs: list[LaunchSpec], checks_for: Callable[[LaunchSpec], list[CheckResult]],
                  then: Callable[[], list[CheckResult]] | None = None) -> list[CheckResult]:
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


def _safe(fn: Callable[[LaunchSpec], list[CheckResult]]) -> Callable[[LaunchSpec], list[CheckResult]]:
    """A known failure on one node (SSH refused, a command failed) is that node's failed check; anything else is
    a sparkctl bug and propagates to the CLI's debug-log boundary."""
    def run(spec: LaunchSpec) -> list[CheckResult]:
        try:
            return fn(spec)
        except MissingExtraError:      # this installation's, not the node's: said once, exit 2
            raise
        except SparkctlError as exc:
            return [CheckResult.failing(spec.node, "preflight", exc.message, exc.hint or "see the message")]
    return run
