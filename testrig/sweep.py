"""The secret sweep's searches: which files under a directory, and which processes' command lines or environments
on this machine, hold any of some secret values (the test's own process excepted: it set them for the commands)."""
from __future__ import annotations

import os
from pathlib import Path

from sparkctl.nodes import procfs


def files_holding(root: Path, values: tuple[str, ...]) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            hits += [f"{path}: {v[:8]}..." for v in values if v.encode() in data]
    return hits


def processes_holding(values: tuple[str, ...]) -> list[str]:
    hits = []
    for pid in procfs.pids():
        if pid == os.getpid():
            continue                       # the test itself holds them (set in os.environ for the commands)
        for what in ("cmdline", "environ"):
            try:
                data = Path(f"/proc/{pid}/{what}").read_bytes()
            except OSError:
                continue                   # gone meanwhile
            hits += [f"pid {pid} {what}: {procfs.cmdline(pid)[:3]}" for v in values if v.encode() in data]
    return hits
