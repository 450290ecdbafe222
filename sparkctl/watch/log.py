"""The watcher's log: every progress line on stderr and, timestamped, in the state directory's ``watch.log``.

The file is the state directory's (0600, opened without following a planted link: state/files.py), each line passed
through the one sanitiser (`sparkctl.untrusted.clean_line`: controls escaped, URL credentials masked), and kept
bounded: past `MAX_BYTES` it moves to ``watch.log.1`` (one generation kept) and a new one starts.
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TextIO

from sparkctl.errors import SparkctlError
from sparkctl.state.files import open_state_file, private_dir
from sparkctl.state.ledger import now_iso
from sparkctl.untrusted import clean_line

MAX_BYTES = 8 * 1024 * 1024


class WatchLog(io.TextIOBase):
    """A text stream for the Reporter: writes go to `stream` as they are and, line by line, to `path`."""

    def __init__(self, path: Path, stream: TextIO) -> None:
        self.path = path
        self.stream = stream
        self._partial = ""
        private_dir(path.parent)

    def write(self, s: str) -> int:  # type: ignore[override]
        self.stream.write(s)
        self._partial += s
        *lines, self._partial = self._partial.split("\n")
        if lines:
            self._append("".join(f"{now_iso()} {clean_line(ln)}\n" for ln in lines))
        return len(s)

    def _append(self, text: str) -> None:
        try:
            if self.path.exists() and self.path.stat().st_size > MAX_BYTES:
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            fd = open_state_file(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as fh:
                fh.write(text)
        except (OSError, SparkctlError):
            pass      # the log is a convenience: a full state directory must not stop the supervisor

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True
