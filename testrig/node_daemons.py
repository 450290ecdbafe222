"""The daemons of a test-cluster node (dockerd, sshd): start them detached in the node's namespaces, wait until
they answer, stop them by PID (only ours), and the faults tests inject on a running node (a link down, sshd
stopped, a rotated host key). A mixin of `testrig.cluster.TestCluster`, which holds the nodes and paths.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from testrig.hostops import ClusterError, _alive, _docker_ping, _keygen, _run, _ssh_banner, _tail, log

if TYPE_CHECKING:
    from collections.abc import Sequence

    from testrig.cluster import Node
    from testrig.rootfs import NodeRoot

FABRIC_IFACE = "enp1s0f0np0"   # a CX-7 netdev name; names are per namespace, so both nodes use it
DATA_ROOT = Path("/var/lib/sparkctl-test")     # per-node docker data roots: image cache across runs


class NodeDaemons:
    """dockerd and sshd of each node, and the faults on them (needs TestCluster's nodes, roots, paths)."""

    if TYPE_CHECKING:   # what this mixin reads of TestCluster (for the type checker; TestCluster defines them)
        workdir: Path
        nodes: dict[str, Node]
        roots: dict[str, NodeRoot]

        @property
        def state_dir(self) -> Path: ...
        def node(self, name: str) -> Node: ...
        def _enter(self, node: Node) -> list[str]: ...
        def run_on(self, node: str, argv: Sequence[str], *, timeout: float = 60.0, check: bool = True,
                   input: str | None = None) -> subprocess.CompletedProcess[str]: ...

    def _pidfile(self, node: Node, what: str) -> Path:
        return self.state_dir / f"{node.name}.{what}.pid"

    def link_down(self, node: str, iface: str = FABRIC_IFACE) -> None:
        """Take an interface down inside a node (e.g. pull the fabric cable on one side)."""
        self.run_on(node, ["ip", "link", "set", iface, "down"])

    def link_up(self, node: str, iface: str = FABRIC_IFACE) -> None:
        """Bring an interface back up inside a node."""
        self.run_on(node, ["ip", "link", "set", iface, "up"])

    def stop_sshd(self, node: str) -> None:
        """Stop a node's sshd (by its PID): the node becomes unreachable over SSH, dockerd keeps running."""
        n = self.node(node)
        self._stop_pid(self._read_pid(n, "sshd"), n, "sshd", grace=5)
        self._pidfile(n, "sshd").unlink(missing_ok=True)
        n.sshd_pid = None

    def start_sshd(self, node: str, *, timeout: float = 30.0) -> None:
        """Start a node's sshd again (no-op if it is running) and wait until it answers."""
        n = self.node(node)
        if _alive(self._read_pid(n, "sshd")):
            return
        self._start_sshd(n)
        self._wait_sshd(n, timeout)

    def in_dockerd_mounts(self, node: str) -> list[str]:
        """argv prefix running a command in the mount namespace of a node's dockerd (it has its own: the node's
        /dev/shm), where a mount must be made for the daemon to see it (a full disk under its data root, say).
        Example: ``subprocess.run([*cluster.in_dockerd_mounts("spark-b"), "mount", "-t", "tmpfs", ...])``."""
        pid = self._read_pid(self.node(node), "dockerd")
        if not _alive(pid):
            raise ClusterError("dockerd is not running", where=node)
        return ["nsenter", f"--mount=/proc/{pid}/ns/mnt", "--"]

    def rotate_host_key(self, node: str) -> str:
        """Give a node a new SSH host key and restart its sshd; known_hosts is NOT updated (tests an
        unknown/changed host key). The original key is kept for ``restore_host_keys``. Returns the new
        public key line."""
        n = self.node(node)
        self.stop_sshd(node)
        pub = n.host_key.with_name(n.host_key.name + ".pub")
        saved = n.host_key.with_name(n.host_key.name + ".orig")
        if not saved.exists():                     # rotated twice: keep the very first key
            n.host_key.rename(saved)
            pub.rename(saved.with_name(saved.name + ".pub"))
        for path in (n.host_key, pub):
            path.unlink(missing_ok=True)
        _keygen(n.host_key, f"host key {n.name} (rotated)")
        self.start_sshd(node)
        return pub.read_text().strip()

    def restore_host_keys(self) -> None:
        """Give every node whose key ``rotate_host_key`` changed its original key back (sshd restarted), so what
        recorded the old key stays valid: the controller's known_hosts and the fabric known_hosts that
        ``prepare`` wrote on rank 0 (a rotated key left behind broke later modules' fabric SSH check)."""
        for n in self.nodes.values():
            saved = n.host_key.with_name(n.host_key.name + ".orig")
            if not saved.exists():
                continue
            self.stop_sshd(n.name)
            saved.replace(n.host_key)
            saved.with_name(saved.name + ".pub").replace(n.host_key.with_name(n.host_key.name + ".pub"))
            self.start_sshd(n.name)

    def _spawn(self, node: Node, what: str, argv: list[str], enter: list[str] | None = None) -> int:
        """Start a long-running process in the node's netns, detached (own session), logging to a file."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        logfile = self.workdir / "logs" / f"{node.name}-{what}.log"
        with open(logfile, "ab") as out:
            proc = subprocess.Popen([*(enter or self._enter(node)), *argv], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._pidfile(node, what).write_text(f"{proc.pid}\n")   # nsenter execs argv: same PID
        return proc.pid

    def _start_dockerd(self, node: Node) -> None:
        data_root = DATA_ROOT / node.netns
        data_root.mkdir(parents=True, exist_ok=True)
        # In a mount and IPC namespace of its own whose /dev/shm is the node's (Node.shm_dir): containers started with
        # --ipc host (every engine rank) see the node's shared memory, as on a Spark, not the machine's.
        node.dockerd_pid = self._spawn(node, "dockerd", [
            "unshare", "--mount", "--ipc", "--propagation", "private", "--", "sh", "-c",
            'mount --bind "$0" /dev/shm && exec "$@"', str(node.shm_dir),
            "dockerd", "--config-file", str(node.dir / "daemon.json"), "--data-root", str(data_root),
            "--exec-root", f"/run/docker-{node.netns}", "-H", node.docker_host,
            "--pidfile", f"/run/docker-{node.netns}.pid", "--bridge=none", "--iptables=false"])

    def _start_sshd(self, node: Node) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)   # sshd's privilege separation directory
        check = _run(["/usr/sbin/sshd", "-t", "-f", str(node.sshd_config)], check=False)
        if check.returncode:
            raise ClusterError("sshd rejected its config", where=node.name, evidence=check.stderr)
        node.sshd_pid = self._spawn(node, "sshd", ["/usr/sbin/sshd", "-D", "-e", "-f", str(node.sshd_config)],
                                    enter=self.roots[node.name].nsenter())   # in the node's own root

    def _wait_dockerd(self, node: Node, timeout: float) -> None:
        self._wait(node, "dockerd", lambda: _docker_ping(node.docker_socket), timeout)

    def _wait_sshd(self, node: Node, timeout: float) -> None:
        self._wait(node, "sshd", lambda: _ssh_banner(node.mgmt_address), timeout)

    def _wait(self, node: Node, what: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pid = self._read_pid(node, what)
        while time.monotonic() < deadline:
            if ready():
                return
            if not _alive(pid):
                break
            time.sleep(0.2)
        logfile = self.workdir / "logs" / f"{node.name}-{what}.log"
        state = "exited" if not _alive(pid) else f"did not answer within {timeout:.0f}s"
        raise ClusterError(f"{what} {state}", where=node.name, hint=f"see {logfile}", evidence=_tail(logfile))

    def _read_pid(self, node: Node, what: str) -> int | None:
        try:
            return int(self._pidfile(node, what).read_text().strip())
        except (OSError, ValueError):
            return None

    def _netns_pids(self, node: Node) -> list[int]:
        if not Path(f"/run/netns/{node.netns}").exists():
            return []
        out = _run(["ip", "netns", "pids", node.netns], check=False).stdout
        return [int(tok) for tok in out.split() if tok.isdigit()]

    def _is_ours(self, pid: int, node: Node) -> bool:
        """A PID is ours if it lives in the node's namespace, or its command line names the node's namespace."""
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{node.netns}").st_ino:
                return True
        except OSError:
            pass
        try:
            return node.netns.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False

    def _stop_pid(self, pid: int | None, node: Node, what: str, *, grace: float) -> None:
        """SIGTERM a PID we started, wait up to ``grace`` seconds, then SIGKILL; ignores PIDs not ours."""
        if not _alive(pid) or not self._is_ours(pid, node):   # type: ignore[arg-type]
            return
        assert pid is not None
        log.info("[%s] stopping %s (pid %d)", node.name, what, pid)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        if _alive(pid):
            log.warning("[%s] %s (pid %d) ignored SIGTERM for %.0fs: SIGKILL", node.name, what, pid, grace)
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
