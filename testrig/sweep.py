"""What on this machine holds something: which files under a directory, and which processes' command lines or
environments, hold any of some secret values (the test's own process excepted: it set them for the commands); which
sockets hold a TCP port, in which state, and which processes hold those sockets (the evidence a "port still held"
assertion needs)."""
from __future__ import annotations

import os
import socket
import struct
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


TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT",
              7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING"}


def process_tree(pids: list[int]) -> list[tuple[int, int]]:
    """(pid, start time) of every process of the trees under `pids` now (each pid and its descendants, walked
    through /proc/PID/task/*/children): listed before a stop, so that what outlives it is found without the
    tracking under test."""
    out = []
    for top in pids:
        for pid in [top, *procfs.descendants(top)]:
            ticks = procfs.start_ticks(pid)
            if ticks is not None:
                out.append((pid, ticks))
    return out


def still_running(tree: list[tuple[int, int]]) -> list[str]:
    """"PID title" of each process of `tree` that still runs (the same pid and start time)."""
    return [f"{pid} {procfs.title(pid)}" for pid, ticks in tree if procfs.running(pid, ticks)]


def port_holders(address: str, port: int) -> list[str]:
    """Every TCP socket of this network namespace bound to `port` on `address` (or on every address), as
    "STATE local -> remote inode N: pid P title" (no pid: the kernel holds it, no process does); the sockets and
    their holders as sparkctl's own `procfs.tcp_sockets` / `socket_holders` read them."""
    sockets = procfs.tcp_sockets(port, address)
    owners: dict[str, list[str]] = {i: [] for i in sockets}
    for pid, inode in procfs.socket_holders(set(sockets)):
        owners[inode].append(f"pid {pid} {procfs.title(pid)}")
    return [f"{TCP_STATES.get(int(state, 16), state)} {_addr(local)} -> {_addr(remote)} inode {inode}: "
            f"{', '.join(owners[inode]) or 'no process'}" for inode, (state, local, remote) in sockets.items()]


def _addr(field: str) -> str:
    """A /proc/net/tcp address field as host:port (IPv4 decoded; an IPv6 field as the kernel wrote it)."""
    host, port = field.rsplit(":", 1)
    if len(host) == 8:
        host = socket.inet_ntoa(struct.pack("<I", int(host, 16)))
    return f"{host}:{int(port, 16)}"
