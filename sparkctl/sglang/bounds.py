"""The bounds of every HTTP exchange with an SGLang server: timeouts, deadlines and size caps.

The peer is untrusted (``sparkctl bench --endpoint`` measures any URL), so no exchange may wait, read or
hold more than these say:

* ``connect_s``: TCP (and TLS) connect;
* ``read_s``: the longest silence while any byte is awaited (response headers, a body, the next stream bytes);
* ``idle_s``: the longest a stream may go without a data event (comments and keep-alive bytes do not count);
* ``request_s``: the deadline of one whole request (connect to last byte), enforced inside every socket read
  and write, so a server that trickles a byte a second, in the headers or in the body, is cut there;
* the run's deadline (``RunGuard``), shared by every client of a bench run: a request never outlives it;
* ``max_body_bytes`` (a JSON body; an announced Content-Length above it is refused before a byte is read),
  ``max_event_bytes`` (one server-sent event or line) and the event count (``events_per_token`` per requested
  token plus ``events_extra``).

The defaults fit an 800-token decode on a DGX Spark pair at the seed card's slowest measured rate: 800 tokens at
14.7 tok/s is 54 s of generation, which a non-streamed request (G6, ``/generate``) spends in silence before its
body; with the seed's cold first request (39.6 s) on top that is ~94 s, so ``read_s`` = ``idle_s`` = 120 s.
``request_s`` = 600 s covers that request about six times over (and a 64k-token prefill). A default bench
(cold + 2 warm-up + 2 x 5 decode + 3 acceptance + TTFT + c1/c2 + 20 G6 per arm, two arms, ~80 requests of 800
tokens, ~75 min at 14.7 tok/s) fits the 4 h run deadline with room for slower prompts and the TTFT sizes.

A ``RunGuard`` is also how a run is stopped from outside: ``trip(error)`` (a rank died, an endpoint broke the
protocol) makes every read of every client of the run give up within ``SLICE_S`` and every later request
raise that error at once.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import httpcore
import httpx

from sparkctl.jsontypes import JSONObject
from sparkctl.tls import tls_context

__all__ = ["Limits", "RunGuard", "DeadlineTransport", "SLICE_S"]

SLICE_S = 0.25      # socket reads wait at most this long at a time, so a tripped guard stops them promptly
MiB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """Timeouts (seconds) and caps (bytes, events) of every request; see the module docstring for the defaults."""

    connect_s: float = 10.0
    read_s: float = 120.0
    idle_s: float = 120.0
    request_s: float = 600.0
    max_body_bytes: int = 8 * MiB
    max_event_bytes: int = 1 * MiB
    events_per_token: int = 4
    events_extra: int = 64

    def __post_init__(self) -> None:
        for name in ("connect_s", "read_s", "idle_s", "request_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive finite number of seconds, not {v!r}")
        for name in ("max_body_bytes", "max_event_bytes", "events_per_token", "events_extra"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer")

    @classmethod
    def from_timeout(cls, timeout: float | httpx.Timeout | Limits | None) -> Limits:
        """The callers' old ``timeout=`` argument: a number is the read timeout (connect at most 10 s) and the
        request deadline four of them (a 5 s health probe ends within 20 s, whatever the server trickles)."""
        if isinstance(timeout, Limits):
            return timeout
        if timeout is None:
            return cls()
        if isinstance(timeout, httpx.Timeout):
            t = timeout.read or cls.read_s
            return cls(connect_s=timeout.connect or cls.connect_s, read_s=t, idle_s=t, request_s=4 * t)
        t = float(timeout)
        return cls(connect_s=min(cls.connect_s, t), read_s=t, idle_s=t, request_s=4 * t)

    def max_events(self, max_tokens: int | None) -> int:
        """Most events a stream asked for ``max_tokens`` may send (one per token is what SGLang does)."""
        return self.events_per_token * max(1, max_tokens or 1) + self.events_extra

    def as_dict(self) -> JSONObject:
        return asdict(self)


class RunGuard:
    """A whole run's deadline and its first fatal error, shared by the run's clients (thread-safe).

    Example::

        guard = RunGuard(run_s=4 * 3600)
        client = SGLangClient(url, limits=Limits(), guard=guard)
        ...; guard.trip(BenchError("rank 1 died"))      # from a watcher thread: every client stops
    """

    def __init__(self, run_s: float | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        if run_s is not None and not (math.isfinite(run_s) and run_s > 0):
            raise ValueError(f"run deadline must be a positive finite number of seconds, not {run_s!r}")
        self.run_s = run_s
        self._clock = clock
        self.started = clock()
        self.deadline = None if run_s is None else self.started + run_s
        self._lock = threading.Lock()
        self.error: Exception | None = None

    def trip(self, error: Exception) -> bool:
        """Record the run's fatal error (the first one wins); True when this call recorded it."""
        with self._lock:
            if self.error is None:
                self.error = error
                return True
            return False

    @property
    def tripped(self) -> bool:
        return self.error is not None

    def elapsed(self) -> float:
        return self._clock() - self.started


class _Clock:
    """The per-client deadline box the transport's streams consult (a client serves one request at a time)."""

    def __init__(self, guard: RunGuard | None) -> None:
        self.guard = guard
        self.request_deadline: float | None = None

    def remaining(self) -> float | None:
        ends = [d for d in (self.request_deadline, self.guard.deadline if self.guard else None) if d is not None]
        return None if not ends else min(ends) - time.monotonic()

    def check(self) -> None:
        if self.guard is not None and self.guard.tripped:
            raise httpcore.ReadTimeout("stopped: the run was stopped")
        left = self.remaining()
        if left is not None and left <= 0:
            raise httpcore.ReadTimeout("deadline passed")


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, clock: _Clock) -> None:
        self._inner = inner
        self._clock = clock

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        waited = 0.0
        while True:
            self._clock.check()
            left = self._clock.remaining()
            step = min(x for x in (SLICE_S, left, None if timeout is None else timeout - waited) if x is not None)
            t0 = time.monotonic()
            try:
                return self._inner.read(max_bytes, max(step, 0.001))
            except httpcore.ReadTimeout:
                waited += time.monotonic() - t0
                if timeout is not None and waited >= timeout:
                    raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._clock.check()
        left = self._clock.remaining()
        self._inner.write(buffer, timeout if left is None else max(0.001, min(left, timeout or left)))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, timeout), self._clock)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, clock: _Clock) -> None:
        self._inner = httpcore.SyncBackend()
        self._clock = clock

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        self._clock.check()
        left = self._clock.remaining()
        t = timeout if left is None else max(0.001, min(left, timeout or left))
        return _Stream(self._inner.connect_tcp(host, port, t, local_address, socket_options), self._clock)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(path, timeout, socket_options), self._clock)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class DeadlineTransport(httpx.HTTPTransport):
    """httpx's own HTTP/1.1 transport over sockets whose every read and write stops at the request's deadline, the
    run's deadline, or when the run's guard trips. ``clock.request_deadline`` is set by the client per request."""

    def __init__(self, guard: RunGuard | None = None) -> None:
        super().__init__(verify=tls_context(), trust_env=False)
        self.clock = _Clock(guard)
        # httpx builds its pool without a network backend parameter; the pool is the documented httpcore one.
        self._pool = httpcore.ConnectionPool(ssl_context=tls_context(),
                                             network_backend=_Backend(self.clock), max_connections=4,
                                             max_keepalive_connections=2, keepalive_expiry=5.0)
