"""The real-engine base image of the test cluster: the stand-in for a Spark's production SGLang base image.

What a Spark pulls from a registry (lmsysorg/sglang, scitrera/dgx-spark-sglang: SGLang installed into the system
Python's packages), made here without a registry: a Debian bookworm root filesystem (the test engine image's,
testrig.cluster's mmdebstrap tarball) + SGLang 0.5.23 on the CPU torch, i.e. testrig.realengine's virtualenv
``site-packages`` laid out as ``/usr/local/lib/python3.11/dist-packages`` (Debian's ``python3`` imports from there,
so ``python3 -m sglang.launch_server`` and the patch applier's ``find_spec("sglang")`` find it as in a real image).
The rootfs has its own package list (``rootfs_packages``).
The tiny models are NOT in it: a node's model directory is a read-only mount (``host_paths.models``), as on a Spark.

Why a hand-made ``docker save`` archive rather than ``docker build``: built once per machine and ``docker load``-ed
into every node's daemon, its image ID is the same on every node (the ID is the digest of a config we write with a
fixed creation time), exactly as two Sparks pulling one tag by digest hold one ID; ``docker build`` on one node +
``docker save | docker load`` to the other cost 108.8 s + 71.3 s per fresh machine (measured for issue 32), and
``docker import`` stamps each node's copy with its own time. The layers:

1. a Debian rootfs tarball as mmdebstrap made it: the test engine image's packages + g++ and Python's headers
   (torch's inductor compiles SGLang's CPU kernels at boot; ``rootfs_packages``);
2. the engine layer: the virtualenv's site-packages minus what the CPU server never loads (``SLIM``: torch's tests,
   C++ test binaries, triton's CUDA/ROCm toolchains; what is left is measured in ``info.json``).
   Files keep their modification times, so the virtualenv's compiled ``.pyc`` files stay valid and no container
   recompiles SGLang at boot.

Cached under ``~/.cache/sparkctl/real-engine-image/<key>/`` (key: the real-engine build's key, the rootfs, SLIM,
ENV and FORMAT), rebuilt when an input changes (the older archive removed); an flock serialises builders. Example::

    tag = ensure_real_engine_base(cluster)       # on every node, one image ID; ~1 s when already there

TEST IMAGE ONLY (no GPU, CPU torch). What it cannot stand in for: CUDA graphs, NCCL, the GB10 kernels
(docs/testing.md).
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from testrig.flock import exclusive
from testrig.realengine import RealEngine, ensure_real_engine

if TYPE_CHECKING:
    from testrig.cluster import Node, TestCluster

REPO = "sparkctl-test-sglang-real"
SGLANG_VERSION = "0.5.23"
DIST_PACKAGES = "usr/local/lib/python3.11/dist-packages"     # Debian bookworm's python3 (3.11) reads it
LABEL = "org.sparkctl.test-real-engine-base"
# What the CPU server never loads: fnmatch patterns over paths relative to site-packages (a matching directory
# drops all under it). Checked by booting TP=2 from the slim image and serving through every lifecycle path
# (tests/cluster/test_real_engine_containers.py); torch/bin/torch_shm_manager stays (torch's import checks it).
SLIM = (
    "torch/test", "torch/share/cmake", "torch/bin/test_*", "torch/bin/*Test", "torch/bin/protoc*",
    "triton/backends/nvidia/bin", "triton/backends/nvidia/lib", "triton/backends/amd/lib",
    "pip", "setuptools", "*.a",
)
ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONUNBUFFERED=1"]
LOAD_TIMEOUT_S = 900.0


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sparkctl" / "real-engine-image"


@dataclass(frozen=True)
class BaseArchive:
    """A built archive: its ``docker load`` input, tag and image ID, and what it measured when it was made."""

    root: Path
    tag: str
    image_id: str

    @property
    def info(self) -> dict[str, Any]:
        """What ``_build`` measured (sizes in bytes, seconds): JSON written by this module."""
        info: dict[str, Any] = json.loads((self.root / "info.json").read_text())
        return info

    def members(self) -> list[Path]:
        """The archive's files in ``docker load`` order: manifest, config, layer tars."""
        manifest = json.loads((self.root / "manifest.json").read_text())[0]
        return [self.root / "manifest.json", self.root / manifest["Config"],
                *(self.root / layer for layer in manifest["Layers"])]


