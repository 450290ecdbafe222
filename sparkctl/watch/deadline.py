"""A total deadline around a watcher's node action (the page-cache drop, the metrics' node reads).

The connectors bound each command (`timeout=`), but not everything around it (an SSH connect, a banner that never
comes, several reads one after another): `within` runs the action on a daemon thread and waits for it at most
`deadline_s`. Past that the watcher goes on (the action's own timeouts end the thread later; a `gate` lock keeps a
second one from starting while the first still runs). Example::

    done, value = within(30.0, lambda: drop_caches(inventory))     # (False, None) when it did not finish in time
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

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
