"""The one fan-out helper for parallel node work: run a call on every item at once, keep every outcome.

Every parallel call over nodes goes through it: deploy/ (preflight, observe, stop, secret sweep, the image survey),
images/ (the image-ID survey of `ensure_same_image`) and nodes/ (`run_all`). It sits in nodes/, the lowest
layer that needs it, and imports only sparkctl's errors.

`run_all` is the by-name view of the same (like fabric's `GroupResult`): node name -> value or exception, whose
failures raise one `GroupError` naming every failed node.

`pool.map` re-raises the first error and drops what the other nodes did (a stop that failed on one node hid
that the other node stopped fine). `fan_out` waits for all of them and returns one `Outcome` per item, in the
items' order; `raise_first` re-raises the first error once every node's outcome is known.

Signals reach the main thread only. When one interrupts the main thread while it waits here (the CLI's handler
raises a KeyboardInterrupt subclass: Ctrl-C, SIGTERM, SIGHUP), the same interrupt is raised inside every worker
still running its call (CPython's per-thread asynchronous exception: it lands at the worker's next Python
instruction, e.g. when a poll's sleep or a bounded read returns), so each worker stops and cleans up what it
started through its own error path, at once, instead of finishing minutes of boot first; the main thread waits
for those cleanups, then re-raises. A second signal during that wait exits at once (sparkctl.cli.signals).
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from sparkctl.errors import MissingExtraError, NodeError

T = TypeVar("T")
R = TypeVar("R")
N = TypeVar("N")      # what `run_all` runs on: an inventory Node, anything with `.name`, or a plain name


@dataclass(frozen=True)
class Outcome(Generic[T, R]):
    item: T
    value: R | None = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def fan_out(items: Iterable[T], fn: Callable[[T], R], *, max_workers: int | None = None) -> list[Outcome[T, R]]:
    """`fn(item)` for every item at once (one thread each: nodes are few, each call waits on SSH or a process);
    every item's value or error, in order. Errors of every kind are caught (KeyboardInterrupt included: the
    caller decides after seeing every node). ``max_workers`` bounds the threads (default: one per item)."""
    items = list(items)
    if not items:
        return []

    running: dict[int, bool] = {}          # worker thread ident -> inside `fn` (may take an interrupt)
    lock = threading.Lock()

    def one(item: T) -> Outcome[T, R]:
        me = threading.get_ident()
        try:
            with lock:
                running[me] = True
            try:
                return Outcome(item, fn(item))
            finally:
                with lock:
                    running[me] = False
        except BaseException as exc:  # noqa: BLE001 - kept, and re-raised by the caller (raise_first)
            return Outcome(item, None, exc)
    if len(items) == 1:
        return _no_missing_extra([one(items[0])])
    with ThreadPoolExecutor(max_workers=max_workers or len(items), thread_name_prefix="sparkctl-fan-out") as pool:
        futures = [pool.submit(one, item) for item in items]
        try:
            return _no_missing_extra([f.result() for f in futures])
        except KeyboardInterrupt as exc:
            with lock:
                for ident, inside in running.items():
                    if inside:
                        _raise_in(ident, exc)
            for f in futures:       # each worker's own cleanup; a second signal exits at once (cli.signals)
                f.exception()
            raise


def _no_missing_extra(outcomes: list[Outcome[T, R]]) -> list[Outcome[T, R]]:
    """The outcomes, unless a call failed for want of an optional extra (MissingExtraError): that is this
    installation's, not a node's, so it is raised (after every call finished) rather than kept as one node's failure
    that a caller tolerating unreachable nodes would pass over ("could not look ... once it answers")."""
    for o in outcomes:
        if isinstance(o.error, MissingExtraError):
            raise o.error
    return outcomes


def _raise_in(ident: int, exc: KeyboardInterrupt) -> None:
    """Raise (a copy of) `exc` in thread `ident` at its next Python instruction. The exception type is made with
    no-argument construction (what the interpreter does), carrying `exc`'s arguments and attributes."""
    base = type(exc)
    attrs = dict(vars(exc))
    args = exc.args

    def __init__(self: BaseException) -> None:
        BaseException.__init__(self, *args)
        self.__dict__.update(attrs)
    kind = type(base.__name__, (base,), {"__init__": __init__, "__module__": base.__module__})
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(kind))


def raise_first(outcomes: list[Outcome[T, R]]) -> list[R]:
    """Every value, or the first error (re-raised after every node finished)."""
    for o in outcomes:
        if o.error is not None:
            raise o.error
    return [o.value for o in outcomes]  # type: ignore[misc]


def beside(main: Callable[[], R], side: Callable[[], object]) -> R:
    """`main()`'s value, with `side()` run at the same time on another thread (both run to the end; the first
    error of the two is raised, `main`'s first): two independent reads of one node as one round trip."""
    out = fan_out([main, side], lambda call: call())
    raise_first(out)
    return out[0].value  # type: ignore[return-value]


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


class GroupError(NodeError, Generic[T]):
    """One or more nodes failed in `run_all`; ``result`` keeps every node's outcome."""

    def __init__(self, result: GroupResult[T]) -> None:
        failed = result.failed
        lines = []
        for name, exc in failed.items():
            text = exc.render() if hasattr(exc, "render") else f"{type(exc).__name__}: {exc}"
            lines.append(f"[{name}] {text}")
        ok = sorted(result.succeeded)
        super().__init__(f"failed on {len(failed)} of {len(result)} node(s): {', '.join(sorted(failed))}"
                         + (f" (ok: {', '.join(ok)})" if ok else ""), evidence="\n".join(lines))
        self.result = result


def run_all(nodes: Iterable[N], fn: Callable[[N], T], *, max_workers: int | None = None) -> GroupResult[T]:
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
