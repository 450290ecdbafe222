"""Per-node root filesystems for the test cluster: what a playbook changes on spark-b is visible only there.

Each node gets a Debian root (mmdebstrap tarball cached under ``~/.cache/sparkctl/node-rootfs/``, extracted
once there and mounted per node as an overlay whose upper layer lives in the node's workdir; a plain copy
when overlayfs is not available) and a persistent private mount namespace (a bind-mounted nsfs file under
``/run/sparkctl-test/<prefix>/mnt/``) whose root is that filesystem (pivot_root). The node's sshd runs in
that namespace, so every SSH session (Ansible included) sees the node's own ``/etc``, python3, sudo, rsync,
netplan, and the node's host paths. dockerd stays in the root mount namespace with its per-node data root;
its socket, the docker CLI, the node's host paths (models, caches), its workdir (sshd config, host key) and
the cluster's authorized_keys are bind-mounted at the same absolute paths inside, so paths mean the same
thing on the controller, in the node and in ``docker run --mount``. The node's dockerd reads the node's own
``/etc/docker/daemon.json`` (the cluster's config file is a symlink into the node root).

Stand-ins for hardware the test machine lacks live in ``/opt/sparkctl-standins/bin`` inside each node and are
only on the PATH of playbook runs that ask for them (inventory var ``prepare_path_prefix``); plain SSH sessions
(preflight) do not see them. They print captured real output (copied under ``captures/`` next to them):

* ``nvidia-smi``: the DGX Spark idle table (driver 580.95.05) or, for ``--query-gpu=name``, ``NVIDIA GB10``;
* ``ibdev2netdev``: a two-Spark port-0-up listing;
* ``netplan``: ``generate``/``get`` are the real netplan (Debian's netplan.io parses and validates the files);
  ``apply`` validates with the real ``netplan generate`` then sets the addresses and MTU of the files'
  ethernets with ``ip`` (no systemd-networkd in a test node);
* ``systemctl``: ``restart|reload docker`` sends SIGHUP to the node's dockerd (reloads ``runtimes``; options
  that need a real restart, like ``log-opts``, apply to containers created after a real restart only).
"""
from __future__ import annotations

import ctypes
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("sparkctl.testrig")

DEBIAN_SUITE = "bookworm"
NODE_PACKAGES = ("python3", "python3-yaml", "openssh-server", "openssh-sftp-server", "sudo", "rsync", "iproute2",
                 "iputils-ping", "procps", "netplan.io", "ca-certificates",
                 "docker-registry", "openssl")   # the image pipeline's fabric copy runs a registry on the node
# Shared with the host at the same path: each node's dockerd runs in the host's mount namespace and reads the
# per-run registry CA that the image pipeline installs over SSH under /etc/docker/certs.d/<addr>:<port>/.
DOCKER_CERTS_D = Path("/etc/docker/certs.d")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sparkctl" / "node-rootfs"
STANDIN_DIR = "/opt/sparkctl-standins/bin"
INVENTORY_VARS = {"prepare_path_prefix": STANDIN_DIR}   # playbook runs put the stand-ins first on PATH
PROJECT_DIR = Path(__file__).resolve().parents[1]
CAPTURES = PROJECT_DIR / "tests" / "fixtures" / "captures" / "spark"
STANDIN_CAPTURES = {"nvidia-smi": "nvidia-smi-gb10-580.95-idle.txt",
                    "nvidia-smi-query-name": "dev-nvidia-ls-and-query-gpu-name-noheader.txt",
                    "ibdev2netdev": "ibdev2netdev-two-sparks-port0-up.txt"}


class RootfsError(RuntimeError):
    """Raised by the helpers here; cluster.py wraps it into its ClusterError."""


def rootfs_key() -> str:
    import hashlib
    return hashlib.sha256(f"{DEBIAN_SUITE} apt {','.join(sorted(NODE_PACKAGES))}".encode()).hexdigest()[:16]


def tarball_path() -> Path:
    return CACHE / f"node-{DEBIAN_SUITE}-{rootfs_key()}.tar"


def lower_dir() -> Path:
    return CACHE / f"node-{DEBIAN_SUITE}-{rootfs_key()}"


