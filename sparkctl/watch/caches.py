"""Drop the page cache on the nodes before the watcher restarts a group, only where `sparkctl prepare` granted it.

Why: on GB10 the page cache lives in the same unified memory the engine's static pool is taken from, and owners
report boots that fail (or come up with a smaller KV pool) on memory the page cache holds, because the CUDA
allocator does not reliably get it back (operations.md; preflight's memory check warns about it before every boot,
`deploy/preflight_rules.memory_check`). A restart after a crash is exactly when that happens.

The grant (inventory `prepare_drop_caches: true`, then `sparkctl prepare`): a root-owned helper, `HELPER`, that
takes no arguments, runs `sync` and writes 3 to /proc/sys/vm/drop_caches, and prints Cached before and after;
for a non-root deploy user one sudoers rule allowing exactly that helper with no arguments
(/etc/sudoers.d/sparkctl-drop-caches). Why not more: a capability (CAP_SYS_ADMIN) on any program the user can run
would grant far more than one write; a sudo rule for one fixed, argument-less, root-owned file grants only this,
is visible in /etc/sudoers.d, and is revoked by setting the variable back to false and running prepare again.

The watcher runs ``sudo -n HELPER`` (``HELPER`` alone when it connects as root) on every SSH node; a node without the
grant (no helper, or sudo asks for a password) is left alone and the watcher says so. Nodes of the embedded cluster
(process runtime, no SSH) are never touched. Example::

    for d in drop_caches(inventory):
        print(d.line())        # "spark-a: dropped (Cached 3.1 GiB -> 0.2 GiB)" / "spark-b: not granted (...)"
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from sparkctl.config.inventory import Inventory, Node
from sparkctl.nodes.fanout import fan_out
from sparkctl.nodes.ssh import CommandResult, connector_for

HELPER = "/usr/local/sbin/sparkctl-drop-caches"
SUDOERS_FILE = "/etc/sudoers.d/sparkctl-drop-caches"
HELPER_PREFIX = "sparkctl-drop-caches:"      # the helper's own error lines (granted, but it could not drop)
DEADLINE_S = 60.0
EMBEDDED = "embedded cluster: nothing is dropped on this machine"
_DONE = re.compile(r"cached_kb_before=(\d+) cached_kb_after=(\d+)")


@dataclass(frozen=True)
class Dropped:
    """One node's outcome: `granted` (the helper ran: prepare granted it), `done` (the cache was dropped)."""

    node: str
    granted: bool
    done: bool
    detail: str
    cached_before_kb: int | None = None
    cached_after_kb: int | None = None

    def line(self) -> str:
        if self.done and self.cached_before_kb is not None and self.cached_after_kb is not None:
            return (f"{self.node}: dropped (Cached {self.cached_before_kb / 2**20:.1f} GiB -> "
                    f"{self.cached_after_kb / 2**20:.1f} GiB)")
        return f"{self.node}: {'dropped' if self.done else 'failed' if self.granted else 'not granted'} ({self.detail})"


def drop_argv(node: Node) -> list[str]:
    """The command the watcher runs on `node`: the helper itself as root, else through `sudo -n` (never a prompt)."""
    return [HELPER] if node.ssh.user == "root" else ["sudo", "-n", HELPER]


def parse_drop(node: str, res: CommandResult) -> Dropped:
    """What one run of the helper says (pure: testable from a captured result)."""
    m = _DONE.search(res.stdout)
    if res.returncode == 0 and m:
        return Dropped(node, True, True, "dropped", int(m.group(1)), int(m.group(2)))
    first = next((ln.strip() for ln in res.output.splitlines() if ln.strip()), f"exit {res.returncode}")
    if any(ln.startswith(HELPER_PREFIX) for ln in res.output.splitlines()):   # not "bash: /usr/.../HELPER: No such"
        return Dropped(node, True, False, first)
    return Dropped(node, False, False, first)


def drop_caches(inventory: Inventory, *, deadline_s: float = DEADLINE_S) -> list[Dropped]:
    """Run the helper on every SSH node at once, each within `deadline_s` (the nodes in parallel: the whole drop
    ends within it too); one outcome per node, none raised (a node that does not answer in time is reported, the
    restart goes on: a missed drop is what preflight's memory check then judges)."""

    def one(node: Node) -> Dropped:
        if node.ssh.connection == "local":
            return Dropped(node.name, False, False, EMBEDDED)
        return parse_drop(node.name, connector_for(inventory, node).run(drop_argv(node), timeout=deadline_s))
    out: list[Dropped] = []
    for o in fan_out(inventory.nodes, one):
        if o.error is not None and not isinstance(o.error, Exception):
            raise o.error                   # an interrupt (a signal): the caller's to handle
        if o.error is not None or o.value is None:
            out.append(Dropped(o.item.name, False, False, f"could not run the helper: {o.error}"))
        else:
            out.append(o.value)
    return out


def summary(results: list[Dropped]) -> str:
    """One log line for the watcher: what was dropped where, and where it was not granted (with how to grant)."""
    done = [d for d in results if d.done]
    failed = [d for d in results if d.granted and not d.done]
    refused = [d for d in results if not d.granted and d.detail != EMBEDDED]
    parts = [f"page cache left alone ({EMBEDDED})"] if any(d.detail == EMBEDDED for d in results) else []
    if done:
        parts.append("dropped the page cache before the restart (granted by `sparkctl prepare`): "
                     + ", ".join(d.line() for d in done))
    if failed:
        parts.append("could not drop the page cache: " + "; ".join(d.line() for d in failed))
    if refused:
        parts.append("page cache not dropped on " + ", ".join(d.node for d in refused) + ": not granted ("
                     + "; ".join(f"{d.node}: {d.detail}" for d in refused) + "); `prepare_drop_caches: true` in the "
                     "inventory and `sparkctl prepare --tags drop-caches` grant it")
    return "; ".join(parts)
