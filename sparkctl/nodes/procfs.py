"""Facts about local processes from /proc: state and kernel start time, command line, where stdout goes.

A PID alone is never trusted: the kernel start time (field 22 of /proc/PID/stat) tells a recycled PID from the
process sparkctl recorded. Used by the process runtime (its engines) and the ledger (its controllers).
"""
from __future__ import annotations

import os
from pathlib import Path


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, kernel start time) of a process from one read of /proc/PID/stat, or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()   # after the comm field: state is field 3, starttime field 22
    return fields[0], int(fields[19])


def start_ticks(pid: int) -> int | None:
    stat = proc_stat(pid)
    return stat[1] if stat else None


def running(pid: int, ticks: int | None) -> bool:
    """The process `pid` runs and is the one that started at `ticks` (a zombie is dead; None ticks: pid only)."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] != "Z" and (ticks is None or stat[1] == ticks)


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")[:-1]
    except OSError:
        return []


def runs_sparkctl(pid: int) -> bool:
    """The process's command line runs sparkctl (its engine, the emulator, or the log pipe in front of them)."""
    return any("sparkctl" in a for a in cmdline(pid))


def pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def stdout_target(pid: int) -> str | None:
    """Where the process's stdout (fd 1) points (a log file path), or None (gone, not ours to read)."""
    try:
        return os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None
