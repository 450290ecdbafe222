"""Reading `docker logs --timestamps` incrementally: timestamps, entries, the follow cursor.

The runtime hands out a log as a byte offset into the text given out so far; following asks only for lines
newer than the last timestamp seen (minus a short look-back whose overlap is dropped), so no line is lost or
duplicated when several lines share one timestamp.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

LOG_LOOKBACK_NS = 2_000_000_000               # overlap re-read when following


def _ts_ns(ts: str) -> int:
    """RFC 3339 with nanoseconds (``2026-01-01T10:00:00.123456789Z``) -> ns since the epoch."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)", ts)
    if not m:
        raise ValueError(f"not a docker log timestamp: {ts!r}")
    tz = "+00:00" if m.group(3) == "Z" else m.group(3)
    base = datetime.fromisoformat(m.group(1) + tz)
    return int(base.timestamp()) * 1_000_000_000 + int((m.group(2) or "0").ljust(9, "0"))


def _since_arg(ns: int) -> str:
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


@dataclass(frozen=True)
class LogEntry:
    ts_ns: int
    text: str            # the line, ending in "\n"


def split_line(line: str) -> tuple[int | None, str]:
    """One line of ``docker logs --timestamps`` (without its newline) -> (its timestamp in ns, or None when it has
    none: the rest of a line Docker split, which joins the entry before), its text."""
    head, _, rest = line.partition(" ")
    try:
        return _ts_ns(head), rest
    except ValueError:
        return None, line


def parse_log_lines(output: str) -> list[LogEntry]:
    """Split ``docker logs --timestamps`` output into entries; a line without a timestamp joins the previous one
    (and is dropped when there is none, as is an empty one)."""
    entries: list[LogEntry] = []
    for ln in output.split("\n"):
        ts, text = split_line(ln)
        if ts is not None:
            entries.append(LogEntry(ts, text + "\n"))
        elif entries and ln:
            last = entries[-1]
            entries[-1] = LogEntry(last.ts_ns, last.text + ln + "\n")
    return entries


@dataclass
class _Cursor:
    offset: int
    last_ns: int
    window: list[LogEntry] = field(default_factory=list)   # entries handed out with ts >= last_ns - lookback
