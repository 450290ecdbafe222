"""Preflight: read-only checks on every node, in parallel, before anything changes.

Each check names the node, what was checked, what was seen and what to do. The
runtime of a node supplies its checks (`runtime.preflight(...)`); this module runs
them on all nodes at once and raises one PreflightError listing every failure.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable

from sparkctl.errors import PreflightError
from sparkctl.sglang.launch import LaunchSpec


@dataclass
class Check:
    node: str
    name: str
    ok: bool
    seen: str
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def ports_of(spec: LaunchSpec) -> list[tuple[str, int, str]]:
    """(bind address, port, what) this rank will listen on."""
    argv = spec.argv
    host = argv[argv.index("--host") + 1] if "--host" in argv else "127.0.0.1"
    port = int(argv[argv.index("--port") + 1]) if "--port" in argv else 30000
    out = [(host, port, "HTTP API" if spec.rank == 0 else "dummy health server")]
    if spec.rank == 0 and "--dist-init-addr" in argv:
        addr, _, dport = argv[argv.index("--dist-init-addr") + 1].rpartition(":")
        out.append((addr, int(dport), "TCP store (--dist-init-addr)"))
    return out


def run_preflight(specs: list[LaunchSpec], checks_for: Callable[[LaunchSpec], list[Check]],
                  then: Callable[[], list[Check]] | None = None) -> list[Check]:
    """Run every node's checks in parallel, then the cross-node ones (``then``, e.g.
    ``sparkctl.deploy.host_checks.CrossNodeChecks.checks``); raise PreflightError naming each failed node and check."""
    with ThreadPoolExecutor(max_workers=max(1, len(specs))) as pool:
        results = list(pool.map(_safe(checks_for), specs))
    checks = [c for per_node in results for c in per_node]
    if then is not None:
        checks += then()
    failed = [c for c in checks if not c.ok]
    if failed:
        first = failed[0]
        err = PreflightError(f"{first.name}: {first.seen}", where=f"[{first.node}] preflight", hint=first.fix or None,
                             evidence="\n".join(f"[{c.node}] {c.name}: {c.seen}" + (f" -> {c.fix}" if c.fix else "")
                                                for c in failed[1:]) or None)
        err.checks = checks
        raise err
    return checks


def _safe(fn: Callable[[LaunchSpec], list[Check]]) -> Callable[[LaunchSpec], list[Check]]:
    def run(spec: LaunchSpec) -> list[Check]:
        try:
            return fn(spec)
        except Exception as exc:  # noqa: BLE001 - one node's crash is that node's failed check
            return [Check(spec.node, "preflight", False, f"{type(exc).__name__}: {exc}", "see the message")]
    return run
