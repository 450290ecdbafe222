"""The one fan-out helper for parallel node work: run a call on every item at once, keep every outcome.

Every parallel call over nodes goes through it: deploy/ (preflight, observe, stop, secret sweep, the image survey),
images/ (the image-ID survey of `ensure_same_image`) and nodes/ (`results.run_all`). It sits in nodes/, the lowest
layer that needs it, and imports nothing of sparkctl.

`pool.map` re-raises the first error and drops what the other nodes did (a stop that failed on one node hid
that the other node stopped fine). `fan_out` waits for all of them and returns one `Outcome` per item, in the
items' order; `raise_first` re-raises the first error once every node's outcome is known.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


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

    def one(item: T) -> Outcome[T, R]:
        try:
            return Outcome(item, fn(item))
        except BaseException as exc:  # noqa: BLE001 - kept, and re-raised by the caller (raise_first)
            return Outcome(item, None, exc)
    if len(items) == 1:
        return [one(items[0])]
    with ThreadPoolExecutor(max_workers=max_workers or len(items), thread_name_prefix="sparkctl-fan-out") as pool:
        return list(pool.map(one, items))


def raise_first(outcomes: list[Outcome[T, R]]) -> list[R]:
    """Every value, or the first error (re-raised after every node finished)."""
    for o in outcomes:
        if o.error is not None:
            raise o.error
    return [o.value for o in outcomes]  # type: ignore[misc]
