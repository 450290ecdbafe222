"""The webhook has one total deadline: hostile HTTP servers on loopback (they trickle, hang after accept, after the
request, after the headers, answer a huge body or header, redirect) cost at most that deadline, whatever they do,
and the line that reports them carries no credential of the URL. Generated over every behaviour x (byte delay,
deadline) with Hypothesis."""
from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkctl.deploy.progress import Reporter
from sparkctl.watch.notify import MAX_REPLY, Notifier, shown_url
from testrig.testenv import local_server, read_http_request

PASSWORD = "hookpw-deadline-91"
TOKEN = "T0k3nInThePath0123456789"
QUERY = "qsecret-4412"
HEAD_OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
SLACK = 1.5            # scheduling on a shared 2-core machine; every behaviour below would last >= 30 s unbounded


def _read_request(conn: socket.socket) -> None:
    read_http_request(conn)


def _drip(conn: socket.socket, data: bytes, delay: float, stop: threading.Event) -> None:
    for i in range(len(data)):
        if stop.wait(delay):
            return
        conn.sendall(data[i:i + 1])


def _forever(line: bytes) -> bytes:
    return line * 100_000


# Each behaviour: (what the server does with the accepted connection, the answer send() gives).
Behaviour = Callable[[socket.socket, float, threading.Event, int], None]


def hang_after_accept(conn, delay, stop, other):
    stop.wait(30)


def hang_after_request(conn, delay, stop, other):
    _read_request(conn)
    stop.wait(30)


def trickle_status(conn, delay, stop, other):
    _read_request(conn)
    _drip(conn, b"HTTP/1.1 200 " + b"K" * 60000 + b"\r\n\r\n", delay, stop)   # a status line slower than any deadline


