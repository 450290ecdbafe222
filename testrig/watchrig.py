"""Helpers of the watcher tests: waits on observable conditions with bounded timeouts, a real generation through
the endpoint, the engine under a rank's log pipe."""
from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from sparkctl.config.inventory import load_inventory
from sparkctl.nodes import procfs
from sparkctl.nodes.handles import ProcessHandle
from sparkctl.state.ledger import Ledger
from sparkctl.state.watchfile import WatchState, load_watch

FAST = ["--interval", "0.3", "--backoff", "0.3", "--backoff-max", "1"]


def ledger_of(inv: Path) -> Ledger:
    return Ledger.for_cluster(load_inventory(inv).cluster.name)


def watch_state(root: Path) -> WatchState:
    """The watcher's file under the state directory `root` (the test ran a watcher: it is there)."""
    st = load_watch(root)
    assert st is not None, f"no watcher file under {root}"
    return st


def wait_until(pred: Callable[[], Any], what: str, timeout: float = 60.0, every: float = 0.05) -> Any:
    """Poll `pred` until it returns something truthy (returned), or fail after `timeout` seconds naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def up(cli, profile: str = "d5") -> dict:
    code, out, err = cli("up", "--profile", profile, "--yes", "--json")
    assert code == 0, err
    return json.loads(out)


def status(cli) -> tuple[int, dict]:
    code, out, _ = cli("status", "--json")
    return code, json.loads(out)


def engine_pid(pipe_pid: int) -> int:
    """The engine under a rank's log pipe (the recorded pid)."""
    kids = procfs.descendants(pipe_pid)
    assert kids, f"log pipe {pipe_pid} has no engine child"
    return kids[0]


def alive(pid: int) -> bool:
    return procfs.running(pid, None)          # a zombie is dead


def killed_mid_restart(cli, inventory: Path, watcher: Callable[..., Any]) -> tuple[str, Any]:
    """Deploy d5, start a watcher, kill rank 1, and return (the old deployment, the watcher) once the watcher's
    restart has started rank 1 again: the moment a test signals the watcher in."""
    import re
    import signal

    old = up(cli)["deployment"]
    run = watcher()
    handle = ledger_of(inventory).load(old).handle_of(1)
    assert isinstance(handle, ProcessHandle), f"rank 1 of {old} is not a local process: {handle}"
    os.kill(handle.pid, signal.SIGKILL)
    run.wait_for("rank 1 started", after=rf"restarting {re.escape(old)}")
    return old, run


def serves(endpoint: str) -> bool:
    """A real generation through the endpoint (the API key from the environment, as a client would have it)."""
    key = os.environ.get("SPARKCTL_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.post(f"{endpoint}/v1/chat/completions", headers=headers, timeout=10,
                       json={"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0


def polls_after(root: Path, n: int, timeout: float = 30.0) -> None:
    """Wait until the watcher has checked `n` more times (its file's last_check moves on each poll)."""
    seen: list[str] = []

    def moved() -> bool:
        st = load_watch(root)
        if st and st.last_check and (not seen or seen[-1] != st.last_check):
            seen.append(st.last_check)
        return len(seen) > n
    wait_until(moved, f"{n} more checks by the watcher", timeout)


class Hook:
    """A webhook on loopback (the watcher's `--notify`): answers 204 and keeps each event (`events`) and its raw body
    (`bodies`), or (`hang`) reads the request and never answers, holding the connection open until `close`."""

    def __init__(self, hang: bool = False) -> None:
        from testrig.testenv import RawServer
        self.hang = hang
        self.events: list[dict[str, Any]] = []
        self.bodies: list[bytes] = []
        self.held: list[socket.socket] = []
        self.server = RawServer(self._one)
        self.url = self.server.url()

    def _one(self, conn: socket.socket) -> None:
        from testrig.testenv import read_http_request
        request = read_http_request(conn, timeout_s=60)
        if request is None:
            return
        self.bodies.append(request[0] + b"\r\n\r\n" + request[1])
        self.events.append(json.loads(request[1]))
        if self.hang:
            self.held.append(conn)           # never answered
            return
        conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        conn.close()

    def close(self) -> None:
        self.server.close()
        for c in self.held:
            c.close()


def metric(url: str, name: str, **labels: str) -> float | None:
    """The value of sample `name` (with these labels, among others) on a Prometheus endpoint, or None."""
    from prometheus_client import parser
    for family in parser.text_string_to_metric_families(httpx.get(url, timeout=5).text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None
