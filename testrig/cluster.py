"""A real two- to four-node "Spark" test cluster on one Linux machine (root only).

Each node is a network namespace with its own OpenSSH server and its own Docker Engine; only the
GPU engine is emulated (the test engine image runs ``sparkctl.sim`` behind a ``sglang`` shim)::

    controller (root netns) --- bridge <prefix>-mgmt 198.19.N.254/24
        |-- veth <prefix>-spark-a <-> mgmt0 in netns <prefix>-spark-a  198.19.N.1   sshd :22, dockerd
        `-- veth <prefix>-spark-b <-> mgmt0 in netns <prefix>-spark-b  198.19.N.2   sshd :22, dockerd
    fabric: enp1s0f0np0 (A) <-> enp1s0f0np0 (B), MTU 9000, 198.18.N.1/24 <-> 198.18.N.2/24

The management network is a bridge (not one point-to-point veth per node) because that is what a desk
setup looks like: controller and both Sparks on one LAN, one controller address, nodes reachable from
each other over management too. With two nodes the fabric is a direct cable, like the CX-7 QSFP link.
With three or four (``node_count``; spark-a .. spark-d) it is a switch: a bridge ``<prefix>-fab`` (MTU
9000, no address, the controller is not on the fabric) with each node's ``enp1s0f0np0`` a veth into it
(host end ``<prefix>-fab-<letter>``), 198.18.N.<rank+1>/24, and the inventory says
``sparkctl_fabric_topology: switch`` with ``sparkctl_fabric_subnet: 198.18.N.0/24``::

    fabric: bridge <prefix>-fab, MTU 9000
        |-- <prefix>-fab-a <-> enp1s0f0np0 in spark-a  198.18.N.1/24
        |-- ...
        `-- <prefix>-fab-d <-> enp1s0f0np0 in spark-d  198.18.N.4/24

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
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testrig import rootfs
from testrig.cluster_net import FABRIC_MTU, MGMT_IFACE, ClusterNetwork  # noqa: F401 - tests import them here
from testrig.hostops import ClusterError, _alive, _atomic_write, _keygen, _run, _Timer, log
from testrig.node_daemons import DATA_ROOT, FABRIC_IFACE, NodeDaemons  # noqa: F401 - DATA_ROOT: tests import it from here

NODE_NAMES = ("spark-a", "spark-b")          # the two-node cluster (the default)
ALL_NODE_NAMES = ("spark-a", "spark-b", "spark-c", "spark-d")
MAX_NODES = len(ALL_NODE_NAMES)
STATE_ROOT = Path("/run/sparkctl-test")        # pidfiles: survive a crashed run, gone at reboot
IMAGE_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sparkctl" / "test-image"
PROJECT_DIR = Path(__file__).resolve().parents[1]
DEBIAN_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates", "procps", "iproute2", "curl")
ENGINE_REPO = "sparkctl-test-engine"
BASE_REPO = "sparkctl-test-base"

REQUIRED_COMMANDS = ("ip", "nsenter", "unshare", "mount", "umount", "pivot_root", "tar", "hostname", "dockerd",
                     "docker", "runc", "/usr/sbin/sshd", "ssh", "ssh-keygen", "ssh-keyscan", "ping")


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
    def kept_dir(self) -> Path:
        """A directory of the node's kept across runs (beside its Docker data root), seen at the same path by its SSH
        sessions and its dockerd: for what a Spark keeps between deployments (a ``host_paths.cache``)."""
        return DATA_ROOT / f"{self.netns}-kept"

    @property
    def shm_dir(self) -> Path:
        """The node's own /dev/shm (a directory of the machine's, bound over /dev/shm for its dockerd, containers and
        SSH sessions): a Spark's shared memory is its own, and SGLang decides which ranks share a node by whether
        they see each other's shared memory (two ranks seeing one /dev/shm wait forever for a local reader)."""
        return Path("/dev/shm") / f"sparkctl-test-{self.netns}"

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"


