"""The watcher's file in a cluster's state directory (``watch.json``, 0600) and its exclusive lock (``watch.lock``).

`sparkctl watch` writes what it is and what it did (pid, since, desired state, last action, restarts, whether it
gave up); `sparkctl status` reads it back and checks the pid (with its kernel start time) to say whether the
watcher still runs. One watcher per cluster: the lock is a flock held for the watcher's whole life, so a second
watcher is refused (LockHeldError, exit 5) and a watcher killed with -9 frees it with its process. Example::

    with exclusive(ledger.root):            # LockHeldError when another watcher runs
        save_watch(ledger.root, WatchState(...))
"""
from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sparkctl.errors import LockHeldError
from sparkctl.jsontypes import JSONObject
from sparkctl.state.controller import controller_alive
from sparkctl.statefiles import open_state_file, private_dir, state_dir_error, write_json_atomic

WATCH_FILE = "watch.json"
WATCH_LOCK = "watch.lock"
WATCH_LOG = "watch.log"


class WatchState(BaseModel):
    """What a watcher says about itself (written on every change; read by `status`)."""

    model_config = ConfigDict(extra="ignore")

    pid: int = Field(description="The watcher's process id.")
    host: str = Field(description="Host the watcher runs on.")
    start_ticks: int | None = Field(default=None,
        description="Kernel start time of the pid (tells a recycled pid apart).")
    since: str = Field(description="When the watcher started (UTC, ISO 8601).")
    interval_s: float = Field(description="Seconds between two checks.")
    stopped: str | None = Field(default=None, description="When the watcher stopped cleanly; None while it runs.")
    desired: str = Field(default="down",
        description="What it keeps running: a deployment id, 'replicated:PROFILE' or 'down'.")
    healthy: bool | None = Field(default=None, description="The last check's verdict (None: nothing to check).")
    last_check: str | None = Field(default=None, description="When it last checked (UTC).")
    detail: str | None = Field(default=None, description="The last check's evidence.")
    last_action: str | None = Field(default=None, description="The last thing it did, in one line.")
    last_action_at: str | None = Field(default=None, description="When it did it (UTC).")
    restarts: int = Field(default=0, description="Restarts it attempted (successful or not).")
    failures: int = Field(default=0, description="Restarts that failed.")
    rollbacks: int = Field(default=0, description="Rollbacks it made after a crash loop.")
    gave_up: str | None = Field(default=None,
        description="Why it stopped acting (crash-loop limit); None while it acts.")
    flaps: int = Field(default=0,
        description="Restarts that served, then died within the crash-loop window (counted as failures).")
    refused: str | None = Field(default=None,
        description="Why the last restart was refused (it could not start exactly the recorded deployment: a "
                    "secret's variable missing, the inventory changed); None once a restart or a command succeeds.")
    detected_at: str | None = Field(default=None, description="When it last saw the desired state broken (UTC).")
    recovered_at: str | None = Field(default=None, description="When it last saw it serving again (UTC).")
    time_to_recover_s: float | None = Field(default=None, description="Seconds from that detection to serving again.")
    metrics: str | None = Field(default=None,
        description="Where its Prometheus metrics are served (http://addr:port/).")


def watch_path(root: Path) -> Path:
    return root / WATCH_FILE


def save_watch(root: Path, state: WatchState) -> None:
    """Atomic write, mode 0600 (sparkctl/statefiles.py)."""
    private_dir(root)
    write_json_atomic(watch_path(root), state.model_dump(mode="json"))


def load_watch(root: Path) -> WatchState | None:
    """The watcher's file, or None when there is none or it cannot be read as one (it is a report, not a record:
    a damaged one is shown as absent, and the next watcher rewrites it)."""
    try:
        with os.fdopen(open_state_file(watch_path(root), os.O_RDONLY), "rb") as fh:
            return WatchState.model_validate(json.loads(fh.read(1 << 20)))
    except (OSError, ValueError, ValidationError):
        return None


def watcher_running(state: WatchState) -> bool:
    """The watcher the file names still runs (same host: its pid with the same start time; another host: assumed)."""
    if state.stopped:
        return False
    return controller_alive({"pid": state.pid, "host": state.host, "start_ticks": state.start_ticks})


def watcher_view(root: Path) -> JSONObject | None:
    """For `status`: the file plus `running` (checked now), or None when no watcher ever ran on this cluster."""
    state = load_watch(root)
    if state is None:
        return None
    return {**state.model_dump(mode="json"), "running": watcher_running(state)}


@contextmanager
def exclusive(root: Path) -> Iterator[None]:
    """Hold the cluster's watcher lock for the block; LockHeldError (exit 5) naming the running watcher."""
    from filelock import FileLock, Timeout

    private_dir(root)
    lock = FileLock(str(root / WATCH_LOCK), mode=0o600)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        other = load_watch(root)
        who = (f"pid {other.pid} on {other.host} since {other.since}" if other and not other.stopped
               else "another process")
        raise LockHeldError(f"this cluster is already watched by {who}", where=str(root),
                            hint="one watcher per cluster: stop that one first (`kill PID`, or `systemctl [--user] "
                                 "stop sparkctl-watch-CLUSTER`), or read what it does with `sparkctl status`"
                            ) from None
    except OSError as exc:
        raise state_dir_error(root, exc) from None
    try:
        yield
    finally:
        lock.release()


def host() -> str:
    return socket.gethostname()
