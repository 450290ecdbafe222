"""SSH connector: run an argv on a node, move files, and fan out over nodes in parallel.

A connector only runs commands and moves files (parsing lives in `sparkctl.nodes.facts`,
decisions in `sparkctl.deploy`). Built on fabric (`Connection` for the session, SFTP
`put`/`get`, invoke's runner with timeouts) over paramiko, with three things fabric
does not do for us:

* **Host keys** (`sparkctl.nodes.hostkeys`). Fabric trusts any host (`AutoAddPolicy`). Here every key is checked
  against the inventory's known_hosts (`sparkctl_known_hosts`, default
  ``~/.ssh/known_hosts``): policy ``accept-new`` appends an unknown host's key on first
  contact (like OpenSSH's ``StrictHostKeyChecking=accept-new``), ``pinned`` refuses it.
  A *changed* key is always refused with a NodeError naming node, host, both
  fingerprints and the fix (``ssh-keygen -R``). Checking is never turned off.
* **Commands are argv lists.** The remote side of SSH is always a shell, so the argv is
  quoted with `shlex.join` at the very last step and nowhere else; a value like
  ``"name; rm -rf /"`` stays one argument (tested against a real sshd). The remote login
  shell must be POSIX (sh, bash, dash, zsh).
* **Exec on the paramiko channel.** `run` opens one channel per command on the shared
  transport (no pty, stdin fed then closed) and decodes stdout/stderr once at the end:
  invoke's runner (`Connection.run`) decodes every 1000-byte chunk on its own, which breaks
  UTF-8 characters that straddle a chunk (benchmarks/bench_ssh_run.py shows it).
* **Secrets.** `run(..., secrets=[...])` redacts those values from the logged command,
  from errors (CommandFailed carries the redacted argv and output tail) and from the
  returned result. Pass secret *data* through `stdin=` rather than the argv: stdin
  never shows up in a process list.

Only the inventory decides how to connect (user, port, key): ``~/.ssh/config`` and
fabric/invoke config files are not read, so a run does not depend on who runs it.
Connecting is bounded (5 s by default): a node whose SSH is down fails fast with a
NodeError naming the node and address.

Example::

    ssh = SSHConnector(inventory.node("spark-a"), inventory.cluster)
    print(ssh.run(["docker", "info", "--format", "{{json .}}"], check=True).stdout)
    results = run_all(inventory.nodes, lambda n: connector_for(inventory, n).run(["uname", "-r"]))  # nodes.fanout
    results.raise_for_failures()
"""
from __future__ import annotations

import contextlib
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from sparkctl.errors import NodeError
from sparkctl.extras import needed
from sparkctl.nodes.commandresult import CommandResult
from sparkctl.nodes.fanout import fan_out, raise_first
from sparkctl.nodes.hostkeys import fingerprint, host_key_name, key_type, known_hosts_path, missing_key_policy
from sparkctl.redaction import redact

if TYPE_CHECKING:  # heavy imports stay lazy: `sparkctl --help` must not import paramiko
    from fabric import Connection

    from sparkctl.config.inventory import ClusterSettings, Inventory, Node

log = logging.getLogger("sparkctl.nodes.ssh")

CONNECT_TIMEOUT_S = 5.0
CHANNEL_RETRIES = 8             # asks for a channel the server refused: about 3.5 s of waits in all
# Commands in flight on one connection at most (`run`): OpenSSH's default MaxSessions is 10, and a server at its
# limit refuses the channel (asked again, `_exec_started`: each refusal costs a wait and the node's sshd a session
# to reap). Independent reads run beside each other (preflight's node facts with the cross-node facts and the needed
# paths: up to 14 at once on one node: 17-19 refusals in each `up` on the test cluster), so the connector bounds them
# itself. sshd frees a session a little after its command ended: 48 commands from 24 threads were refused 0-4 times
# with 8 in flight, never with 7 or 6 (3 trials each); 6 leaves room for that lag and for what lives longer and is
# not counted here (a boot's log stream, a file copy).
SESSIONS = 6
SESSION_WAIT_S = 600.0          # the wait for a session of a command with no timeout of its own