@dataclass
class TestCluster(ClusterNetwork, NodeDaemons):
    """Network-namespace "Sparks" (two by default, up to four) with real sshd + dockerd, and an inventory
    pointing at them.

    ``name_prefix`` (1-6 lowercase letters/digits) names namespaces, links and pidfiles; ``net_index`` picks
    the subnets (198.19.<i>.0/24 management, 198.18.<i>.0/24 fabric) so two clusters can coexist;
    ``node_count`` (2..4) is how many: two share a direct fabric cable, more a switch (bridge).
    """

    __test__ = False   # not a pytest test class despite the name

    workdir: Path
    name_prefix: str = "spk"
    net_index: int = 0
    build_image: bool = True
    node_count: int = 2
    nodes: dict[str, Node] = field(init=False)
    engine_image: str | None = field(init=False, default=None)
    engine_image_id: str | None = field(init=False, default=None)
    timings: dict[str, float] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9]{1,6}", self.name_prefix):
            raise ClusterError(f"bad name prefix {self.name_prefix!r}", hint="use 1-6 lowercase letters/digits")
        if not 0 <= self.net_index <= 255:
            raise ClusterError(f"bad net index {self.net_index}", hint="use 0..255")
        if not 2 <= self.node_count <= MAX_NODES:
            raise ClusterError(f"bad node count {self.node_count}", hint=f"use 2..{MAX_NODES}")
        self.workdir = Path(self.workdir).resolve()
        self.nodes = {}
        for rank, name in enumerate(ALL_NODE_NAMES[:self.node_count]):
            netns = f"{self.name_prefix}-{name}"
            self.nodes[name] = Node(
                name=name, rank=rank, netns=netns,
                mgmt_address=f"198.19.{self.net_index}.{rank + 1}",
                fabric_address=f"198.18.{self.net_index}.{rank + 1}",
                fabric_iface=FABRIC_IFACE, docker_socket=Path(f"/run/docker-{netns}.sock"),
                host_root=self.workdir / "srv" / name, dir=self.workdir / name)
        self.roots = {n.name: rootfs.NodeRoot(n.name, n.netns, n.dir / "root", self.state_dir, self._enter(n),
                                              [n.host_root, n.dir, self.authorized_keys_path, self.state_dir,
                                               rootfs.DOCKER_CERTS_D, n.kept_dir])
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
        """The node called ``name`` (``spark-a``, ``spark-b``, ...), or a ClusterError listing the names."""
        try:
            return self.nodes[name]
        except KeyError:
            raise ClusterError(f"no node {name!r}", hint=f"nodes are {', '.join(self.nodes)}") from None

    def _uts_file(self, node: Node) -> Path:
        """Bind-mounted UTS namespace holding the node's hostname (so ``hostname``/``docker info`` say spark-a)."""
        return self.state_dir / f"{node.name}.uts"

    def _enter(self, node: Node) -> list[str]:
        """argv prefix entering the node: its network namespace and its hostname (nsenter, not ip netns exec)."""
        return ["nsenter", f"--net=/run/netns/{node.netns}", f"--uts={self._uts_file(node)}"]

    # ----------------------------------------------------------------- lifecycle
    def up(self, *, timeout: float = 60.0) -> TestCluster:
        """Create namespaces and links, start sshd + dockerd per node, write known_hosts + inventory, ensure
        the engine image on every node. Cleans a crashed run with the same prefix first; tears down on failure.
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
                    node.kept_dir.mkdir(parents=True, exist_ok=True)
                    self._make_root(node)
            with self._timed("daemons"):
                for node in self.nodes.values():
                    shutil.rmtree(node.shm_dir, ignore_errors=True)
                    node.shm_dir.mkdir(mode=0o1777)
                    node.shm_dir.chmod(0o1777)
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
        """Stop what ``up()`` started (by PID) and remove namespaces and links. Idempotent; keeps caches.

        A node-count change between runs with one prefix is cleaned too: every node name a cluster can have
        is looked at (only the prefix's own namespaces, links and pidfiles)."""
        for node in self._every_possible_node():
            self._stop_pid(self._read_pid(node, "dockerd"), node, "dockerd", grace=30)
            self._stop_pid(self._read_pid(node, "sshd"), node, "sshd", grace=5)
            for pid in self._netns_pids(node):          # containers, shims: anything left in *our* namespace
                self._stop_pid(pid, node, "leftover", grace=5)
            node.sshd_pid = node.dockerd_pid = None
            for path in (self._pidfile(node, "dockerd"), self._pidfile(node, "sshd"), node.docker_socket,
                         Path(f"/run/docker-{node.netns}.pid")):
                path.unlink(missing_ok=True)
            rootfs.release(self.state_dir, node.name)
            shutil.rmtree(node.shm_dir, ignore_errors=True)
            self._remove_links(node)
            if Path(f"/run/netns/{node.netns}").exists():
                _run(["ip", "netns", "delete", node.netns])
            uts = self._uts_file(node)
            if uts.exists():
                if os.path.ismount(uts):
                    _run(["umount", str(uts)])
                uts.unlink()
        self._remove_bridges()
        rootfs.release_dir(self.state_dir)
        if self.state_dir.is_dir() and not any(self.state_dir.iterdir()):
            self.state_dir.rmdir()

    def _every_possible_node(self) -> list[Node]:
        """This cluster's nodes, plus the ones a larger cluster with the same prefix would have (for ``down``)."""
        extra = [Node(name=name, rank=rank, netns=f"{self.name_prefix}-{name}", mgmt_address="", fabric_address="",
                      fabric_iface=FABRIC_IFACE, docker_socket=Path(f"/run/docker-{self.name_prefix}-{name}.sock"),
                      host_root=self.workdir / "srv" / name, dir=self.workdir / name)
                 for rank, name in enumerate(ALL_NODE_NAMES) if name not in self.nodes]
        return [*self.nodes.values(), *extra]

    def __enter__(self) -> TestCluster:
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

    def _make_root(self, node: Node) -> None:
        try:
            self.roots[node.name].make(log_dir=self.workdir / "logs", daemon_json=node.dir / "daemon.json",
                                       hostname=node.name)
        except rootfs.RootfsError as exc:
            raise ClusterError("node root filesystem failed", where=node.name, evidence=str(exc)) from None

    def _enter_root(self, node: Node) -> None:
        try:
            self.roots[node.name].enter_namespace(node.docker_socket, shm=node.shm_dir)
        except rootfs.RootfsError as exc:
            raise ClusterError("node mount namespace failed", where=node.name, evidence=str(exc)) from None

    def _write_known_hosts(self) -> None:
        hosts = [n.mgmt_address for n in self.nodes.values()]
        result = _run(["ssh-keyscan", "-T", "5", "-t", "ed25519", *hosts], timeout=30)
        lines = sorted(line for line in result.stdout.splitlines() if line and not line.startswith("#"))
        if len(lines) != len(hosts):
            raise ClusterError("ssh-keyscan did not return every node's host key",
                               evidence=result.stdout + result.stderr)
        _atomic_write(self.known_hosts_path, "\n".join(lines) + "\n")

    def _write_inventory(self) -> None:
        """Ansible-format inventory (the format sparkctl's config loader reads)."""
        import yaml  # lazy: core dependency, but keep import time small

        hosts = {n.name: {
            "ansible_host": n.mgmt_address, "ansible_port": 22, "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.ssh_key_path), "sparkctl_rank": n.rank,
            "fabric_interface": n.fabric_iface, "fabric_address": n.fabric_address, "roce_hcas": [],
            "host_paths": {"models": str(n.host_root / "models"), "cache": str(n.host_root / "cache")},
            "runtime": "docker", "gpu_runtime": "nvidia"} for n in self.nodes.values()}
        cluster_vars: dict[str, object] = {"sparkctl_cluster": f"testcluster-{self.name_prefix}",
                                           "sparkctl_known_hosts": str(self.known_hosts_path),
                                           **rootfs.INVENTORY_VARS}   # the playbooks' hardware stand-ins
        if self.switched:   # one fabric subnet through the switch (sparkctl.config.inventory)
            cluster_vars.update(sparkctl_fabric_topology="switch", sparkctl_fabric_subnet=self.fabric_subnet)
        if self.engine_image:
            cluster_vars["sparkctl_engine_image"] = self.engine_image
        doc = {"all": {"vars": cluster_vars,
                       "children": {"sparks": {"hosts": hosts}}}}
        _atomic_write(self.inventory_path, "# generated by testrig.cluster\n"
                      + yaml.safe_dump(doc, sort_keys=False))

    # ----------------------------------------------------------------- state and processes
    def _write_state(self) -> None:
        state = {"prefix": self.name_prefix, "node_count": self.node_count, "engine_image": self.engine_image,
                 "engine_image_id": self.engine_image_id,
                 "timings": self.timings, "nodes": {n.name: {k: str(v) if isinstance(v, Path) else v
                                                             for k, v in asdict(n).items()}
                                                    for n in self.nodes.values()}}
        _atomic_write(self.workdir / "cluster.json", json.dumps(state, indent=2) + "\n")

    def _state(self) -> dict[str, object]:
        try:
            return json.loads((self.workdir / "cluster.json").read_text())
        except (OSError, ValueError):
            return {}

    def _timed(self, name: str) -> _Timer:
        return _Timer(self.timings, name)


def _rootfs_key() -> str:
    return hashlib.sha256(f"{DEBIAN_SUITE} apt {','.join(sorted(BASE_PACKAGES))}".encode()).hexdigest()[:16]


def _rootfs_path() -> Path:
    return IMAGE_CACHE / f"rootfs-{DEBIAN_SUITE}-{_rootfs_key()}.tar"