# Bump when what `_build` writes changes in a way SLIM, ENV and DIST_PACKAGES do not show (the layer's order, owners,
# the config's fields): the key is these, not this file's bytes, so editing a docstring rebuilds nothing.
FORMAT = 1


def key(engine: RealEngine, rootfs: Path) -> str:
    inputs = {"format": FORMAT, "engine": engine.key, "rootfs": rootfs.name, "slim": SLIM, "env": ENV,
              "dist_packages": DIST_PACKAGES, "version": SGLANG_VERSION}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def rootfs_packages() -> tuple[str, ...]:
    """The test engine image's Debian packages + what SGLang's CPU path needs at boot: torch's inductor compiles the
    CPU kernels SGLang ``torch.compile``s with the system C++ compiler (``InvalidCxxCompiler: No working C++ compiler
    found`` without g++), against Python's headers. lmsysorg's images are CUDA *devel* images: they carry both."""
    from testrig.cluster import BASE_PACKAGES

    return (*BASE_PACKAGES, "g++", "python3-dev")


def ensure_rootfs(log_dir: Path | None = None) -> Path:
    """The cached Debian rootfs tarball of this image (mmdebstrap, once per machine; keyed by its package list)."""
    from testrig.cluster import DEBIAN_SUITE, IMAGE_CACHE
    from testrig.hostops import _run

    packages = rootfs_packages()
    k = hashlib.sha256(f"{DEBIAN_SUITE} apt {','.join(sorted(packages))}".encode()).hexdigest()[:16]
    path = IMAGE_CACHE / f"rootfs-{DEBIAN_SUITE}-real-{k}.tar"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(path.with_name(path.name + ".lock"), 1800.0, poll_s=1.0):
        if not path.is_file():
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            _run(["mmdebstrap", "--variant=apt", f"--include={','.join(packages)}", "--format=tar", DEBIAN_SUITE,
                  str(tmp)], timeout=1200, log_to=(log_dir or path.parent) / "mmdebstrap-real.log")
            tmp.rename(path)
    return path


def ensure_archive(engine: RealEngine | None = None, rootfs: Path | None = None) -> BaseArchive:
    """The cached archive for the current inputs, built first when missing (safe across processes)."""
    engine = engine or ensure_real_engine(with_drafter=False)
    rootfs = rootfs or ensure_rootfs()
    k = key(engine, rootfs)
    root = cache_root() / k
    if not (root / "info.json").is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        with exclusive(root.parent / f"{k}.lock", 1800.0, poll_s=1.0):
            if not (root / "info.json").is_file():
                _build(root, engine, rootfs, k)
    manifest = json.loads((root / "manifest.json").read_text())[0]
    return BaseArchive(root=root, tag=manifest["RepoTags"][0], image_id="sha256:" + manifest["Config"][:-5])


