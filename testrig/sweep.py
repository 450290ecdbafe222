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


def port_holders(address: str, port: int) -> list[str]:
    """Every IPv4 TCP socket of this network namespace bound to `port` on `address` (or on 0.0.0.0), as
    "STATE local -> remote inode N: pid P comm" (no pid: the kernel holds it, no process does), from
    /proc/net/tcp and each process's fd links."""
    wanted = {address, "0.0.0.0"}
    sockets: dict[str, str] = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        local, remote, state, inode = f[1], f[2], int(f[3], 16), f[9]
        addr, p = _hexaddr(local)
        if p == port and addr in wanted:
            raddr, rport = _hexaddr(remote)
            sockets[inode] = f"{TCP_STATES.get(state, state)} {addr}:{p} -> {raddr}:{rport} inode {inode}"
    owners: dict[str, list[str]] = {i: [] for i in sockets}
    for pid in procfs.pids():
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:[") and link[len("socket:["):-1] in owners:
                owners[link[len("socket:["):-1]].append(f"pid {pid} {procfs.title(pid)}")
    return [f"{what}: {', '.join(owners[i]) or 'no process'}" for i, what in sockets.items()]


def _hexaddr(field: str) -> tuple[str, int]:
    host, port = field.split(":")
    return socket.inet_ntoa(struct.pack("<I", int(host, 16))), int(port, 16)
