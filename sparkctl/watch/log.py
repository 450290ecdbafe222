"""The watcher's log: every progress line on stderr and, timestamped, in the state directory's ``watch.log``.

The file is the state directory's (0600, opened without following a planted link: statefiles.py), each line passed
through the one sanitiser (`sparkctl.untrusted.clean_line`: controls escaped, URL credentials masked), and kept
bounded: past `MAX_BYTES` it moves to ``watch.log.1`` (one generation kept) and a new one starts. `-q` silences
stderr only: a supervisor's record of what it did is never switched off.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TextIO

from sparkctl.deploy import progress
from sparkctl.errors import SparkctlError
from sparkctl.state.ledger import now_iso
from sparkctl.statefiles import open_state_file, private_dir, replace_durably
from sparkctl.untrusted import clean_line

MAX_BYTES = 8 * 1024 * 1024


class WatchLog:
    """Appends timestamped lines to `path`; a failure to write is swallowed (a full state directory must not stop
    the supervisor: it says so on stderr through its state file's own error)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        private_dir(path.parent)

    def line(self, text: str) -> None:
        try:
            if self.path.exists() and self.path.stat().st_size > MAX_BYTES:
                replace_durably(self.path, self.path.with_name(self.path.name + ".1"))
            fd = open_state_file(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as fh:
                fh.write(f"{now_iso()} {clean_line(text)}\n")
        except (OSError, SparkctlError):
            pass


class WatchReporter(progress.Reporter):
    """The lifecycle's Reporter (the same `[  12.3s] stage [node] message` lines), each line also in `log`."""

    def __init__(self, log: WatchLog, stream: TextIO | None = None) -> None:
        super().__init__(stream, live=False)
        self.log = log

    def event(self, message: str, node: str | None = None) -> None:
        where = f"[{node}] " if node else ""
        text = f"[{time.monotonic() - self.t0:7.1f}s] {self.stage_name:<10} {where}{message}"
        self.log.line(text)
        if not (self.quiet or progress._quiet):      # stderr bounded like the file: one cleaned line each
            self.stream.write(clean_line(text) + "\n")
            self.stream.flush()
