"""An engine tracked as a whole: every process it ever started, wherever they went, stopped together.

Why: a real SGLang rank is a tree (the launcher, ``sglang::scheduler_TP0``, ``sglang::detokenizer``,
multiprocessing's resource tracker...). A signal to the launcher, `PR_SET_PDEATHSIG` or a process group reach
only part of it: when the launcher dies first (a failed load barrier, a SIGKILL), its children live on with
parent init, holding the rank's ports (and, on a GB10, its unified memory). Found in CI: the scheduler of a
failed TP=2 boot kept ``*:26000`` and every later `up` failed preflight.

How an engine's processes are found, by what each runtime can offer:

* **its session.** The process runtime starts the log pipe (`sparkctl.nodes.logpipe`) as the leader of a new
  session; every process below it inherits that session id (SGLang never calls setsid), and keeps it when it is
  re-parented to init. A process's session and start time are read from /proc/PID/stat; a member started before
  the leader is not one (a recycled id).
* **a cgroup, where the node has one we may write** (cgroup v2, e.g. as root): the pipe joins
  ``<cgroup2 mount>/sparkctl/<state key>/<deployment>.rank<N>.<pipe start>`` before it starts the engine, so every
  descendant is born inside it, setsid or not; ``cgroup.kill`` ends them all at once. The directory's name says
  whose engine it was, so a leftover is named by deployment and rank even when no record names it.
* **its tree.** The pipe is a child subreaper (`PR_SET_CHILD_SUBREAPER`): an orphan of the engine is
  re-parented to the pipe, not to init, and the pipe stops what is left of the tree when the engine exits, before
  it exits itself. So "the pipe has exited" means "the tree is gone" on every path but a SIGKILL of the pipe.
* a container (docker runtime): its PID namespace; not this module.

Environment markers are not used: SGLang's workers set their title with setproctitle, which overwrites the memory
/proc/PID/environ reads (measured on the real 0.5.23 venv: the marker was gone from both a titled process and its
spawned child).
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkctl.nodes import procfs

log = logging.getLogger("sparkctl.nodes.enginegroup")

CGROUP_TOP = "sparkctl"
# How long a stop waits, after SIGKILL, for the engine's processes to be gone. A SIGKILLed process ends once the
# kernel has torn it down (its memory unmapped, its I/O returned): 5 s was too short on a loaded 2-core machine,
# where a real SGLang rank still held its port after the stop returned (tests/realengine/test_engine_tree_real.py,
# after-ready-sigkill, load 10-13); the stop returns as soon as nothing is left, so a longer bound costs only the
# slow case.
KILL_S = 30.0
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.@-]")
_LEAF = re.compile(r"^(?P<deployment>.+)\.rank(?P<rank>\d+)\.(?P<nonce>\d+)$")


@dataclass(frozen=True)
class Member:
    """One process of an engine: its PID, kernel start time and title (``sglang::scheduler_TP0``)."""

    pid: int
    ticks: int
    title: str

    def describe(self) -> str:
        return f"pid {self.pid} ({self.title})" if self.title else f"pid {self.pid}"


@dataclass(frozen=True)
class EngineGroup:
    """Every process of one engine: the session led by `leader` (the log pipe, started at `leader_ticks`) and, when
    one was made, the cgroup `cgroup`. Example::

        group = EngineGroup(handle.pid, handle.start_ticks, handle.cgroup)
        left = group.stop(term_s=15)      # [] once nothing of it remains
    """

    leader: int
    leader_ticks: int | None
    cgroup: str | None = None

    def members(self, sessions: Mapping[int, list[tuple[int, int]]] | None = None) -> list[Member]:
        """The processes of this engine that still run (zombies excluded), the leader included while it runs.
        `sessions`: a snapshot of every process by session (`procfs.sessions()`), taken once by a caller that asks
        about many engines; without it, /proc is read now."""
        found: dict[int, Member] = {}
        for pid in self._cgroup_pids() + self._tree():
            m = _member(pid)
            if m is not None:
                found[pid] = m
        if not self._session_is_ours():
            return sorted(found.values(), key=lambda m: m.pid)
        in_session = (sessions if sessions is not None else procfs.sessions()).get(self.leader, ())
        for pid, ticks in in_session:
            if pid in found:
                continue
            if self.leader_ticks is not None and ticks < self.leader_ticks:
                continue                        # started before our leader: the session id was recycled
            m = _member(pid)
            if m is not None:
                found[pid] = m
        return sorted(found.values(), key=lambda m: m.pid)

    def _session_is_ours(self) -> bool:
        """The session id still names our engine's session: not 0 (the kernel's), and not recycled (Linux reuses no
        PID that is a live session's id, so a process `leader` that started at another time means ours has no
        member left and the id leads a stranger's session now)."""
        if self.leader <= 1:             # the kernel's (0) or init's (1) session: never an engine's
            return False
        now = procfs.start_ticks(self.leader)
        return now is None or self.leader_ticks is None or now == self.leader_ticks

    def _tree(self) -> list[int]:
        """The leader and every process below it, while the leader is ours: the log pipe is a child subreaper, so
        an engine's orphan (a double fork, a setsid-ed worker whose parent died) is re-parented to it."""
        if self.leader <= 1 or not procfs.running(self.leader, self.leader_ticks):
            return []
        return [self.leader, *procfs.descendants(self.leader)]

    def _cgroup_pids(self) -> list[int]:
        if not self.cgroup:
            return []
        try:
            text = (Path(self.cgroup) / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def signal(self, sig: int) -> None:
        """`sig` to every process of the engine (with SIGKILL and a cgroup: ``cgroup.kill`` first, which also takes
        what is forking right now)."""
        if sig == signal.SIGKILL and self.cgroup:
            with contextlib.suppress(OSError):
                (Path(self.cgroup) / "cgroup.kill").write_text("1")
        for m in self.members():
            with contextlib.suppress(OSError):
                os.kill(m.pid, sig)

    def wait_gone(self, timeout_s: float, *, poll_s: float = 0.05,
                  reap: Callable[[], None] | None = None) -> list[Member]:
        """Wait up to `timeout_s` for every process of the engine to end; what still runs then ([] when none).

        A poll looks at the processes the last one found (a read each); the whole of /proc is read again only when
        none of them is left (to find one forked meanwhile before saying "gone") and at the deadline: a stop waits
        seconds for a real engine, and a pass over every process of the machine every 50 ms was most of its CPU."""
        deadline = time.monotonic() + timeout_s
        known: list[Member] = []
        while True:
            if reap is not None:
                reap()
            over = time.monotonic() >= deadline
            left = [m for m in known if procfs.running(m.pid, m.ticks)]
            if not left or over:
                left = self.members()
                if not left or over:
                    return left
            known = left
            time.sleep(poll_s)

    def kill(self, *, kill_s: float = KILL_S, reap: Callable[[], None] | None = None) -> list[Member]:
        """SIGKILL every process until none remains (a process forking meanwhile is taken too), up to `kill_s`;
        what remains then (a process in uninterruptible sleep dies when its I/O returns)."""
        deadline = time.monotonic() + kill_s
        while True:
            self.signal(signal.SIGKILL)
            left = self.wait_gone(min(0.5, max(0.0, deadline - time.monotonic())), reap=reap)
            if not left or time.monotonic() >= deadline:
                if left:
                    log.warning("engine of session %d: %s still present %.0f s after SIGKILL", self.leader,
                                ", ".join(m.describe() for m in left), kill_s)
                return left

    def release(self) -> None:
        """Remove the engine's cgroup once it is empty (and its parents, once empty too)."""
        if not self.cgroup:
            return
        path = Path(self.cgroup)
        with contextlib.suppress(OSError):
            path.rmdir()
            path.parent.rmdir()              # the state directory's, once it holds no engine


SHM_DIR = Path("/dev/shm")


def shm_files(pids: list[int]) -> set[Path]:
    """Files directly in /dev/shm that these processes have mapped or open (an engine's shared-memory queues and
    semaphores: SGLang's 24 MiB ``sgl_shm_mq_<pid>_*``, multiprocessing's ``sem.mp-*``). A process killed by SIGKILL
    never unlinks them, and on tmpfs they hold memory until someone does."""
    found: set[Path] = set()
    prefix = str(SHM_DIR) + "/"
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
                paths = [ln.split(None, 5)[5].strip() for ln in fh if prefix in ln and len(ln.split(None, 5)) == 6]
        except OSError:
            paths = []
        with contextlib.suppress(OSError):
            paths += [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        for p in paths:
            if p.endswith(" (deleted)") or not p.startswith(prefix) or "/" in p[len(prefix):]:
                continue
            found.add(Path(p))
    return found


def release_shm(files: set[Path]) -> list[str]:
    """Unlink those of `files` that are this user's regular files and no longer used by anyone: called once every
    process of the engine is gone. Returns the names removed."""
    if not files:
        return []
    in_use = shm_files(procfs.pids())             # another process still maps or holds one: it stays
    removed = []
    for path in sorted(files - in_use):
        try:
            st = path.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                path.unlink()
                removed.append(path.name)
        except OSError:
            continue
    if removed:
        log.info("released %d shared-memory files the engine left in %s: %s", len(removed), SHM_DIR,
                 ", ".join(removed[:8]))
    return removed


def _member(pid: int) -> Member | None:
    stat = procfs.proc_stat(pid)
    if stat is None or stat[0] == "Z":
        return None
    return Member(pid, stat[1], procfs.title(pid))


# --- cgroups -----------------------------------------------------------------------------------------------------

def cgroup2_mount(mounts: str | None = None) -> Path | None:
    """The cgroup v2 mount of this machine (``/sys/fs/cgroup`` or, on a hybrid host, ``/sys/fs/cgroup/unified``),
    or None."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(procfs.unescape_mount(fields[1]))
    return None


def cgroup_of(pid: int) -> str | None:
    """The engine cgroup (a directory under ``<cgroup2>/sparkctl/``) process `pid` is in, or None: how a stop finds
    the cgroup of an engine whose handle was rebuilt from what runs (`repair`, `observe`) and does not name it."""
    mount = cgroup2_mount()
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::") and mount is not None:
            rel = line[3:].lstrip("/")
            if rel.startswith(CGROUP_TOP + "/") and _LEAF.match(rel.rsplit("/", 1)[-1]):
                return str(mount / rel)
    return None


def cgroup_parent(state_key: str) -> Path | None:
    """The directory holding this state directory's engine cgroups, made when this user may (root, or a delegated
    v2 hierarchy); None where no writable cgroup v2 exists (then the session alone tracks an engine)."""
    mount = cgroup2_mount()
    if mount is None or not os.access(mount, os.W_OK):
        return None
    path = mount / CGROUP_TOP / state_key
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.debug("no engine cgroup under %s: %s", mount, exc)
        return None
    if not (path / "cgroup.procs").exists() or not os.access(path / "cgroup.procs", os.W_OK):
        return None
    return path


def cgroups_writable() -> bool:
    """This user may make engine cgroups here (probed by making and removing one)."""
    probe = f"probe-{os.getpid()}-{time.monotonic_ns()}"
    path = cgroup_parent(probe)
    if path is None:
        return False
    with contextlib.suppress(OSError):
        path.rmdir()
    return True


def new_cgroup(state_key: str, deployment: str, rank: int) -> Path | None:
    """A fresh cgroup for one engine of `deployment` rank `rank` (None where none can be made). Its name carries the
    deployment, the rank and a unique suffix, so `leftover_cgroups` can say whose it was."""
    parent = cgroup_parent(state_key)
    if parent is None:
        return None
    stem = f"{_NAME_UNSAFE.sub('_', deployment)}.rank{rank}"
    for _ in range(5):
        path = parent / f"{stem}.{time.monotonic_ns()}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            log.debug("cannot make %s: %s", path, exc)
            return None
        return path
    return None


def join_cgroup(path: str) -> None:
    """Move the calling process into the cgroup `path` (in a child between fork and exec: every process it starts
    is born inside)."""
    fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Leftover:
    """Processes of a sparkctl engine that outlived it: whose (deployment, rank) and which processes."""

    deployment: str
    rank: int
    group: EngineGroup
    members: tuple[Member, ...]

    @property
    def whose(self) -> str:
        return f"rank {self.rank} of {self.deployment}"

    def describe(self) -> str:
        shown = ", ".join(m.describe() for m in self.members[:4])
        more = f" and {len(self.members) - 4} more" if len(self.members) > 4 else ""
        return f"{self.whose}: {shown}{more}"

    def stop(self, *, term_s: float = 5.0) -> list[Member]:
        """SIGTERM, then SIGKILL after `term_s`; what remains ([] when all gone). The cgroup is removed."""
        shm = shm_files([m.pid for m in self.members])
        self.group.signal(signal.SIGTERM)
        left = self.group.wait_gone(term_s)
        if left:
            left = self.group.kill()
        if not left:
            self.group.release()
            release_shm(shm)
        return left


PIPE_MODULE = "sparkctl.nodes.logpipe"


def leftover_cgroups(state_key: str) -> list[Leftover]:
    """Engine cgroups of this state directory whose log pipe is gone but which still hold processes. A cgroup
    whose pipe runs is a running engine, recorded or not (a record may be damaged: `repair` rebuilds it from what
    runs), never a leftover; empty ones are removed."""
    mount = cgroup2_mount()
    if mount is None:
        return []
    parent = mount / CGROUP_TOP / state_key
    out: list[Leftover] = []
    try:
        leaves = sorted(parent.iterdir())
    except OSError:
        return out
    for leaf in leaves:
        m = _LEAF.match(leaf.name)
        if not m or not leaf.is_dir():
            continue
        group = EngineGroup(0, None, str(leaf))
        members = group.members()
        if not members:
            group.release()
        elif not any(PIPE_MODULE in procfs.cmdline(p.pid) for p in members):
            out.append(Leftover(m.group("deployment"), int(m.group("rank")), group, tuple(members)))
    return out
