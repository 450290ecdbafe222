"""A small TCP rendezvous standing in for torch.distributed's store + NCCL process group.

Rank 0 listens on ``--dist-init-addr`` (host:port, bound to that host). Every rank > 0 connects
(retrying until its connect timeout), sends ``hello``, and then both sides exchange newline-
delimited JSON messages on that one connection:

* ``{"hello": rank}``                    rank > 0 -> rank 0, once
* ``{"barrier": name, "rank": r}``       a rank reached a named barrier (``gloo``, ``nccl``, ``model``)
* ``{"release": name}``                  rank 0 -> all, once every rank reached it
* ``{"hb": seq}``                        heartbeat both ways every ``heartbeat_period()``; ``seq`` is the
                                         sender's forward count (printed as NCCL SeqNum on failure)

A peer is lost when nothing was heard from it for ``peer_timeout_s`` (a closed connection just
stops the heartbeats), the way a collective hangs until the NCCL watchdog fires. The owner gets
``on_peer_lost(rank, silent_for_s, last_seq)`` once.
"""
from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Collection

PeerLost = Callable[[int, float, int], None]


class DistError(Exception):
    """Rendezvous failure; ``kind`` is 'listen', 'connect' or 'wait'."""

    def __init__(self, kind: str, message: str, attempts: int = 0) -> None:
        super().__init__(message)
        self.kind, self.attempts = kind, attempts


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile = sock.makefile("r", encoding="utf-8", newline="\n")
        self._wlock = threading.Lock()
        self.last_heard = time.monotonic()
        self.last_seq = 0
        self.closed = False

    def send(self, obj: dict) -> None:
        data = (json.dumps(obj) + "\n").encode()
        with self._wlock:
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed = True

    def close(self) -> None:
        self.closed = True
        for closer in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.sock.close):
            with contextlib.suppress(OSError):
                closer()


class _Group:
    """What rank 0 and the other ranks share: barrier state, heartbeat and the watchdog."""

    def __init__(self, rank: int, nnodes: int, peer_timeout_s: float, heartbeat_s: float,
                 seq: Callable[[], int], on_peer_lost: PeerLost, stopping: threading.Event) -> None:
        self.rank, self.nnodes = rank, nnodes
        self.peer_timeout_s, self.heartbeat_s = peer_timeout_s, heartbeat_s
        self.seq, self.on_peer_lost, self.stopping = seq, on_peer_lost, stopping
        self.cv = threading.Condition()
        self.released: set[str] = set()
        self.conns: dict[int, _Conn] = {}
        self._lost = False

    def _pump(self, peer: int, conn: _Conn, handle: Callable[[int, dict], None]) -> None:
        try:
            for line in conn.rfile:
                conn.last_heard = time.monotonic()
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if "hb" in msg:
                    conn.last_seq = int(msg["hb"])
                handle(peer, msg)
        except (OSError, ValueError):
            pass
        conn.closed = True

    def _heartbeat_and_watch(self) -> None:
        while not self.stopping.wait(self.heartbeat_s):
            for conn in list(self.conns.values()):
                if not conn.closed:
                    conn.send({"hb": self.seq()})
            now = time.monotonic()
            for peer, conn in list(self.conns.items()):
                silent = now - conn.last_heard
                if silent >= self.peer_timeout_s and not self._lost:
                    self._lost = True
                    self.on_peer_lost(peer, silent, conn.last_seq)
                    return

    def start_watch(self) -> None:
        threading.Thread(target=self._heartbeat_and_watch, name="sim-dist-watchdog", daemon=True).start()

    def wait_release(self, name: str, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        with self.cv:
            while name not in self.released:
                if self.stopping.is_set():
                    return False
                left = 0.2 if end is None else min(0.2, end - time.monotonic())
                if left <= 0:
                    return False
                self.cv.wait(left)
        return True

    def close(self) -> None:
        for conn in list(self.conns.values()):
            conn.close()


class StoreServer(_Group):
    """Rank 0: the store every other rank joins."""

    def __init__(self, host: str, port: int, nnodes: int, *, reserved: Collection[int] | None = None,
                 **kw) -> None:
        if reserved and port in reserved:
            raise DistError("listen", f"port {port} is reserved for another engine on this machine (emulator knob "
                                      f"reserved_ports: {sorted(reserved)}): give the profile an api.dist_port of "
                                      f"its own")
        super().__init__(0, nnodes, **kw)
        self.arrived: dict[str, set[int]] = {}
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as e:
            self.sock.close()
            raise DistError("listen", f"{e.strerror or e}") from None
        self.sock.listen(16)
        threading.Thread(target=self._accept, name="sim-store-accept", daemon=True).start()
        self.start_watch()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        conn = _Conn(sock)
        try:
            first = json.loads(conn.rfile.readline() or "{}")
        except (OSError, ValueError):
            conn.close()
            return
        peer = first.get("hello")
        if not isinstance(peer, int) or peer <= 0 or peer >= self.nnodes:
            conn.close()
            return
        with self.cv:
            self.conns[peer] = conn
            self.cv.notify_all()
            for name in self.released:
                conn.send({"release": name})
        self._pump(peer, conn, self._handle)

    def _handle(self, peer: int, msg: dict) -> None:
        if "barrier" in msg:
            self.arrive(str(msg["barrier"]), peer)

    def arrive(self, name: str, rank: int) -> None:
        with self.cv:
            got = self.arrived.setdefault(name, set())
            got.add(rank)
            if len(got) >= self.nnodes and name not in self.released:
                self.released.add(name)
                for conn in self.conns.values():
                    conn.send({"release": name})
            self.cv.notify_all()

    def joined(self) -> int:
        with self.cv:
            return 1 + len(self.conns)

    def wait_joined(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self.cv:
            while 1 + len(self.conns) < self.nnodes:
                if self.stopping.is_set():
                    return False
                left = min(0.2, end - time.monotonic())
                if left <= 0:
                    return False
                self.cv.wait(left)
        return True

    def barrier(self, name: str) -> bool:
        self.arrive(name, 0)
        return self.wait_release(name)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        super().close()


class StoreClient(_Group):
    """Rank > 0: connect to rank 0's store (bounded retries), then barriers + heartbeat."""

    def __init__(self, rank: int, host: str, port: int, nnodes: int, connect_timeout_s: float,
                 on_retry: Callable[[int, str], None] | None = None, **kw) -> None:
        super().__init__(rank, nnodes, **kw)
        end = time.monotonic() + connect_timeout_s
        attempts = 0
        last_err = "Connection refused"
        while True:
            attempts += 1
            try:
                sock = socket.create_connection((host, port), timeout=min(2.0, max(0.1, end - time.monotonic())))
                sock.settimeout(None)
                break
            except OSError as e:
                last_err = e.strerror or str(e)
                if on_retry:
                    on_retry(attempts, last_err)
                if self.stopping.is_set() or time.monotonic() + 0.25 >= end:
                    raise DistError("connect", last_err, attempts) from None
                self.stopping.wait(0.25)
        conn = _Conn(sock)
        self.conns[0] = conn
        conn.send({"hello": rank})
        threading.Thread(target=self._pump, args=(0, conn, self._handle), daemon=True).start()
        self.start_watch()

    def _handle(self, peer: int, msg: dict) -> None:
        if "release" in msg:
            with self.cv:
                self.released.add(str(msg["release"]))
                self.cv.notify_all()

    def barrier(self, name: str) -> bool:
        self.conns[0].send({"barrier": name, "rank": self.rank})
        return self.wait_release(name)
