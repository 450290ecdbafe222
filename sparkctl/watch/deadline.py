"""A total deadline around a watcher's node action (the page-cache drop, the metrics' node reads): `within`, and
`NodeActions`, the watcher's two node actions through it.

The connectors bound each command (`timeout=`), but not everything around it (an SSH connect, a banner that never
comes, several reads one after another): `within` runs the action on a daemon thread and waits for it at most
`deadline_s`. Past that the watcher goes on (the action's own timeouts end the thread later; a `gate` lock keeps a
second one from starting while the first still runs). Example::

    done, value = within(30.0, lambda: drop_caches(inventory))     # (False, None) when it did not finish in time
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from sparkctl.watch.caches import drop_caches, summary

if TYPE_CHECKING:
    from sparkctl.config.inventory import Inventory
    from sparkctl.watch.metrics import WatchMetrics

T = TypeVar("T")


class _Outcome(Generic[T]):
    def __init__(self) -> None:
        self.value: T | None = None
        self.error: BaseException | None = None


def within(deadline_s: float, action: Callable[[], T], *, gate: threading.Lock | None = None) -> tuple[bool, T | None]:
    """(True, its value) when `action` finished within `deadline_s`; (False, None) when it did not, or when `gate`
    (the same action's lock) is still held by an earlier call that has not finished. An exception of the action
    is raised here, as if it had been called directly."""
    out: _Outcome[T] = _Outcome()
    if gate is not None and not gate.acquire(blocking=False):
        return False, None

    def run() -> None:
        try:
            out.value = action()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            out.error = exc
        finally:
            if gate is not None:
                gate.release()
    t = threading.Thread(target=run, name="sparkctl-watch-node-action", daemon=True)
    t.start()
    t.join(deadline_s)
    if t.is_alive():
        return False, None
    if out.error is not None:
        raise out.error
    return True, out.value


class NodeActions:
    """The watcher's node actions, each within `node_deadline_s` in total and one of each kind at a time: the
    page-cache drop before a restart (watch/caches.py) and the metrics' node reads of a check. `say` gets what
    the watcher says about them (a node that hangs is said once while it lasts)."""

    def __init__(self, inventory: Inventory, say: Callable[[str], None], *, node_deadline_s: float) -> None:
        self.inventory, self.say, self.limit = inventory, say, node_deadline_s
        self._drop_gate, self._read_gate = threading.Lock(), threading.Lock()
        self._said_slow = False

    def drop_caches(self) -> None:
        """Drop the page cache where `prepare` granted it; say what was done, where not, or that it ran late."""
        limit = self.limit
        done, results = within(limit, lambda: drop_caches(self.inventory, deadline_s=limit), gate=self._drop_gate)
        line = summary(results) if done and results is not None else (
            f"page cache not dropped: the nodes did not answer within {limit:g}s (or an earlier drop still runs); "
            f"the restart goes on")
        if line:
            self.say(line)

    def read(self, metrics: WatchMetrics | None) -> None:
        """The metrics' node samples (nothing without metrics)."""
        if metrics is None:
            return
        limit = self.limit
        done, _ = within(limit, lambda: metrics.nodes(self.inventory, deadline_s=limit), gate=self._read_gate)
        if not done and not self._said_slow:
            self.say(f"node samples not read within {limit:g}s (a node slow or not answering); the checks go on")
        self._said_slow = not done