def trickle_headers(conn, delay, stop, other):
    _read_request(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    _drip(conn, _forever(b"X-Pad: a\r\n"), delay, stop)


def hang_after_headers(conn, delay, stop, other):
    _read_request(conn)
    conn.sendall(HEAD_OK + b"Content-Length: 1000000\r\n\r\n")
    stop.wait(30)


def trickle_body(conn, delay, stop, other):
    _read_request(conn)
    conn.sendall(HEAD_OK + b"Content-Length: 1000000\r\n\r\n")
    _drip(conn, b"x" * 1_000_000, delay, stop)


def huge_body(conn, delay, stop, other):
    _read_request(conn)
    conn.sendall(HEAD_OK + b"Connection: close\r\n\r\n")
    chunk = b"y" * 65536
    end = time.monotonic() + 30
    while not stop.is_set() and time.monotonic() < end:
        try:
            conn.sendall(chunk)
        except OSError:
            return


def huge_header_line(conn, delay, stop, other):
    _read_request(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Huge: " + b"h" * (4 * 1024 * 1024) + b"\r\n\r\n")
    stop.wait(30)


def redirect(conn, delay, stop, other):
    _read_request(conn)
    conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:%d/elsewhere\r\nContent-Length: 0\r\n\r\n"
                 % other)
    stop.wait(30)


def refuses(conn, delay, stop, other):
    _read_request(conn)
    conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\nnope!")
    stop.wait(30)


# behaviour -> what send() returns: the status line is the answer; a slow or endless body after a 2xx is cut at the
# deadline (or at MAX_REPLY) and the hook counted as reached
BEHAVIOURS: dict[str, tuple[Behaviour, bool]] = {
    "hang-after-accept": (hang_after_accept, False), "hang-after-request": (hang_after_request, False),
    "trickle-status": (trickle_status, False), "trickle-headers": (trickle_headers, False),
    "hang-after-headers": (hang_after_headers, True), "trickle-body": (trickle_body, True),
    "huge-body": (huge_body, True), "huge-header-line": (huge_header_line, False),
    "redirect": (redirect, False), "answers-500": (refuses, False),
}


@contextmanager
def hostile(behaviour: Behaviour, delay: float) -> Iterator[tuple[int, list[str]]]:
    """The hostile hook on a loopback port, and a second server the redirect points at (its requests listed)."""
    stop = threading.Event()
    elsewhere: list[str] = []

    class Target(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            elsewhere.append(self.path)
            self.send_response(204)
            self.end_headers()

        do_GET = do_POST  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    with local_server(Target) as other:
        class Hostile(BaseHTTPRequestHandler):
            def handle(self) -> None:
                with suppress(OSError):
                    behaviour(self.connection, delay, stop, other)

        with local_server(Hostile) as port:
            try:
                yield port, elsewhere
            finally:
                stop.set()


def _url(port: int) -> str:
    return f"http://watch:{PASSWORD}@127.0.0.1:{port}/hook/{TOKEN}?token={QUERY}"


@pytest.mark.parametrize("name", sorted(BEHAVIOURS))
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(delay=st.floats(0.01, 0.2), deadline=st.floats(0.3, 1.0))
def test_a_hostile_hook_costs_at_most_the_deadline(name, delay, deadline):
    behaviour, reached = BEHAVIOURS[name]
    out = io.StringIO()
    with hostile(behaviour, delay) as (port, elsewhere):
        notifier = Notifier(_url(port), timeout_s=deadline)
        t0 = time.monotonic()
        ok = notifier.send({"event": "restart", "detail": "x" * 100}, Reporter(out, live=False))
        took = time.monotonic() - t0
    assert took <= deadline + SLACK, f"{name}: {took:.2f} s for a {deadline:.2f} s deadline"
    assert ok is reached, (name, out.getvalue())
    assert elsewhere == []                               # a redirect is never followed
    said = out.getvalue()
    assert (said == "") is reached, said                 # a failure is one line; a 2xx says nothing
    if not reached:
        assert said.count("\n") == 1 and f"notify: {shown_url(_url(port))} " in said, said
        assert ("deadline" in said) or ("answered" in said) or ("LineTooLong" in said) or ("got more" in said), said
    for secret in (PASSWORD, TOKEN, QUERY):
        assert secret not in said


def test_the_hook_gets_the_body_and_the_users_credentials_as_basic_auth():
    got: list[tuple[bytes, str | None, str]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            got.append((self.rfile.read(int(self.headers["content-length"])), self.headers["authorization"],
                        self.path))
            body = b"z" * (3 * MAX_REPLY)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    out = io.StringIO()
    with local_server(Hook) as port:
        assert Notifier(_url(port)).send({"event": "give-up", "n": 1}, Reporter(out, live=False)) is True
    import base64
    body, auth, path = got[0]
    assert body == b'{"event": "give-up", "n": 1}' and out.getvalue() == ""
    assert auth == "Basic " + base64.b64encode(f"watch:{PASSWORD}".encode()).decode()
    assert path == f"/hook/{TOKEN}?token={QUERY}"


def test_nothing_listening_is_one_line_at_once():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = io.StringIO()
    t0 = time.monotonic()
    assert Notifier(_url(port), timeout_s=5).send({"event": "restart"}, Reporter(out, live=False)) is False
    assert time.monotonic() - t0 < 2 and "ConnectionRefusedError" in out.getvalue()
    assert PASSWORD not in out.getvalue() and TOKEN not in out.getvalue()


@pytest.mark.parametrize("name", ["hang-in-handshake", "trickle-in-handshake"])
def test_a_hostile_https_hook_costs_at_most_the_deadline_in_the_tls_handshake(name):
    """https: the handshake is inside the deadline too (a server that never answers the ClientHello, or answers a
    TLS record header one byte at a time)."""
    def behaviour(conn, delay, stop, other):
        conn.recv(65536)                                    # the ClientHello
        if name == "hang-in-handshake":
            stop.wait(30)
        else:                                               # a handshake record that never completes
            _drip(conn, b"\x16\x03\x03\x40\x00" + b"\x02" * 16000, 0.05, stop)

    out = io.StringIO()
    with hostile(behaviour, 0.05) as (port, _):
        t0 = time.monotonic()
        ok = Notifier(f"https://127.0.0.1:{port}/hook/{TOKEN}", timeout_s=0.8).send({"event": "restart"},
                                                                                   Reporter(out, live=False))
        took = time.monotonic() - t0
    assert ok is False and took <= 0.8 + SLACK, (took, out.getvalue())
    assert "deadline" in out.getvalue() and TOKEN not in out.getvalue()
