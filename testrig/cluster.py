"""A real two-node "Spark" test cluster on one Linux machine (root only).

Each node is a network namespace with its own OpenSSH server and its own Docker Engine; only the
GPU engine is emulated (the test engine image runs ``sparkctl.sim`` behind a ``sglang`` shim)::

    controller (root netns) --- bridge <prefix>-mgmt 198.19.N.254/24
        |-- veth <prefix>-spark-a <-> mgmt0 in netns <prefix>-spark-a  198.19.N.1   sshd :22, dockerd
        `-- veth <prefix>-spark-b <-> mgmt0 in netns <prefix>-spark-b  198.19.N.2   sshd :22, dockerd
    fabric: enp1s0f0np0 (A) <-> enp1s0f0np0 (B), MTU 9000, 198.18.N.1/24 <-> 198.18.N.2/24

The management network is a bridge (not one point-to-point veth per node) because that is what a desk
setup looks like: controller and both Sparks on one LAN, one controller address, nodes reachable from
each other over management too. The fabric is a direct cable, like the CX-7 QSFP link.

Example::

    cluster = TestCluster(Path("/tmp/tc"))
    cluster.up()                       # ~seconds when the image is cached
    print(cluster.inventory_path)      # Ansible-format inventory for sparkctl
    cluster.run_on("spark-a", ["ip", "-br", "addr"])
    cluster.down()

Each node also has its own UTS namespace (hostname ``spark-a``/``spark-b``, as ``docker info`` and logs show).
Processes are started with ``nsenter --net=/run/netns/NS --uts=...`` (``ip netns exec`` remounts /sys and hides the
cgroup mounts dockerd needs). Everything is stopped by PID (pidfiles under ``/run/sparkctl-test/``), and
``down()`` also clears the leftovers of a crashed run with the same prefix. Caches (the rootfs tarball under
``~/.cache/sparkctl/test-image/`` and each node's Docker data root under ``/var/lib/sparkctl-test/``) stay.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from sparkctl.errors import SparkctlError
from testrig import rootfs

log = logging.getLogger("sparkctl.testrig")

NODE_NAMES = ("spark-a", "spark-b")
FABRIC_IFACE = "enp1s0f0np0"   # a CX-7 netdev name; names are per namespace, so both nodes use it
MGMT_IFACE = "mgmt0"
FABRIC_MTU = 9000
STATE_ROOT = Path("/run/sparkctl-test")        # pidfiles: survive a crashed run, gone at reboot
DATA_ROOT = Path("/var/lib/sparkctl-test")     # per-node docker data roots: image cache across runs
IMAGE_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sparkctl" / "test-image"
PROJECT_DIR = Path(__file__).resolve().parents[1]
DEBIAN_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates", "procps", "iproute2", "curl")
ENGINE_REPO = "sparkctl-test-engine"
BASE_REPO = "sparkctl-test-base"

REQUIRED_COMMANDS = ("ip", "nsenter", "unshare", "mount", "umount", "pivot_root", "tar", "hostname", "dockerd", "docker", "runc", "/usr/sbin/sshd", "ssh", "ssh-keygen",
                     "ssh-keyscan", "ping")


class ClusterError(SparkctlError):
    """The test cluster could not be brought up, used or torn down."""


def missing_prerequisites(*, need_image_build: bool = True) -> list[str]:
    """What this machine lacks to run the cluster (empty when ready). Example: ``['not root']``."""
    missing = [] if os.geteuid() == 0 else ["not root (network namespaces and dockerd need root)"]
    commands = REQUIRED_COMMANDS + (("mmdebstrap",) if (need_image_build and not _rootfs_path().exists())
                                    or not rootfs.lower_dir().exists() else ())
    missing += [f"command {c!r} not found (apt-get install -y docker.io openssh-server openssh-client "
                f"mmdebstrap iproute2 iputils-ping util-linux)" for c in commands if shutil.which(c) is None]
    return missing


@dataclass
class Node:
    """One emulated Spark: where it lives and what runs in it."""

    name: str
    rank: int
    netns: str
    mgmt_address: str
    fabric_address: str
    fabric_iface: str
    docker_socket: Path
    host_root: Path                   # the node's "host paths" (models, cache) live under here
    dir: Path                         # workdir/<name>: keys, configs, logs
    sshd_pid: int | None = None
    dockerd_pid: int | None = None

    @property
    def docker_host(self) -> str:
        """DOCKER_HOST URL of this node's daemon, e.g. ``unix:///run/docker-spk-spark-a.sock``."""
        return f"unix://{self.docker_socket}"

    @property
    def sshd_config(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"


@dataclass
class TestCluster:
    """Two network-namespace "Sparks" with real sshd + dockerd, and an inventory pointing at them.

    ``name_prefix`` (1-6 lowercase letters/digits) names namespaces, links and pidfiles; ``net_index`` picks
    the subnets (198.19.<i>.0/24 management, 198.18.<i>.0/24 fabric) so two clusters can coexist.
    """

    __test__ = False   # not a pytest test class despite the name

    workdir: Path
    name_prefix: str = "spk"
    net_index: int = 0
    build_image: bool = True
    nodes: dict[str, Node] = field(init=False)
    engine_image: str | None = field(init=False, default=None)
    engine_image_id: str | None = field(init=False, default=None)
    timings: dict[str, float] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9]{1,6}", self.name_prefix):
            raise ClusterError(f"bad name prefix {self.name_prefix!r}", hint="use 1-6 lowercase letters/digits")
        if not 0 <= self.net_index <= 255:
            raise ClusterError(f"bad net index {self.net_index}", hint="use 0..255")
        self.workdir = Path(self.workdir).resolve()
        self.nodes = {}
        for rank, name in enumerate(NODE_NAMES):
            netns = f"{self.name_prefix}-{name}"
            self.nodes[name] = Node(
                name=name, rank=rank, netns=netns,
                mgmt_address=f"198.19.{self.net_index}.{rank + 1}",
                fabric_address=f"198.18.{self.net_index}.{rank + 1}",
                fabric_iface=FABRIC_IFACE, docker_socket=Path(f"/run/docker-{netns}.sock"),
                host_root=self.workdir / "srv" / name, dir=self.workdir / name)
        self.roots = {n.name: rootfs.NodeRoot(n.name, n.netns, n.dir / "root", self.state_dir, self._enter(n),
                                              [n.host_root, n.dir, self.authorized_keys_path, self.state_dir,
                                               rootfs.DOCKER_CERTS_D])
                      for n in self.nodes.values()}

    # ----------------------------------------------------------------- paths
    @property
    def controller_address(self) -> str:
        return f"198.19.{self.net_index}.254"

    @property
    def bridge(self) -> str:
        return f"{self.name_prefix}-mgmt"

    @property
    def inventory_path(self) -> Path:
        return self.workdir / "inventory.yml"

    @property
    def known_hosts_path(self) -> Path:
        return self.workdir / "known_hosts"

    @property
    def ssh_key_path(self) -> Path:
        return self.workdir / "id_ed25519"

    @property
    def authorized_keys_path(self) -> Path:
        return self.workdir / "authorized_keys"

    @property
    def state_dir(self) -> Path:
        return STATE_ROOT / self.name_prefix

    def node(self, name: str) -> Node:
        """The node called ``name`` (``spark-a``/``spark-b``), or a ClusterError listing the names."""
        try:
            return self.nodes[name]
        except KeyError:
            raise ClusterError(f"no node {name!r}", hint=f"nodes are {', '.join(self.nodes)}") from None

    def _pidfile(self, node: Node, what: str) -> Path:
        return self.state_dir / f"{node.name}.{what}.pid"

    def _uts_file(self, node: Node) -> Path:
        """Bind-mounted UTS namespace holding the node's hostname (so ``hostname``/``docker info`` say spark-a)."""
        return self.state_dir / f"{node.name}.uts"

    def _enter(self, node: Node) -> list[str]:
        """argv prefix entering the node: its network namespace and its hostname (nsenter, not ip netns exec)."""
        return ["nsenter", f"--net=/run/netns/{node.netns}", f"--uts={self._uts_file(node)}"]

    # ----------------------------------------------------------------- lifecycle
    def up(self, *, timeout: float = 60.0) -> "TestCluster":
        """Create namespaces and links, start sshd + dockerd per node, write known_hosts + inventory, ensure
        the engine image on both nodes. Cleans a crashed run with the same prefix first; tears down on failure.
        """
        missing = missing_prerequisites(need_image_build=self.build_image)
        if missing:
            raise ClusterError("test cluster prerequisites missing", evidence="\n".join(missing))
        self.down()
        self._check_subnets_free()
        try:
            with self._timed("keys"):
                self._make_keys()
            with self._timed("network"):
                self._make_network()
            with self._timed("rootfs"):
                for node in self.nodes.values():
                    self._make_root(node)
            with self._timed("daemons"):
                for node in self.nodes.values():
                    self._start_dockerd(node)
                for node in self.nodes.values():
                    self._wait_dockerd(node, timeout)
                    self._enter_root(node)   # binds dockerd's socket: after it exists
                    self._start_sshd(node)
                for node in self.nodes.values():
                    self._wait_sshd(node, timeout)
            with self._timed("known_hosts+inventory"):
                self._write_known_hosts()
                self._write_inventory()
            if self.build_image:
                with self._timed("image"):
                    self.ensure_engine_image()
                self._write_inventory()  # now naming the engine image (sparkctl_engine_image)
        except BaseException:
            log.error("test cluster bring-up failed; logs kept under %s", self.workdir)
            self.down()
            raise
        self._write_state()
        log.info("test cluster %s up: %s", self.name_prefix,
                 ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items()))
        return self

    def down(self) -> None:
        """Stop what ``up()`` started (by PID) and remove namespaces and links. Idempotent; keeps caches."""
        for node in self.nodes.values():
            self._stop_pid(self._read_pid(node, "dockerd"), node, "dockerd", grace=30)
            self._stop_pid(self._read_pid(node, "sshd"), node, "sshd", grace=5)
            for pid in self._netns_pids(node):          # containers, shims: anything left in *our* namespace
                self._stop_pid(pid, node, "leftover", grace=5)
            node.sshd_pid = node.dockerd_pid = None
            for path in (self._pidfile(node, "dockerd"), self._pidfile(node, "sshd"), node.docker_socket,
                         Path(f"/run/docker-{node.netns}.pid")):
                path.unlink(missing_ok=True)
            rootfs.release(self.state_dir, node.name)
            host_end = f"{self.name_prefix}-{node.name}"
            if _link_exists(host_end):   # before the netns: its deletion removes the veth asynchronously
                _run(["ip", "link", "delete", host_end], check=False)
            if Path(f"/run/netns/{node.netns}").exists():
                _run(["ip", "netns", "delete", node.netns])
            uts = self._uts_file(node)
            if uts.exists():
                if os.path.ismount(uts):
                    _run(["umount", str(uts)])
                uts.unlink()
        if _link_exists(self.bridge):
            _run(["ip", "link", "delete", self.bridge], check=False)
        rootfs.release_dir(self.state_dir)
        if self.state_dir.is_dir() and not any(self.state_dir.iterdir()):
            self.state_dir.rmdir()

    def __enter__(self) -> "TestCluster":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ----------------------------------------------------------------- fault injection and access
    def docker_host(self, node: str) -> str:
        """DOCKER_HOST URL of a node's daemon (from the controller, same machine)."""
        return self.node(node).docker_host

    def run_on(self, node: str, argv: Sequence[str], *, timeout: float = 60.0, check: bool = True,
               input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside a node (its network namespace and hostname; DOCKER_HOST set to its daemon).

        Example: ``cluster.run_on("spark-a", ["ping", "-c1", "198.18.0.2"])``.
        """
        n = self.node(node)
        env = {**os.environ, "DOCKER_HOST": n.docker_host}
        return _run([*self._enter(n), *argv], timeout=timeout, check=check,
                    env=env, input=input)

    def run_in_root(self, node: str, argv: Sequence[str], *, timeout: float = 60.0, check: bool = True,
                    input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside a node with its own root filesystem too (what an SSH session on it sees).

        Example: ``cluster.run_in_root("spark-b", ["cat", "/etc/docker/daemon.json"])``.
        """
        n = self.node(node)
        return _run([*self.roots[n.name].nsenter(), *argv], timeout=timeout, check=check, input=input,
                    env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"})

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

    def ssh_argv(self, node: str, *command: str) -> list[str]:
        """An ``ssh`` argv running ``command`` on ``node`` as root, with the cluster key and strict host-key
        checking. The remote side parses one shell string, so the argv is quoted here (``shlex.join``)."""
        n = self.node(node)
        return ["ssh", "-i", str(self.ssh_key_path), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={self.known_hosts_path}",
                "-o", "ConnectTimeout=5", f"root@{n.mgmt_address}", *([shlex.join(command)] if command else [])]

    def status(self) -> dict[str, object]:
        """A JSON-able view: per node namespace, addresses, PIDs and whether each is alive."""
        out: dict[str, object] = {"prefix": self.name_prefix, "workdir": str(self.workdir),
                                  "inventory": str(self.inventory_path), "engine_image": self._state().get(
                                      "engine_image"), "nodes": {}}
        for n in self.nodes.values():
            sshd, dockerd = self._read_pid(n, "sshd"), self._read_pid(n, "dockerd")
            out["nodes"][n.name] = {  # type: ignore[index]
                "netns": n.netns, "netns_exists": Path(f"/run/netns/{n.netns}").exists(),
                "mgmt_address": n.mgmt_address, "fabric_address": n.fabric_address, "docker_host": n.docker_host,
                "sshd_pid": sshd, "sshd_alive": _alive(sshd), "dockerd_pid": dockerd, "dockerd_alive": _alive(dockerd)}
        return out

    # ----------------------------------------------------------------- engine image
    def ensure_engine_image(self) -> str:
        """Make sure both nodes hold the same test engine image; returns its tag (see `testrig.engine_image`)."""
        from testrig.engine_image import EngineImages

        self.engine_image, self.engine_image_id = EngineImages(self).ensure()
        return self.engine_image

    # ----------------------------------------------------------------- bring-up steps
    def _check_subnets_free(self) -> None:
        routes = _run(["ip", "-4", "route", "show"]).stdout
        for subnet in (f"198.19.{self.net_index}.", f"198.18.{self.net_index}."):
            if subnet in routes:
                raise ClusterError(f"subnet {subnet}0/24 is already routed on this machine",
                                   hint="another test cluster is up (scripts/test-cluster down), or pick "
                                        "another net_index", evidence=routes)

    def _make_keys(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        if not self.ssh_key_path.exists():
            _keygen(self.ssh_key_path, f"sparkctl test cluster {self.name_prefix}")
        shutil.copy2(self.ssh_key_path.with_suffix(".pub"), self.authorized_keys_path)
        self.authorized_keys_path.chmod(0o600)
        for node in self.nodes.values():
            node.dir.mkdir(parents=True, exist_ok=True)
            for sub in ("models", "cache"):
                (node.host_root / sub).mkdir(parents=True, exist_ok=True)
            if not node.host_key.exists():
                _keygen(node.host_key, f"host key {node.name}")
            (node.dir / "daemon.json").write_text(json.dumps({"runtimes": {"nvidia": {"path": "runc"}}}, indent=2))
            node.sshd_config.write_text("\n".join([
                "# sshd for one emulated Spark (sparkctl test cluster)",
                "Port 22", f"ListenAddress {node.mgmt_address}",
                f"ListenAddress {node.fabric_address}",   # node-to-node copies over the fabric (prepare)
                f"HostKey {node.host_key}", f"PidFile {self._pidfile(node, 'sshd')}",
                "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes", "PermitRootLogin prohibit-password",
                f"AuthorizedKeysFile {self.authorized_keys_path} .ssh/authorized_keys",
                # StrictModes would reject an AuthorizedKeysFile below a world-writable /tmp (pytest's tmp dirs).
                "StrictModes no",
                f"SetEnv DOCKER_HOST={node.docker_host}",
                "Subsystem sftp /usr/lib/openssh/sftp-server", "LogLevel VERBOSE", ""]))

    def _make_network(self) -> None:
        p, br = self.name_prefix, self.bridge
        _run(["ip", "link", "add", br, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.controller_address}/24", "dev", br])
        _run(["ip", "link", "set", br, "up"])
        a, b = self.nodes.values()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for n in (a, b):
            _run(["ip", "netns", "add", n.netns])
            self._uts_file(n).touch()
            _run(["unshare", f"--uts={self._uts_file(n)}", "hostname", n.name])
            host_end = f"{p}-{n.name}"
            _run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", MGMT_IFACE, "netns", n.netns])
            _run(["ip", "link", "set", host_end, "master", br, "up"])
        _run(["ip", "link", "add", FABRIC_IFACE, "netns", a.netns, "mtu", str(FABRIC_MTU), "type", "veth",
              "peer", "name", FABRIC_IFACE, "netns", b.netns, "mtu", str(FABRIC_MTU)])
        for n in (a, b):
            ns = ["ip", "-n", n.netns]
            _run([*ns, "link", "set", "lo", "up"])
            _run([*ns, "addr", "add", f"{n.mgmt_address}/24", "dev", MGMT_IFACE])
            _run([*ns, "link", "set", MGMT_IFACE, "up"])
            _run([*ns, "addr", "add", f"{n.fabric_address}/24", "dev", FABRIC_IFACE])
            _run([*ns, "link", "set", FABRIC_IFACE, "up"])

    def _make_root(self, node: Node) -> None:
        try:
            self.roots[node.name].make(log_dir=self.workdir / "logs", daemon_json=node.dir / "daemon.json",
                                       hostname=node.name)
        except rootfs.RootfsError as exc:
            raise ClusterError("node root filesystem failed", where=node.name, evidence=str(exc)) from None

    def _enter_root(self, node: Node) -> None:
        try:
            self.roots[node.name].enter_namespace(node.docker_socket)
        except rootfs.RootfsError as exc:
            raise ClusterError("node mount namespace failed", where=node.name, evidence=str(exc)) from None

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
        node.dockerd_pid = self._spawn(node, "dockerd", [
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

    def _write_known_hosts(self) -> None:
        hosts = [n.mgmt_address for n in self.nodes.values()]
        result = _run(["ssh-keyscan", "-T", "5", "-t", "ed25519", *hosts], timeout=30)
        lines = sorted(line for line in result.stdout.splitlines() if line and not line.startswith("#"))
        if len(lines) != len(hosts):
            raise ClusterError("ssh-keyscan did not return every node's host key", evidence=result.stdout + result.stderr)
        _atomic_write(self.known_hosts_path, "\n".join(lines) + "\n")

    def _write_inventory(self) -> None:
        """Ansible-format inventory (the format sparkctl's config loader reads)."""
        import yaml   # lazy: core dependency, but keep import time small

        hosts = {n.name: {
            "ansible_host": n.mgmt_address, "ansible_port": 22, "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.ssh_key_path), "sparkctl_rank": n.rank,
            "fabric_interface": n.fabric_iface, "fabric_address": n.fabric_address, "roce_hcas": [],
            "host_paths": {"models": str(n.host_root / "models"), "cache": str(n.host_root / "cache")},
            "runtime": "docker", "gpu_runtime": "nvidia"} for n in self.nodes.values()}
        cluster_vars: dict[str, object] = {"sparkctl_cluster": f"testcluster-{self.name_prefix}",
                                           "sparkctl_known_hosts": str(self.known_hosts_path),
                                           **rootfs.INVENTORY_VARS}   # the playbooks' hardware stand-ins
        if self.engine_image:
            cluster_vars["sparkctl_engine_image"] = self.engine_image
        doc = {"all": {"vars": cluster_vars,
                       "children": {"sparks": {"hosts": hosts}}}}
        _atomic_write(self.inventory_path, "# generated by testrig.cluster\n"
                      + yaml.safe_dump(doc, sort_keys=False))

    # ----------------------------------------------------------------- state and processes
    def _write_state(self) -> None:
        state = {"prefix": self.name_prefix, "engine_image": self.engine_image, "engine_image_id": self.engine_image_id,
                 "timings": self.timings, "nodes": {n.name: {k: str(v) if isinstance(v, Path) else v
                                                             for k, v in asdict(n).items()}
                                                    for n in self.nodes.values()}}
        _atomic_write(self.workdir / "cluster.json", json.dumps(state, indent=2) + "\n")

    def _state(self) -> dict[str, object]:
        try:
            return json.loads((self.workdir / "cluster.json").read_text())
        except (OSError, ValueError):
            return {}

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

    def _timed(self, name: str) -> "_Timer":
        return _Timer(self.timings, name)


class _Timer:
    """Context manager adding the elapsed seconds of a block to ``timings[name]``."""

    def __init__(self, timings: dict[str, float], name: str) -> None:
        self.timings, self.name = timings, name

    def __enter__(self) -> None:
        self.start = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.timings[self.name] = round(time.monotonic() - self.start, 2)


# --------------------------------------------------------------------- helpers
def _rootfs_key() -> str:
    return hashlib.sha256(f"{DEBIAN_SUITE} apt {','.join(sorted(BASE_PACKAGES))}".encode()).hexdigest()[:16]


def _rootfs_path() -> Path:
    return IMAGE_CACHE / f"rootfs-{DEBIAN_SUITE}-{_rootfs_key()}.tar"


def _run(argv: Sequence[str], *, timeout: float = 60.0, check: bool = True, env: dict[str, str] | None = None,
         input: str | None = None, stdin: object = None, log_to: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run an argv (never a shell string) with a timeout; on failure raise ClusterError with the output tail."""
    log.debug("run: %s", " ".join(argv))
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env,
                                input=input, stdin=stdin if input is None else None)  # type: ignore[arg-type]
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"command timed out after {timeout:.0f}s: {' '.join(argv)}") from exc
    if log_to is not None:
        log_to.parent.mkdir(parents=True, exist_ok=True)
        log_to.write_text(f"$ {' '.join(argv)}\n{result.stdout}{result.stderr}")
    if check and result.returncode != 0:
        raise ClusterError(f"command failed (exit {result.returncode}): {' '.join(argv)}",
                           evidence=_last_lines(result.stdout + result.stderr))
    return result


def _keygen(path: Path, comment: str) -> None:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def _link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"   # a zombie is dead


def _docker_ping(sock: Path) -> bool:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(str(sock))
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            status_line = s.recv(64).split(b"\r\n", 1)[0]
            return status_line.startswith(b"HTTP/1.") and status_line.split()[1:2] == [b"200"]
    except OSError:
        return False


def _ssh_banner(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=2) as s:
            return s.recv(64).startswith(b"SSH-2.0-")
    except OSError:
        return False


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(0o600)
    tmp.rename(path)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return _last_lines(path.read_text(errors="replace"), lines)
    except OSError:
        return f"(no log at {path})"


def _last_lines(text: str, lines: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


# --------------------------------------------------------------------- CLI (scripts/test-cluster)
def main(argv: Sequence[str] | None = None) -> int:
    """``test-cluster {up,down,status,env} [--workdir D] [--prefix P] [--net N] [--no-image]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="test-cluster", description="Two-node Spark test cluster on this machine")
    parser.add_argument("command", choices=["up", "down", "status", "env"])
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get(
        "SPARKCTL_TEST_CLUSTER_DIR", "/var/tmp/sparkctl-test-cluster")))
    parser.add_argument("--prefix", default=os.environ.get("SPARKCTL_TEST_CLUSTER_PREFIX", "spk"))
    parser.add_argument("--net", type=int, default=0, help="subnet index: 198.19.N.0/24 mgmt, 198.18.N.0/24 fabric")
    parser.add_argument("--no-image", action="store_true", help="skip the engine image")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        cluster = TestCluster(args.workdir, args.prefix, args.net, build_image=not args.no_image)
        if args.command == "up":
            start = time.monotonic()
            cluster.up()
            print(json.dumps({"up_seconds": round(time.monotonic() - start, 1), "timings": cluster.timings,
                              "inventory": str(cluster.inventory_path), "engine_image": cluster.engine_image}))
        elif args.command == "down":
            cluster.down()
        elif args.command == "status":
            print(json.dumps(cluster.status(), indent=2))
        else:
            env = {"SPARKCTL_INVENTORY": cluster.inventory_path, "SPARKCTL_TEST_KNOWN_HOSTS": cluster.known_hosts_path,
                   "SPARKCTL_TEST_SSH_KEY": cluster.ssh_key_path}
            env.update({f"SPARKCTL_TEST_DOCKER_HOST_{n.name.upper().replace('-', '_')}": n.docker_host
                        for n in cluster.nodes.values()})
            print("\n".join(f"export {k}={shlex.quote(str(v))}" for k, v in env.items()))
    except SparkctlError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    return 0