# --------------------------------------------------------------------------------------------------- connector
@dataclass
class SSHConnector:
    """Runs commands and moves files on one node over one reused SSH connection (thread-safe).

    ``node`` is an inventory Node; ``cluster`` gives known_hosts and the host-key policy.
    """

    node: Node
    cluster: ClusterSettings | None = None
    connect_timeout_s: float = CONNECT_TIMEOUT_S
    _conn: Connection | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _sessions: threading.BoundedSemaphore = field(default_factory=lambda: threading.BoundedSemaphore(SESSIONS),
                                                  init=False, repr=False)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def address(self) -> str:
        s = self.node.ssh
        return f"{s.user}@{s.host}:{s.port}"

    # -- connection --------------------------------------------------------------------------------------------
    def connect(self) -> Connection:
        """Open (or reuse) the SSH connection; NodeError on unreachable host, bad host key or failed auth."""
        with self._lock:
            if self._conn is not None and self._conn.is_connected:
                return self._conn
            if self._conn is not None:
                self._close_quietly()
            self._conn = self._open()
            return self._conn

    def _open(self) -> Connection:
        with needed("nodes", f"SSH to node {self.node.name}"):
            import paramiko
            from fabric import Config, Connection

        s = self.node.ssh
        policy = self.cluster.host_key_policy if self.cluster else "accept-new"
        kh = known_hosts_path(self.cluster)
        kwargs: dict[str, float | str | bool] = {      # paramiko's connect() keywords
            "banner_timeout": self.connect_timeout_s, "auth_timeout": 2 * self.connect_timeout_s,
            "channel_timeout": 2 * self.connect_timeout_s}
        if s.key_file:
            key = os.path.expanduser(s.key_file)
            if not os.path.isfile(key):
                raise NodeError(f"SSH key {key} does not exist", where=f"[{self.name}] ssh",
                                hint="fix ansible_ssh_private_key_file in the inventory")
            kwargs.update(key_filename=key, look_for_keys=False, allow_agent=False)
        # lazy=True: no /etc/fabric.yml, ~/.fabric.yml or ~/.ssh/config; the inventory alone decides.
        config = Config(lazy=True, overrides={"load_ssh_configs": False, "run": {"in_stream": False}})
        conn = Connection(s.host, user=s.user, port=s.port, config=config, connect_kwargs=kwargs,
                          connect_timeout=max(1, round(self.connect_timeout_s)))
        client = conn.client
        if kh.is_file():
            try:
                client.load_host_keys(str(kh))
            except (OSError, paramiko.SSHException) as exc:
                raise NodeError(f"cannot read known_hosts {kh}: {exc}", where=f"[{self.name}] ssh",
                                hint="fix or remove the broken line (sparkctl_known_hosts in the inventory)") from None
        client.set_missing_host_key_policy(missing_key_policy(policy, self.name, kh))
        t0 = time.monotonic()
        try:
            conn.open()
        except NodeError:
            conn.close()
            raise
        except paramiko.BadHostKeyException as exc:
            conn.close()
            name = host_key_name(s.host, s.port)
            raise NodeError(
                f"host key of {name} CHANGED since it was recorded in {kh}; refusing to connect",
                where=f"[{self.name}] ssh",
                hint=f"this can mean the node was reinstalled, or someone is intercepting the connection: check the "
                     f"new key on the node's console (ssh-keygen -lf /etc/ssh/ssh_host_{key_type(exc.key)}_key.pub), "
                     f"then run `ssh-keygen -R {name} -f {kh}` and connect again",
                evidence=f"expected: {exc.expected_key.get_name()} {fingerprint(exc.expected_key)}\n"
                         f"offered:  {exc.key.get_name()} {fingerprint(exc.key)}") from None
        except paramiko.AuthenticationException as exc:
            conn.close()
            raise NodeError(f"SSH authentication failed for {self.address}: {exc}", where=f"[{self.name}] ssh",
                            hint="check ansible_user and ansible_ssh_private_key_file, and that the public key is in "
                                 "the node's authorized_keys") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            conn.close()
            reason = "timed out" if isinstance(exc, (socket.timeout, TimeoutError)) else str(exc) or type(exc).__name__
            raise NodeError(f"cannot reach {self.name} over SSH at {self.address} "
                            f"({reason}, after {time.monotonic() - t0:.1f}s)", where=f"[{self.name}] ssh",
                            hint="check the node is powered on and sshd runs, and ansible_host/ansible_port in the "
                                 "inventory") from None
        transport = conn.transport
        if transport is not None:
            transport.set_keepalive(15)
        log.debug("[%s] connected to %s in %.2fs", self.name, self.address, time.monotonic() - t0)
        return conn

    def close(self) -> None:
        with self._lock:
            self._close_quietly()

    def _close_quietly(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a dead connection
                self._conn.close()
            self._conn = None

    def __enter__(self) -> SSHConnector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commands ----------------------------------------------------------------------------------------------
    def run(self, argv: Sequence[str], *, check: bool = False, timeout: float | None = 60.0,
            stdin: str | bytes | None = None, merge_stderr: bool = False,
            secrets: Iterable[str] = (), on_line: Callable[[str], None] | None = None) -> CommandResult:
        """Run ``argv`` on the node; return rc/stdout/stderr (CommandFailed when ``check`` and rc != 0).

        ``stdin`` is fed to the command and then closed (secret data goes here, not in the argv).
        ``merge_stderr`` sends the command's stderr into stdout on the node (``2>&1``), keeping the
        order in which the command wrote them. ``secrets`` are replaced by ``***`` in everything returned
        or logged. A ``timeout`` (seconds) raises NodeError and closes the channel (sshd then hangs up
        on the command). ``on_line`` gets each complete stdout line (redacted) as it arrives, for progress.
        """
        argv = [str(a) for a in argv]
        if not argv:
            raise ValueError("empty argv")
        hide = _redactor(secrets)
        shown = [hide(a) for a in argv]
        command = shlex.join(argv) + (" 2>&1" if merge_stderr else "")
        log.debug("[%s] $ %s", self.name, shlex.join(shown))
        t0 = time.monotonic()
        conn = self.connect()
        # a session of this connection's SESSIONS, waited for within the command's own timeout
        if not self._session(SESSION_WAIT_S if timeout is None else timeout):
            raise NodeError(f"command {shown!r} found no free SSH session on {self.address} within "
                            f"{timeout or SESSION_WAIT_S:.0f}s ({SESSIONS} commands in flight)", where=f"[{self.name}]",
                            hint="the node may be very slow to answer; retry, or look at the node")
        try:
            lines = None if on_line is None else (lambda raw: on_line(hide(raw.decode("utf-8", "replace"))))
            left = None if timeout is None else max(timeout - (time.monotonic() - t0), 0.001)
            rc, out, err = self._exec_started(conn, command, stdin, left, lines)
        except TimeoutError:
            raise NodeError(f"command {shown!r} did not finish within {timeout:.0f}s", where=f"[{self.name}]",
                            hint="the node or its docker daemon may be hung; retry, or look at the node") from None
        except Exception as exc:  # noqa: BLE001 - the transport died mid-command (sshd restarted, link down)
            self._drop_if_dead(conn)
            detail = str(exc) if isinstance(exc, _NotStarted) else f"{type(exc).__name__}: {exc}"
            raise NodeError(f"SSH session to {self.address} failed running {shown!r}: {hide(detail)}",
                            where=f"[{self.name}] ssh",
                            hint="check the node is up; sparkctl reconnects on the next command") from None
        finally:
            self._sessions.release()
        result = CommandResult(self.name, shown, rc, hide(out.decode("utf-8", "replace")),
                               hide(err.decode("utf-8", "replace")), round(time.monotonic() - t0, 4))
        log.debug("[%s] exit %d in %.3fs", self.name, result.returncode, result.elapsed_s)
        return result.check() if check else result

    def _session(self, wait_s: float) -> bool:
        """One of the connection's SESSIONS, waited for at most `wait_s`, in short slices: an interrupt raised in
        this thread (`nodes.fanout` stops its workers so) is taken between them, never held by a blocked wait."""
        end = time.monotonic() + wait_s
        while True:
            left = end - time.monotonic()
            if self._sessions.acquire(timeout=max(min(left, 0.05), 0)):
                return True
            if left <= 0:
                return False

    def _exec_started(self, conn: Connection, command: str, stdin: str | bytes | None,
                      timeout: float | None,
                      on_line: Callable[[bytes], None] | None = None,
                      stop: threading.Event | None = None) -> tuple[int, bytes, bytes]:
        """``_exec``, asked again while the command has not started. A channel the server refused while the
        connection lives (sshd at MaxSessions: it frees a session only once it has reaped the command, late on a
        busy node) is requested again on the same connection, which other commands share, after a short wait. A
        connection found dead (sshd restarted, a link flapped, an idle session dropped) is replaced once."""
        reconnected = False
        for attempt in range(CHANNEL_RETRIES):
            try:
                return self._exec(conn, command, stdin, timeout, on_line, stop)
            except _NotStarted as exc:
                if conn.is_connected and attempt < CHANNEL_RETRIES - 1:
                    log.debug("[%s] channel refused (%s): asking again", self.name, exc)
                    time.sleep(min(0.05 * 2 ** attempt, 1.0))
                    continue
                if conn.is_connected or reconnected:
                    raise
                log.debug("[%s] connection lost before the command started (%s): reconnecting", self.name, exc)
                self._drop_if_dead(conn)
                conn, reconnected = self.connect(), True
        raise _NotStarted("no channel after reconnecting")

    def _drop_if_dead(self, conn: Connection) -> None:
        """Forget ``conn`` if it is still this connector's and has died (a live one serves other commands)."""
        with self._lock:
            ours = self._conn is conn
            if ours and not conn.is_connected:
                self._close_quietly()

    def follow(self, argv: Sequence[str], on_line: Callable[[str], None], *, stop: threading.Event,
               timeout: float) -> int | None:
        """Run ``argv`` on the node and hand each complete stdout line (decoded, without the newline) to ``on_line``
        as it arrives, until the command ends (its exit status is returned) or ``stop`` is set or ``timeout``
        passes (the channel is closed and None returned). The command's stdin stays open for as long as the channel
        does, so a command that reads it sees EOF when the channel closes, whoever closed it (this end, or the
        connection dying with a killed sparkctl): `docker_follow`'s script ends its `docker logs --follow` there.
        Nothing is redacted here: the caller redacts each line (its secrets may grow while following)."""
        argv = [str(a) for a in argv]
        log.debug("[%s] $ %s (following)", self.name, shlex.join(argv))
        conn = self.connect()
        try:
            rc, _, _ = self._exec_started(conn, shlex.join(argv) + " 2>&1", None, timeout,
                                          lambda raw: on_line(raw.decode("utf-8", "replace")), stop=stop)
        except (TimeoutError, _Stopped):
            return None
        except Exception as exc:  # noqa: BLE001 - the transport died mid-command
            self._drop_if_dead(conn)
            raise NodeError(f"SSH session to {self.address} failed following {argv[:3]!r}: "
                            f"{type(exc).__name__}: {exc}", where=f"[{self.name}] ssh",
                            hint="check the node is up; sparkctl reconnects on the next command") from None
        return rc

    def _exec(self, conn: Connection, command: str, stdin: str | bytes | None,
              timeout: float | None, on_line: Callable[[bytes], None] | None = None,
              stop: threading.Event | None = None) -> tuple[int, bytes, bytes]:
        """One exec channel: send stdin then EOF, collect stdout/stderr as bytes (decoded once, at the end, so a
        multi-byte character split between packets stays intact), return the exit status. ``on_line`` gets each
        complete stdout line (bytes, without the newline) as it arrives, and the unterminated rest at the end.
        With ``stop`` (`follow`): stdin is held open (never EOF, never /dev/null) and setting ``stop`` closes the
        channel and raises _Stopped; stdout is not kept (only ``on_line`` sees it), so it can run for hours."""
        import select

        with needed("nodes", f"SSH to node {self.node.name}"):
            import paramiko

        transport = conn.transport
        if transport is None or not transport.is_active():
            raise _NotStarted("SSH transport is closed")
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            chan = transport.open_session(timeout=self.connect_timeout_s)
        except (EOFError, OSError, paramiko.SSHException) as exc:
            raise _NotStarted(f"opening a channel failed: {type(exc).__name__}: {exc}") from exc
        try:
            if stop is not None:
                chan.exec_command(command)     # stdin held open: EOF on the node when this channel closes
            elif stdin is None:
                # Stdin from /dev/null on the node instead of an EOF message: paramiko queues a channel's EOF
                # outside its lock, so a command that ends at once can get its EOF sent after paramiko answered
                # the server's CLOSE, and OpenSSH then drops the whole connection ("ieof packet referred to
                # nonexistent channel"), failing every command that shares it.
                chan.exec_command(command + " </dev/null")
            else:
                chan.exec_command(command)
                chan.sendall(stdin.encode() if isinstance(stdin, str) else stdin)
                chan.shutdown_write()          # EOF on the command's stdin (it is still reading it)
            out, err = bytearray(), bytearray()
            fed = 0                          # stdout bytes already handed to on_line
            while True:
                if stop is not None and stop.is_set():
                    raise _Stopped
                busy = False
                if chan.recv_ready():
                    out += chan.recv(1 << 16)
                    busy = True
                    if on_line is not None and b"\n" in out[fed:]:
                        end = out.rindex(b"\n")
                        for line in bytes(out[fed:end]).split(b"\n"):
                            on_line(line)
                        fed = end + 1
                        if stop is not None:            # following: only the unterminated rest is kept
                            del out[:fed]
                            fed = 0
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(1 << 16)
                    busy = True
                if busy:
                    continue
                if chan.exit_status_ready() and (chan.eof_received or chan.closed):
                    if not chan.recv_ready() and not chan.recv_stderr_ready():
                        break
                    continue
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError
                if not transport.is_active():
                    raise EOFError("SSH transport closed during the command")
                select.select([chan], [], [], 0.02)
            if on_line is not None and fed < len(out):
                on_line(bytes(out[fed:]))
            rc = chan.recv_exit_status()
            if rc == -1 and not transport.is_active():
                # paramiko closes the channels of a dead transport with exit status -1: the command's fate is unknown
                raise EOFError("SSH transport closed during the command")
            return rc, bytes(out), bytes(err)
        finally:
            chan.close()

    def pipe_to(self, other: SSHConnector, src_argv: Sequence[str], dst_argv: Sequence[str], *,
                timeout: float = 1800.0) -> tuple[int, int, int]:
        """Stream ``src_argv``'s stdout on this node into ``dst_argv``'s stdin on ``other`` (through the controller).

        Example: ``a.pipe_to(b, ["docker", "save", img], ["docker", "load"])``. Returns (bytes moved, src exit
        code, dst exit code); a NodeError names the side that failed with its stderr tail.
        """
        import select

        deadline = time.monotonic() + timeout
        src = self.connect().transport.open_session(timeout=self.connect_timeout_s)
        dst = other.connect().transport.open_session(timeout=other.connect_timeout_s)
        moved = 0
        src_err, dst_err = bytearray(), bytearray()
        try:
            src.exec_command(shlex.join([str(a) for a in src_argv]))
            dst.exec_command(shlex.join([str(a) for a in dst_argv]))
            while True:
                if time.monotonic() > deadline:
                    raise NodeError(f"streaming {list(src_argv)!r} to [{other.name}] did not finish within "
                                    f"{timeout:.0f}s", where=f"[{self.name}] -> [{other.name}]")
                if src.recv_stderr_ready():
                    src_err += src.recv_stderr(1 << 16)
                if dst.recv_stderr_ready():
                    dst_err += dst.recv_stderr(1 << 16)
                if dst.recv_ready():
                    dst.recv(1 << 16)          # docker load's progress output: not needed
                if src.recv_ready():
                    data = src.recv(1 << 20)
                    if data:
                        dst.sendall(data)
                        moved += len(data)
                    continue
                if src.exit_status_ready() and not src.recv_ready():
                    break
                select.select([src, dst], [], [], 0.05)
            dst.shutdown_write()
            src_rc = src.recv_exit_status()
            while not dst.exit_status_ready() and time.monotonic() < deadline:
                if dst.recv_stderr_ready():
                    dst_err += dst.recv_stderr(1 << 16)
                if dst.recv_ready():
                    dst.recv(1 << 16)
                time.sleep(0.02)
            dst_rc = dst.recv_exit_status()
        finally:
            src.close()
            dst.close()
        if src_rc != 0 or dst_rc != 0:
            side, argv, err = ((self.name, src_argv, src_err) if src_rc != 0 else (other.name, dst_argv, dst_err))
            raise NodeError(f"{list(argv)!r} failed on [{side}] while streaming (exit {src_rc}/{dst_rc})",
                            where=f"[{self.name}] -> [{other.name}]",
                            evidence=bytes(err).decode("utf-8", "replace")[-2000:] or None)
        return moved, src_rc, dst_rc

    def run_many(self, argvs: Sequence[Sequence[str]], *, timeout: float | None = 60.0,
                 max_parallel: int = 8) -> list[CommandResult]:
        """Run several independent commands at once over the same connection (one channel each): one round-trip.

        Stays under OpenSSH's default MaxSessions (10) per connection.
        """
        self.connect()
        if not argvs:
            return []
        return raise_first(fan_out(list(argvs), lambda a: self.run(a, timeout=timeout),
                                   max_workers=min(max_parallel, len(argvs))))

    # -- files -------------------------------------------------------------------------------------------------
    def put(self, local: str | os.PathLike[str] | IO[bytes], remote: str, *, mode: int | None = None) -> None:
        """Copy a local file (or file-like object) to ``remote`` on the node (SFTP); optionally chmod it."""
        conn = self.connect()
        try:
            conn.put(local if not isinstance(local, os.PathLike) else os.fspath(local), remote=remote)
            if mode is not None:
                conn.sftp().chmod(remote, mode)
        except OSError as exc:
            raise NodeError(f"cannot copy to {self.name}:{remote}: {exc}", where=f"[{self.name}] sftp") from None

    def get(self, remote: str, local: str | os.PathLike[str] | IO[bytes]) -> None:
        """Copy ``remote`` from the node to a local path (or file-like object) over SFTP."""
        conn = self.connect()
        try:
            conn.get(remote, local=local if not isinstance(local, os.PathLike) else os.fspath(local))
        except OSError as exc:
            raise NodeError(f"cannot copy {self.name}:{remote}: {exc}", where=f"[{self.name}] sftp") from None


def _redactor(secrets: Iterable[str]) -> Callable[[str], str]:
    values = frozenset(secrets)
    return lambda text: redact(text, values)


class _NotStarted(EOFError):
    """The SSH channel for a command could not be opened: the command did not run on the node."""


class _Stopped(Exception):
    """`follow`'s caller set its stop event: the channel was closed on purpose."""


_POOL: dict[tuple[str, str, int, str, str], SSHConnector] = {}
_POOL_LOCK = threading.Lock()


def connector_for(inventory: Inventory, node: Node | str) -> SSHConnector:
    """The shared connector of a node (one SSH connection per node and process)."""
    node = inventory.node(node) if isinstance(node, str) else node
    s = node.ssh
    key = (node.name, s.host, s.port, s.user, str(known_hosts_path(inventory.cluster)))
    with _POOL_LOCK:
        conn = _POOL.get(key)
        if conn is None or conn.node != node or conn.cluster != inventory.cluster:
            if conn is not None:
                conn.close()                      # the node's entry changed: do not leak the old session
            conn = _POOL[key] = SSHConnector(node, inventory.cluster)
        return conn
