"""An exception at any line: a trace function that raises it in the traced frame right before a chosen line event.

CPython delivers a signal handler's exception (the CLI's `Interrupted` for Ctrl-C, SIGTERM, SIGHUP) and one raised
in a thread by `PyThreadState_SetAsyncExc` (`nodes.fanout`, in each replica's thread of a parallel `up`) at a line
boundary of whatever runs. A `LineTrap` makes that landing point a parameter: it counts the line events of the
code it targets, in order (`trail`: "function:line"), and raises at event number `at`. A first pass with `at=None`
gives the trail; a test then picks the events of a window (say, from a fork to the line that records the child)
and runs the command once per event, asserting what must hold wherever the interrupt landed.
"""
from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

from sparkctl.errors import Interrupted


@dataclass(frozen=True)
class Target:
    """Code to trace: `match(code)` picks it; `lines` (first, last), when given, keeps only those lines of it."""
    match: Callable[[CodeType], bool]
    lines: tuple[int, int] | None = None

    @classmethod
    def code(cls, code: CodeType, lines: tuple[int, int] | None = None) -> Target:
        return cls(lambda c: c is code, lines)

    @classmethod
    def named(cls, name: str, file_suffix: str) -> Target:
        """A function by name in a file (a closure, whose code object a test cannot reach)."""
        return cls(lambda c: c.co_name == name and c.co_filename.endswith(file_suffix))


def sigint() -> BaseException:
    return Interrupted(signal.SIGINT, "SIGINT")


class LineTrap:
    """Counts the line events of `targets`; raises `make()` right before event number `at` (None: never), or, with
    `at` = ("function:line", n), right before that line's n-th event (0-based: robust to a loop that runs a
    different number of times from one run to the next). With an
    `anchor`, nothing counts before the first call of the anchor's code (so that the numbers do not depend on how
    much else, e.g. another `Popen`, ran before it)."""

    def __init__(self, targets: list[Target], at: int | tuple[str, int] | None = None,
                 make: Callable[[], BaseException] = sigint, anchor: Target | None = None):
        self.targets, self.at, self.make, self.anchor = targets, at, make, anchor
        self.seen, self.where = 0, ""
        self.counting = anchor is None
        self.trail: list[str] = []

    def _target(self, code: CodeType) -> Target | None:
        return next((t for t in self.targets if t.match(code)), None)

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call":
            return None
        if not self.counting and self.anchor is not None and self.anchor.match(frame.f_code):
            self.counting = True
        if not self.counting:
            return None
        target = self._target(frame.f_code)
        if target is None:
            return None

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "line" and (target.lines is None or target.lines[0] <= frame.f_lineno <= target.lines[1]):
                here = f"{frame.f_code.co_name}:{frame.f_lineno}"
                nth = self.trail.count(here) if isinstance(self.at, tuple) else 0
                self.trail.append(here)
                self.seen += 1
                if self.seen - 1 == self.at or self.at == (here, nth):
                    self.where = here
                    raise self.make()
            return local
        return local

    @contextmanager
    def armed(self) -> Iterator[LineTrap]:
        """Trace the current thread while the block runs (the previous tracer, e.g. coverage's, comes back)."""
        old = sys.gettrace()
        sys.settrace(self)
        try:
            yield self
        finally:
            sys.settrace(old)


def source_line(fn: Callable[..., Any], text: str, start: int = 0) -> int:
    """The number of the first line of `fn`'s source, from its `start`-th line on, that contains `text`."""
    import inspect
    lines, first = inspect.getsourcelines(fn)
    found = next((i for i, line in enumerate(lines) if i >= start and text in line), None)
    if found is None:       # the code changed under the test's anchor: say so (it was a bare StopIteration)
        raise AssertionError(f"no line of {fn.__qualname__} contains {text!r}: the test's anchor is stale, point it "
                             f"at the line it means")
    return first + found
