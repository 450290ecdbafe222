"""The watcher's webhook events, sent off the supervisor's thread and never under the cluster lock.

The supervisor queues an event (`Outbox.put`) where it happens, under the lock or not, and goes on: one sender
thread posts them one after another through `Notifier.send` (its own total deadline, watch/notify.py). A hook that
hangs or trickles therefore delays only the events behind it, never a check, a restart, or a user's command (the
lock is released as soon as the action is done). The queue is bounded (`MAX_EVENTS`): when the hook falls that far
behind, the oldest event is dropped, and the drop is said once per backlog. At the watcher's end, what is queued
gets `close(deadline_s)` in total, then the rest is left (the thread is a daemon: it never keeps the process).
Example::

    box = Outbox(Notifier(url), reporter)
    box.put({"event": "restart", ...}, secret_env=("SPARKCTL_API_KEY",))
    box.close(deadline_s=10)
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from sparkctl.jsontypes import JSONObject

if TYPE_CHECKING:
    from sparkctl.deploy.progress import Reporter
    from sparkctl.watch.notify import Notifier

MAX_EVENTS = 32
CLOSE_DEADLINE_S = 5.0


class Outbox:
    def __init__(self, notifier: Notifier, reporter: Reporter, *, max_events: int = MAX_EVENTS) -> None:
        self.notifier, self.reporter, self.max_events = notifier, reporter, max_events
        self._queue: deque[tuple[JSONObject, tuple[str, ...]]] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._busy = False
        self.sent = 0
        self.dropped = 0
        self._said_drop = False
        self._thread = threading.Thread(target=self._loop, name="sparkctl-watch-notify", daemon=True)
        self._thread.start()

    def put(self, event: JSONObject, *, secret_env: tuple[str, ...] = ()) -> None:
        """Queue `event`; returns at once (never waits on the hook)."""
        with self._cv:
            if self._closed:
                return
            if len(self._queue) >= self.max_events:
                self._queue.popleft()
                self.dropped += 1
                if not self._said_drop:
                    self._said_drop = True
                    self.reporter.event(f"notify: the webhook is {self.max_events} events behind: the oldest are "
                                        f"dropped until it answers again")
            self._queue.append((event, secret_env))
            self._cv.notify()

    def pending(self) -> int:
        with self._cv:
            return len(self._queue) + (1 if self._busy else 0)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                event, secret_env = self._queue.popleft()
                self._busy = True
            try:
                self.notifier.send(event, self.reporter, secret_env=secret_env)
            except Exception as exc:  # noqa: BLE001 - a webhook never stops the supervisor
                self.reporter.event(f"notify: failed ({type(exc).__name__}); the watcher goes on")
            with self._cv:
                self._busy = False
                self.sent += 1
                if not self._queue:
                    self._said_drop = False
                self._cv.notify_all()

    def close(self, deadline_s: float = CLOSE_DEADLINE_S) -> None:
        """Send what is queued within `deadline_s` in total; what is left then is said and dropped."""
        end = time.monotonic() + deadline_s
        with self._cv:
            if self._closed:
                return
            while (self._queue or self._busy) and time.monotonic() < end:
                self._cv.wait(timeout=max(0.0, min(0.2, end - time.monotonic())))
            left = len(self._queue) + (1 if self._busy else 0)
            self._queue.clear()
            self._closed = True
            self._cv.notify_all()
        if left:
            self.reporter.event(f"notify: {left} event(s) not sent within {deadline_s:g}s of stopping: dropped")
