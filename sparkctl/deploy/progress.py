"""Progress on stderr: stage, node, milestone, elapsed time. stdout stays for data.

Without a terminal (CI, a pipe, a log file): one timestamped line per event,
``[  12.3s] boot       [spark-b] rank 1 started (pid 4242)``. On a terminal the same lines scroll above a live
display (rich) of the current stage, its elapsed time and the last event, redrawn while a long wait (boot,
warm-up, bench, image copy) has nothing new to say. ``sparkctl -q`` silences both.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, TextIO

from sparkctl.untrusted import GuardedStream, clean, raw_stream

if TYPE_CHECKING:
    from rich.spinner import Spinner

_quiet = False                     # `sparkctl -q`: every Reporter of this process is silent
_live: list[_LiveLine] = []      # live displays to stop before the process returns to the shell


def set_quiet(quiet: bool) -> None:
    global _quiet
    _quiet = quiet


def close_live() -> None:
    """Stop every live display (the CLI calls this before it exits, so the terminal gets its cursor back)."""
    while _live:
        _live.pop().stop()


class _LiveLine:
    """The live part on a terminal: `boot  12.3s  [spark-a] rank 0: KV cache allocated` with a spinner."""

    def __init__(self, stream: TextIO, t0: float) -> None:
        from rich.console import Console
        from rich.live import Live

        self.t0 = t0
        self.stage = "-"
        self.stage_t0 = t0
        self.last = ""
        self.lock = threading.Lock()

        # rich draws the display with its own escape sequences, so it writes past the terminal guard; what it is
        # given to show passes through `clean` instead (`line`).
        self.console = Console(file=raw_stream(stream), force_terminal=True, highlight=False, soft_wrap=True)
        # What else the command prints to the same terminal goes above the display, not through it; a piped
        # stdout is left alone (data never goes to the terminal's stream).
        redirect_out, redirect_err = sys.stdout.isatty(), stream is sys.stderr
        self.live = Live(self, console=self.console, refresh_per_second=4, transient=True,
                         redirect_stdout=redirect_out, redirect_stderr=redirect_err)
        self.live.start()
        # rich's redirection replaced sys.stdout/sys.stderr with its own proxies: guarded again (Live.stop puts
        # back the streams it found).
        if redirect_out:
            sys.stdout = GuardedStream(sys.stdout)
        if redirect_err:
            sys.stderr = GuardedStream(sys.stderr)

    def __rich__(self) -> Spinner:
        from rich.spinner import Spinner
        now = time.monotonic()
        with self.lock:
            text = (f"{self.stage:<10} {now - self.stage_t0:6.1f}s in stage   {now - self.t0:6.1f}s total   "
                    f"{self.last}")
        return Spinner("dots", text=text)

    def line(self, text: str, stage: str, last: str) -> None:
        text, stage, last = clean(text), clean(stage), clean(last)
        with self.lock:
            if stage != self.stage:
                self.stage, self.stage_t0 = stage, time.monotonic()
            self.last = last
        self.console.print(text, markup=False, highlight=False)

    def stop(self) -> None:
        self.live.stop()


class Reporter:
    """Prints `[  12.3s] boot       [spark-b] rank 1 started (pid 4242)` lines. Silent when quiet (or `-q`).

    `live`: None picks the live display when the stream is a terminal; True/False forces it."""

    def __init__(self, stream: TextIO | None = None, quiet: bool = False, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.stage_name = "-"
        self._want_live = live
        self._live: _LiveLine | None = None

    def _is_live(self) -> bool:
        if self._want_live is not None:
            return self._want_live
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def stage(self, name: str, message: str = "") -> None:
        self.stage_name = name
        self.event(message or "started")

    def event(self, message: str, node: str | None = None) -> None:
        if self.quiet or _quiet:
            return
        where = f"[{node}] " if node else ""
        text = f"[{time.monotonic() - self.t0:7.1f}s] {self.stage_name:<10} {where}{message}"
        if self._is_live():
            if self._live is None:
                self._live = _LiveLine(self.stream, self.t0)
                _live.append(self._live)
            self._live.line(text, self.stage_name, where + message)
            return
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Stop this reporter's live display (if any); later events start a new one."""
        if self._live is not None:
            self._live.stop()
            if self._live in _live:
                _live.remove(self._live)
            self._live = None
