"""Who drives a deployment, and whether that process still lives (Terraform-style lock info, checked by pid).

A record in progress names its controller: pid, host and the pid's kernel start time. The controller is dead
when that pid is gone or has another start time (recycled). Another host's pid cannot be checked from here:
that controller counts as alive while it holds the cluster lock (`lock.holder` names it).
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from sparkctl.jsontypes import JSONObject
from sparkctl.nodes import procfs
from sparkctl.state.records import Controller


def this_controller(command: str, since: str) -> Controller:
    pid = os.getpid()
    return Controller(pid=pid, host=socket.gethostname(), start_ticks=procfs.start_ticks(pid), since=since,
                      command=command)


def controller_alive(c: Controller | JSONObject) -> bool:
    """False when the controller process is provably gone (same host, pid gone or recycled)."""
    data = c.model_dump() if isinstance(c, Controller) else c
    if data.get("host") != socket.gethostname():
        return True   # cannot see another host's processes: assume alive (the lock decides)
    return procfs.running(int(data["pid"]), data.get("start_ticks"))


def live_lock_holder(root: Path) -> JSONObject | None:
    """Who holds the cluster lock now (pid, host, command, since), or None when it is free.

    Read from `lock.holder` without taking the lock (a status must never make a starting `up` fail); a holder
    file left by a killed process names a dead pid and counts as free (the flock died with the process).
    """
    try:
        holder = json.loads((root / "lock.holder").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(holder, dict) or "pid" not in holder:
        return None
    return holder if controller_alive(holder) else None
