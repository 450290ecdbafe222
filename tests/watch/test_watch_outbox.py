"""The watcher's webhook events go through a bounded outbox on a thread of their own: a hook that trickles one
byte at a time (a real server on loopback) never holds the caller, the queue never grows past its bound, and the
watcher's end waits for it at most its deadline."""
from __future__ import annotations

import io
import socket
import threading
import time

from sparkctl.deploy.progress import Reporter
from sparkctl.watch.notify import Notifier
from sparkctl.watch.outbox import Outbox
from testrig.testenv import RawServer


class Trickle:
    """Reads each request, then answers one byte a second, forever (until closed)."""

    def __init__(self) -> None:
        self.requests = 0
        self.stop = threading.Event()
        self.server = RawServer(self._one)
        self.url = self.server.url()

    def _one(self, conn: socket.socket) -> None:
        conn.recv(65536)
        self.requests += 1
        try:
            for b in b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 1000000:
                if self.stop.wait(1.0):
                    break
                conn.sendall(bytes([b]))
        except OSError:
            pass
        conn.close()

    def close(self) -> None:
        self.stop.set()
        self.server.close()


def test_a_trickling_hook_never_holds_the_caller_and_the_queue_stays_bounded():
    hook = Trickle()
    out = io.StringIO()
    box = Outbox(Notifier(hook.url, timeout_s=30), Reporter(out, live=False), max_events=3)
    try:
        t0 = time.monotonic()
        for i in range(10):
            box.put({"event": "restart", "n": i})
        assert time.monotonic() - t0 < 0.5                     # put never waits on the hook
        deadline = time.monotonic() + 10
        while hook.requests < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hook.requests == 1                              # one send at a time: the first is still trickling
        assert box.pending() <= 3 + 1 and box.dropped >= 6
        assert out.getvalue().count("events behind") == 1      # the drop said once
        t0 = time.monotonic()
        box.close(deadline_s=1.0)
        assert time.monotonic() - t0 < 2.0
        assert "not sent within 1s of stopping: dropped" in out.getvalue()
        box.put({"event": "late"})                             # after close: ignored, never a wait
        assert box.pending() <= 1
    finally:
        hook.close()
