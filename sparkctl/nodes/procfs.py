"""Facts about local processes from /proc: state and kernel start time, command line, where stdout goes.

A PID alone is never trusted: the kernel start time (field 22 of /proc/PID/stat) tells a recycled PID from the
process sparkctl recorded. Used by the process runtime (its engines) and the ledger (its controllers).
"""
from __future__ import annotations

import os
import time
from pathlib import Path


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, kernel start time) of a process from one read of /proc/PID/stat, or None if gone.

    A process whose main thread has exited while its other threads still run shows "Z" for its PID, yet those
    threads hold everything it holds (its open files: an engine's listening socket, seen held after a SIGKILL
    stop whose process check had passed). Such a process reads as "D" (exiting, not yet gone): "Z" means the whole
    thread group has ended (num_threads, field 20, is 1 for a true zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()   # after the comm field: state is field 3, starttime field 22
    if fields[0] == "Z" and int(fields[17]) > 1:
        return "D", int(fields[19])
    return fields[0], int(fields[19])


def session_and_ticks(pid: int) -> tuple[int, int] | None:
    """(session id, kernel start time) of a process (None if gone): an engine's processes share its session."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()   # state, ppid, pgrp, session, ... starttime (field 22)
    return int(fields[3]), int(fields[19])


def title(pid: int, width: int = 80) -> str:
    """What a process calls itself, for messages: its command line (a setproctitle title such as
    ``sglang::scheduler_TP0`` shows there), else its kernel name; escaped and clipped to `width` characters."""
    args = cmdline(pid)
    text = " ".join(args) if args else ""
    if not text:
        try:
            text = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            text = ""
    text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= width else text[:width - 3] + "..."


def start_ticks(pid: int) -> int | None:
    stat = proc_stat(pid)
    return stat[1] if stat else None


def running(pid: int, ticks: int | None) -> bool:
    """The process `pid` runs and is the one that started at `ticks` (a zombie is dead; None ticks: pid only)."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] != "Z" and (ticks is None or stat[1] == ticks)


# Process states that are not "running" although the PID exists: zombie (Z), dead (X), stopped by a signal (T:
# SIGSTOP, Ctrl-Z, a frozen cgroup) or by a tracer (t). A stopped engine holds its port and answers nothing.
STOPPED_STATES = frozenset("Tt")


def _children(pid: int) -> list[int] | None:
    """`pid`'s children from /proc/PID/task/*/children (a few small reads), or None where the kernel lacks it."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []                                   # gone
    out: list[int] = []
    for tid in tasks:
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except FileNotFoundError:
            return None                             # CONFIG_PROC_CHILDREN off: the caller scans /proc
        except OSError:
            continue
    return out


def children(pid: int) -> list[int]:
    """The direct children of `pid` now (from its threads' children lists, else one scan of /proc)."""
    kids = _children(pid)
    return kids if kids is not None else _parents().get(pid, [])


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (children, their children...): from each process's children list (liveness calls
    this on every poll of a boot, so not a scan of all of /proc), else from one scan of /proc (parent: field 4)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = _children(todo.pop())
        if kids is None:
            return _descendants_by_scan(pid)
        for child in kids:
            if child not in out:
                out.append(child)
                todo.append(child)
    return out


def forked_since(before: set[int], marker: str, *, settle_s: float = 1.0) -> list[int]:
    """The children of this process a start just forked: not in `before` (its children before the fork), and
    either not exec'd yet (their command line is still this process's) or running with `marker` (an argument only
    that start's command has) in their argv. A sibling thread's recorded child never matches. A child caught inside
    its execve has an empty command line for that moment (a loaded machine stretches it: one router start
    interrupted there ran unrecorded): read again for up to `settle_s`; one still unreadable and not a zombie counts
    as forked here (what a start leaves must not outlive it)."""
    mine = cmdline(os.getpid())
    out = []
    for pid in sorted(set(children(os.getpid())) - before):
        c = cmdline(pid)
        deadline = time.monotonic() + settle_s
        while not c and time.monotonic() < deadline and (st := proc_stat(pid)) is not None and st[0] != "Z":
            time.sleep(0.01)
            c = cmdline(pid)
        if c == mine or marker in c or (not c and (st := proc_stat(pid)) is not None and st[0] != "Z"):
            out.append(pid)
    return out


def _parents() -> dict[int, list[int]]:
    """parent pid -> its children, from one scan of /proc (stat field 4)."""
    parents: dict[int, list[int]] = {}
    for p in pids():
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        parents.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(p)
    return parents


def _descendants_by_scan(pid: int) -> list[int]:
    parents = _parents()
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in out:
                out.append(child)
                todo.append(child)
    return out


def stopped_in_tree(pid: int, tree: list[int] | None = None) -> tuple[int, str] | None:
    """(pid, state) of the first process of `pid`'s tree (itself, then its descendants) that is stopped (T/t),
    or None: a SIGSTOPped engine behind a running log pipe is not a running rank. `tree`: the descendants when the
    caller already knows them (`descendants(pid)`, read again here when None)."""
    for p in [pid, *(descendants(pid) if tree is None else tree)]:
        stat = proc_stat(p)
        if stat is not None and stat[0] in STOPPED_STATES:
            return p, stat[0]
    return None


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")[:-1]
    except OSError:
        return []


def runs_sparkctl(pid: int, *, settle_s: float = 1.0) -> bool:
    """The process's command line runs sparkctl (its engine, the emulator, or the log pipe in front of them).

    A process caught in the middle of its exec has an empty command line for a moment (measured: 29 of 300
    reads right after `subprocess.Popen` returned): an empty one is read again for up to `settle_s` while the
    process lives, instead of being taken for "not ours" (which made boot report a just-started rank dead)."""
    import time

    deadline = time.monotonic() + settle_s
    while True:
        args = cmdline(pid)
        if args:
            return any("sparkctl" in a for a in args)
        stat = proc_stat(pid)
        if stat is None or stat[0] == "Z" or time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def sessions() -> dict[int, list[tuple[int, int]]]:
    """Every process by its session, from one pass over /proc: session id -> [(pid, kernel start time)]. What
    finds the members of many engines at once (`EngineGroup.members(sessions=...)`): one read of each process,
    however many engines are asked about (a read per process per engine made a ledger's history a multiplier)."""
    out: dict[int, list[tuple[int, int]]] = {}
    for pid in pids():
        info = session_and_ticks(pid)
        if info is not None:
            out.setdefault(info[0], []).append((pid, info[1]))
    return out


def stdout_target(pid: int) -> str | None:
    """Where the process's stdout (fd 1) points (a log file path), or None (gone, not ours to read)."""
    try:
        return os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None


def unescape_mount(field: str) -> str:
    """A path field of /proc/self/mounts (space, tab, newline and backslash are octal escapes)."""
    import re
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def fs_type(path: str | os.PathLike[str]) -> str | None:
    """The file system type ("tmpfs", "ext4", ...) of the mount holding `path` (its nearest existing ancestor),
    from /proc/self/mounts: the longest mount point that contains it. None when it cannot be read."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    real = os.path.realpath(p)
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    best, kind = "", None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mnt = unescape_mount(fields[1])
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best):
            best, kind = mnt, fields[2]
    return kind


def processes_naming(text: str) -> list[int]:
    """Running (not zombie) processes whose command line has an argument equal to `text` (e.g. a secrets
    directory the log pipe was given)."""
    out = []
    for pid in pids():
        if text in cmdline(pid):
            stat = proc_stat(pid)
            if stat is not None and stat[0] != "Z":
                out.append(pid)
    return out


def _ipv4_hex(address: str) -> str | None:
    """An IPv4 address as /proc/net/tcp writes it (host byte order on little-endian machines: 127.0.0.1 -> 0100007F)."""
    import socket
    import struct
    try:
        return f"{struct.unpack('=I', socket.inet_aton(address))[0]:08X}"
    except OSError:
        return None


def tcp_sockets(port: int, address: str | None = None) -> dict[str, tuple[str, str, str]]:
    """TCP sockets bound to `port` here, from /proc/net/tcp and tcp6: socket inode -> (state as the kernel writes
    it, e.g. "0A" for LISTEN; local and remote address fields); on any address, or only those that take `address`
    (bound to it, or to every address)."""
    wanted = None if address is None else {_ipv4_hex(address), "00000000", "0" * 32}
    found: dict[str, tuple[str, str, str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and int(f[1].rsplit(":", 1)[1], 16) == port \
                    and (wanted is None or f[1].rsplit(":", 1)[0] in wanted):
                found[f[9]] = (f[3], f[1], f[2])
    return found


def socket_holders(inodes: set[str]) -> list[tuple[int, str]]:
    """(pid, inode) for every process of this user's holding one of the socket `inodes`, in /proc's order (a
    process whose descriptors this user cannot read is not seen)."""
    wanted = {f"socket:[{i}]": i for i in inodes}
    out: list[tuple[int, str]] = []
    if not wanted:
        return out
    for pid in pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                inode = wanted.get(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
            if inode is not None:
                out.append((pid, inode))
    return out


def listener_of(port: int, address: str | None = None) -> tuple[int, list[str]] | None:
    """(pid, command line) of a process of this user's that listens on TCP `port` here, or None (nobody, or a
    process whose descriptors this user cannot read): names who holds a port in an error message."""
    listening = {i for i, (state, _, _) in tcp_sockets(port, address).items() if state == "0A"}
    holders = socket_holders(listening)
    return (holders[0][0], cmdline(holders[0][0])) if holders else None
