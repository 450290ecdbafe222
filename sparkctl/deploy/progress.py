"""Progress lines on stderr: stage, node, milestone, elapsed time. stdout stays for data."""
from __future__ import annotations

import sys
import time
from typing import TextIO


class Reporter:
    """Prints `[  12.3s] boot       [spark-b] rank 1 started (pid 4242)` lines. Silent when quiet."""

    def __init__(self, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.stage_name = "-"

    def stage(self, name: str, message: str = "") -> None:
        self.stage_name = name
        self.event(message or "started")

    def event(self, message: str, node: str | None = None) -> None:
        if self.quiet:
            return
        where = f"[{node}] " if node else ""
        self.stream.write(f"[{time.monotonic() - self.t0:7.1f}s] {self.stage_name:<10} {where}{message}\n")
        self.stream.flush()