def _build(root: Path, engine: RealEngine, rootfs: Path, k: str) -> None:
    started = time.monotonic()
    tmp = root.with_name(f"{root.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    rootfs_id = _sha256_file(rootfs)
    if _same_fs(rootfs, tmp):
        os.link(rootfs, tmp / "rootfs.tar")     # no copy of the 200 MB tarball the test engine image keeps
    else:
        shutil.copy2(rootfs, tmp / "rootfs.tar")
    site = _site_packages(engine)
    engine_id, engine_bytes, dropped, site_bytes = _write_engine_layer(site, tmp / "engine.tar")
    tag = f"{REPO}:{SGLANG_VERSION}-{k[:12]}"
    config = {
        "architecture": "amd64", "os": "linux", "created": "2026-01-01T00:00:00Z",
        "config": {"Env": ENV, "Cmd": ["python3", "-m", "sglang.launch_server", "--help"],
                   "Labels": {LABEL: tag, "org.sparkctl.real-engine-key": engine.key}},
        "rootfs": {"type": "layers", "diff_ids": [rootfs_id, engine_id]},
        "history": [{"created": "2026-01-01T00:00:00Z", "created_by": f"mmdebstrap {rootfs.name}"},
                    {"created": "2026-01-01T00:00:00Z",
                     "created_by": f"testrig.realengine {engine.key} site-packages -> /{DIST_PACKAGES}"}],
    }
    blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_name = hashlib.sha256(blob).hexdigest() + ".json"
    (tmp / config_name).write_bytes(blob)
    (tmp / "manifest.json").write_text(json.dumps(
        [{"Config": config_name, "RepoTags": [tag], "Layers": ["rootfs.tar", "engine.tar"]}]))
    (tmp / "info.json").write_text(json.dumps({
        "tag": tag, "image_id": "sha256:" + config_name[:-5], "site_packages_bytes": site_bytes,
        "engine_layer_bytes": engine_bytes, "rootfs_bytes": rootfs.stat().st_size, "dropped_bytes": dropped,
        "build_seconds": round(time.monotonic() - started, 1)}, indent=2) + "\n")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    for stale in root.parent.iterdir():     # an earlier key's archive (2-3 GB): the inputs changed
        if stale != root and stale.is_dir() and not stale.name.endswith(".tmp"):
            shutil.rmtree(stale, ignore_errors=True)


def _site_packages(engine: RealEngine) -> Path:
    (site,) = (engine.root / "venv" / "lib").glob("python3.*/site-packages")
    return site


def _slim(rel: str) -> str | None:
    """The SLIM pattern that drops ``rel`` (itself or a directory above it), or None."""
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        for pattern in SLIM:
            if fnmatch.fnmatchcase(prefix, pattern):
                return pattern
    return None


def _write_engine_layer(site: Path, dest: Path) -> tuple[str, int, dict[str, int], int]:
    """Tar the kept part of ``site`` under DIST_PACKAGES into ``dest``; (diff ID, layer bytes, bytes dropped per
    SLIM entry, bytes of site-packages read). Owner root, modes and modification times kept, entries sorted (same
    input, same bytes)."""
    dropped: dict[str, int] = {}
    total = 0
    with open(dest, "wb") as raw:
        hashing = _HashingWriter(raw)
        with tarfile.open(fileobj=hashing, mode="w|", format=tarfile.PAX_FORMAT) as tar:   # type: ignore[call-overload]
            parts = DIST_PACKAGES.split("/")
            for i in range(1, len(parts) + 1):
                info = tarfile.TarInfo("/".join(parts[:i]))
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                tar.addfile(info)
            for path, rel in _walk(site):
                size = 0 if path.is_dir() and not path.is_symlink() else path.lstat().st_size
                total += size
                top = _slim(rel)
                if top:
                    dropped[top] = dropped.get(top, 0) + size
                    continue
                info = tar.gettarinfo(str(path), f"{DIST_PACKAGES}/{rel}")
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                if info.isreg():
                    with open(path, "rb") as fh:
                        tar.addfile(info, fh)
                else:
                    tar.addfile(info)
        return "sha256:" + hashing.sha.hexdigest(), hashing.size, dropped, total


def _walk(site: Path) -> Iterator[tuple[Path, str]]:
    """Every entry under ``site`` as (path, relative path), sorted, directories before their content."""
    for dirpath, dirnames, filenames in os.walk(site):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted([*dirnames, *filenames]):
            path = base / name
            yield path, path.relative_to(site).as_posix()


class _HashingWriter:
    """A write-only file object that hashes and counts what passes through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.sha, self.size = raw, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.raw.write(data)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _same_fs(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev


# ---------------------------------------------------------------------- onto the nodes
def load_archive(archive: BaseArchive, docker_host: str, *, timeout: float = LOAD_TIMEOUT_S) -> None:
    """``docker load`` the archive into one daemon: the members streamed as one tar (never written twice here)."""
    proc = subprocess.Popen(["docker", "-H", docker_host, "load", "--quiet"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdin is not None
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        try:
            with tarfile.open(fileobj=proc.stdin, mode="w|") as tar:
                for member in archive.members():
                    tar.add(str(member), arcname=member.name, recursive=False)
        except BrokenPipeError:
            pass
        finally:
            proc.stdin.close()
        out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        rc = proc.wait()
    finally:
        timer.cancel()
    if rc != 0:
        raise RuntimeError(f"docker load of {archive.tag} into {docker_host} exited {rc}: {out[-2000:]}")


def ensure_on_nodes(archive: BaseArchive, nodes: Iterable[Node]) -> dict[str, float]:
    """Every node holds the archive's image (loaded where its ID is missing, all nodes at once); seconds per load."""
    from testrig.engine_image import image_id

    todo = [n for n in nodes if image_id(n, archive.tag) != archive.image_id]
    took: dict[str, float] = {}
    errors: list[BaseException] = []

    def one(node: Node) -> None:
        t0 = time.monotonic()
        try:
            load_archive(archive, node.docker_host)
            took[node.name] = round(time.monotonic() - t0, 1)
        except BaseException as exc:   # noqa: BLE001 - reported below, after every node finished
            errors.append(exc)
    threads = [threading.Thread(target=one, args=(n,), name=f"load-{n.name}") for n in todo]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    for n in todo:
        got = image_id(n, archive.tag)
        if got != archive.image_id:
            raise RuntimeError(f"{n.name}: {archive.tag} loaded as {got}, expected {archive.image_id}")
        _untag_older(n.docker_host, keep=archive.tag)
    return took


def _untag_older(docker_host: str, keep: str) -> None:
    """Drop the node's older tags of REPO (an input changed): the data root keeps only what the tests use."""
    listed = subprocess.run(["docker", "-H", docker_host, "images", "--format", "{{.Repository}}:{{.Tag}}", REPO],
                            capture_output=True, text=True, timeout=60)
    old = [t for t in listed.stdout.split() if t != keep]
    if old:
        subprocess.run(["docker", "-H", docker_host, "rmi", *old], capture_output=True, timeout=300)


def ensure_real_engine_base(cluster: TestCluster) -> str:
    """The real-engine base on every node of ``cluster`` (one image ID everywhere); returns its tag."""
    archive = ensure_archive(rootfs=ensure_rootfs(cluster.workdir / "logs"))
    with cluster._timed("image.real-engine-base"):
        ensure_on_nodes(archive, cluster.nodes.values())
    return archive.tag


# ---------------------------------------------------------------------- the cluster's real-engine inventory
def write_real_engine_cluster_inventory(cluster: TestCluster, path: Path, engine: RealEngine, *,
                                        name: str) -> Path:
    """The test cluster's inventory for real SGLang in containers (the nodes as `up` builds and copies images for
    a Spark: no prebuilt ``sparkctl_engine_image``); returns ``path``.

    * each node's model directory (``host_paths.models``, mounted read-only at /models) holds the tiny model,
      copied as a real node's model sync would (``engine.model``: ~3 MB);
    * each rank bound to its own core (``SGLANG_CPU_OMP_THREADS_BIND``, which SGLang's CPU path asserts);
    * ``host_paths.cache`` kept per node across runs (``Node.kept_dir``/cache, beside its Docker data root): the
      image copy's registry storage and torch's kernel cache, as on a Spark, so a second run on a machine neither
      pushes the base's layers nor compiles the kernels again.
    """
    import yaml

    doc = yaml.safe_load(cluster.inventory_path.read_text())
    doc["all"]["vars"].pop("sparkctl_engine_image", None)
    doc["all"]["vars"]["sparkctl_cluster"] = name
    cores = os.cpu_count() or 1
    for i, (host, spec) in enumerate(doc["all"]["children"]["sparks"]["hosts"].items()):
        node = cluster.node(host)
        spec["engine_env"] = {"SGLANG_CPU_OMP_THREADS_BIND": str(i % cores)}
        cache = node.kept_dir / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        spec["host_paths"]["cache"] = str(cache)
        models = Path(spec["host_paths"]["models"])
        target = models / engine.model.name
        shutil.rmtree(target, ignore_errors=True)
        models.mkdir(parents=True, exist_ok=True)
        shutil.copytree(engine.model, target)
    path.write_text("# generated by testrig.realengine.base_image\n" + yaml.safe_dump(doc, sort_keys=False))
    return path