def _run(argv: Sequence[str], *, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and res.returncode:
        raise RootfsError(f"command failed (exit {res.returncode}): {' '.join(argv)}\n{res.stdout}{res.stderr}"[-3000:])
    return res


def ensure_lower(log_dir: Path) -> Path:
    """The extracted node rootfs (read-only lower layer), built with mmdebstrap once and cached; file-locked
    so clusters of other developers building at the same time wait instead of racing."""
    lower = lower_dir()
    if (lower / ".sparkctl-complete").exists():
        return lower
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (lower / ".sparkctl-complete").exists():
            return lower
        tar = tarball_path()
        if not tar.exists():
            tmp = tar.with_name(f"{tar.name}.{os.getpid()}.tmp")
            log.info("building the node rootfs with mmdebstrap (once; cached as %s)", tar)
            res = subprocess.run(["mmdebstrap", "--variant=apt", f"--include={','.join(NODE_PACKAGES)}",
                                  "--format=tar", DEBIAN_SUITE, str(tmp)], capture_output=True, text=True,
                                 timeout=1200)
            (log_dir / "mmdebstrap-node.log").write_text(res.stdout + res.stderr)
            if res.returncode:
                tmp.unlink(missing_ok=True)
                raise RootfsError(f"mmdebstrap failed (see {log_dir / 'mmdebstrap-node.log'})")
            tmp.rename(tar)
        work = lower.with_name(f"{lower.name}.{os.getpid()}.tmp")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        _run(["tar", "-x", "--numeric-owner", "-f", str(tar), "-C", str(work)], timeout=600)
        (work / ".sparkctl-complete").write_text(rootfs_key() + "\n")
        shutil.rmtree(lower, ignore_errors=True)
        work.rename(lower)
    return lower


@dataclass
class NodeRoot:
    """One node's root filesystem and mount namespace.

    ``binds``: host paths shown at the same absolute path inside (directories or files).
    """

    name: str
    netns: str
    root: Path                 # the node's / as seen from the controller (overlay mount point or copy)
    state_dir: Path            # /run/sparkctl-test/<prefix>
    enter: list[str]           # argv prefix entering the node's network + UTS namespaces
    binds: list[Path] = field(default_factory=list)

    @property
    def mntns(self) -> Path:
        return self.state_dir / "mnt" / self.name

    @property
    def record(self) -> Path:
        """Where this root is, for clean-up after a crashed run (whose workdir we no longer know)."""
        return self.state_dir / f"{self.name}.root"

    @property
    def overlay_dirs(self) -> tuple[Path, Path]:
        return self.root.with_name("rootfs-upper"), self.root.with_name("rootfs-work")

    def nsenter(self) -> list[str]:
        """argv prefix running a command inside the node: its network, hostname and root filesystem."""
        return [*self.enter, f"--mount={self.mntns}"]

    # ------------------------------------------------------------------ bring-up
    def make(self, *, log_dir: Path, daemon_json: Path, hostname: str) -> None:
        """Mount (or copy) the node's root and write its node-specific files. ``daemon_json`` (the file the
        node's dockerd reads) becomes a symlink to the node's /etc/docker/daemon.json."""
        DOCKER_CERTS_D.mkdir(parents=True, exist_ok=True)
        lower = ensure_lower(log_dir)
        upper, work = self.overlay_dirs
        for stale in (self.root, upper, work):   # a fresh node at every bring-up
            if not mounted(stale):
                shutil.rmtree(stale, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        upper.mkdir(exist_ok=True)
        work.mkdir(exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.record.write_text(json.dumps({"root": str(self.root), "daemon_json": str(daemon_json)}) + "\n")
        res = _run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={lower},upperdir={upper},workdir={work}", str(self.root)], check=False)
        if res.returncode:
            log.info("[%s] overlayfs unavailable (%s): copying the rootfs", self.name, res.stderr.strip())
            _run(["cp", "-a", f"{lower}/.", str(self.root)], timeout=600)
        etc = self.root / "etc"
        (etc / "hostname").write_text(f"{hostname}\n")
        (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n")
        (etc / "docker").mkdir(exist_ok=True)
        target = etc / "docker" / "daemon.json"
        if daemon_json.exists() and not daemon_json.is_symlink():
            shutil.copy2(daemon_json, target)
            daemon_json.unlink()
        daemon_json.symlink_to(target)
        self._write_standins()

    def _write_standins(self) -> None:
        bindir = self.root / STANDIN_DIR.lstrip("/")
        capdir = bindir.parent / "captures"
        bindir.mkdir(parents=True, exist_ok=True)
        capdir.mkdir(exist_ok=True)
        for name in set(STANDIN_CAPTURES.values()):
            shutil.copy2(CAPTURES / name, capdir / name)
        src = Path(__file__).with_name("standins.py").read_text()
        for tool in ("nvidia-smi", "ibdev2netdev", "netplan", "systemctl"):
            path = bindir / tool
            path.write_text(src)
            path.chmod(0o755)
        (bindir.parent / "node.json").write_text(json.dumps(
            {"node": self.name, "netns": self.netns, "captures": STANDIN_CAPTURES}) + "\n")

    def enter_namespace(self, docker_socket: Path, shm: Path | None = None) -> None:
        """Create the node's persistent mount namespace (binds, then pivot_root into the node's root).
        Called once dockerd's socket exists (it is bind-mounted). ``shm``: the node's own /dev/shm (the directory
        its dockerd binds there too), so a secret file an SSH session writes there is what a container mounts."""
        mnt = self.mntns.parent
        mnt.mkdir(parents=True, exist_ok=True)
        if not mounted(mnt):   # nsfs bind mounts need a mount whose propagation is not shared
            _run(["mount", "--bind", str(mnt), str(mnt)])
            _run(["mount", "--make-private", str(mnt)])
        self.mntns.touch()
        docker_cli = shutil.which("docker") or "/usr/bin/docker"
        pairs = [(str(p), str(p)) for p in [*self.binds, docker_socket]]
        pairs += [(str(docker_socket), "/run/docker.sock"), (docker_cli, "/usr/bin/docker")]
        spec: dict[str, object] = {"root": str(self.root), "binds": pairs, "shm": str(shm) if shm else None}
        _run([*self.enter, "unshare", f"--mount={self.mntns}", "--propagation", "private",
              sys.executable, str(Path(__file__).resolve()), json.dumps(spec)],
             timeout=60)   # stdlib only: runs by path

    # ------------------------------------------------------------------ tear-down
    def destroy(self) -> None:
        """Release the namespace and unmount the root. Idempotent; the node's processes must be stopped."""
        release(self.state_dir, self.name)


def mounted(path: Path | str) -> bool:
    """``path`` is a mount point (from /proc/self/mountinfo: os.path.ismount misses binds within one fs)."""
    want = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == want for line in f)


def overlays_with_upper(upper: Path | str, mountinfo: str | None = None) -> list[str]:
    """Where the overlays whose upper directory is ``upper`` (as given at mount time) are mounted now: a node root
    whose workdir was renamed since (pytest renames an old session's directory to garbage-*) is still found, though
    the path its record names is gone."""
    if mountinfo is None:
        with open("/proc/self/mountinfo") as f:
            mountinfo = f.read()
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        tail = fields[fields.index("-") + 1:]
        if len(tail) >= 3 and tail[0] == "overlay" and f"upperdir={upper}" in tail[2].split(","):
            found.append(fields[4].replace("\\040", " "))
    return found


def _unmount(path: Path | str) -> None:
    """Unmount every layer stacked on ``path`` (lazily if busy)."""
    for _ in range(8):
        if not mounted(path):
            return
        if _run(["umount", str(path)], check=False).returncode:
            _run(["umount", "--lazy", str(path)], check=False)


def release(state_dir: Path, name: str) -> None:
    """Unmount what ``NodeRoot`` mounted for node ``name`` (found from its record file after a crash)."""
    mntns = state_dir / "mnt" / name
    if mntns.exists():
        _unmount(mntns)
        mntns.unlink(missing_ok=True)
    record = state_dir / f"{name}.root"
    if record.exists():
        try:
            rec = json.loads(record.read_text())
        except ValueError:
            rec = {}
        if rec.get("root"):
            _unmount(rec["root"])
            for moved in overlays_with_upper(Path(rec["root"]).with_name("rootfs-upper")):
                _unmount(moved)
        link = Path(rec.get("daemon_json") or "/nonexistent")
        if link.is_symlink():   # the next bring-up writes a fresh file there
            link.unlink()
        record.unlink()


def release_dir(state_dir: Path) -> None:
    """Unmount the private bind of ``state_dir/mnt`` once no node namespace is kept there."""
    mnt = state_dir / "mnt"
    if mnt.is_dir() and not any(mnt.iterdir()):
        _unmount(mnt)
        if not any(mnt.iterdir()):
            mnt.rmdir()


# ---------------------------------------------------------------------- runs inside the new namespace
def _setup_namespace(spec: dict[str, object]) -> None:
    """In a fresh private mount namespace: mount proc/sys/dev/run/tmp and the binds under the node's root,
    then make it the namespace's root (pivot_root), dropping every view of the host's filesystem."""
    root = Path(str(spec["root"]))

    def mount(*args: str) -> None:
        _run(["mount", *args])

    mount("--bind", str(root), str(root))
    mount("-t", "proc", "proc", str(root / "proc"))
    mount("-t", "sysfs", "sysfs", str(root / "sys"))          # this netns's interfaces
    mount("--rbind", "/dev", str(root / "dev"))
    if spec.get("shm"):
        mount("--bind", str(spec["shm"]), str(root / "dev" / "shm"))
    mount("-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(root / "run"))
    mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", str(root / "tmp"))
    (root / "run" / "sshd").mkdir(mode=0o755)
    for src, dst in spec["binds"]:  # type: ignore[attr-defined]
        inside = root / str(dst).lstrip("/")
        if Path(src).is_dir():
            inside.mkdir(parents=True, exist_ok=True)
        else:
            inside.parent.mkdir(parents=True, exist_ok=True)
            inside.touch(exist_ok=True)
        mount("--bind", str(src), str(inside))
    os.chdir(root)
    (root / ".oldroot").mkdir(exist_ok=True)
    _run(["pivot_root", ".", ".oldroot"])
    os.chdir("/")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(b"/.oldroot", 2) != 0:   # MNT_DETACH
        raise RootfsError(f"umount /.oldroot failed: {os.strerror(ctypes.get_errno())}")
    os.rmdir("/.oldroot")


if __name__ == "__main__":
    _setup_namespace(json.loads(sys.argv[1]))
