"""Test images on the test cluster: the emulator engine image and the SGLang 0.5.23 test base image.

* ``sparkctl-test-engine:<hash>`` (tests/images/test-engine): a Debian rootfs from mmdebstrap (imported, no
  registry) + this project's wheel + a ``sglang`` shim whose ``launch_server`` runs ``sparkctl.sim`` + sglang-router
  0.3.2 (as in lmsysorg/sglang images: ``python3 -m sglang_router.launch_router`` runs in it). Every
  node gets the same image (built on one, ``docker save | docker load`` to the others).
* ``sparkctl-test-sglang-base:<version>-<hash>`` (tests/images/test-sglang-base): the engine image plus the
  **real SGLang source** of a released wheel at ``/sgl-workspace/sglang/python/sglang`` (where lmsysorg's
  images keep it, installed "editable" through a ``.pth``), with the shim's ``__init__``/``launch_server``
  in place of SGLang's (which need torch). A patch series applies to it for real in ``docker build``, and
  ``python3 -c 'import sglang, os; print(os.path.dirname(sglang.__file__))'`` finds it as in a real image.

TEST IMAGES ONLY. Built with the legacy builder (``DOCKER_BUILDKIT=0``) straight on a node's daemon socket.
Caches: rootfs tarball + dependency wheels in ``~/.cache/sparkctl/test-image/``, the SGLang wheel in
``~/.cache/sparkctl/wheels/``; images stay in each node's Docker data root across runs.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from testrig.cluster import (
    BASE_PACKAGES,
    BASE_REPO,
    DEBIAN_SUITE,
    ENGINE_REPO,
    IMAGE_CACHE,
    PROJECT_DIR,
    ClusterError,
    _rootfs_key,
    _rootfs_path,
    _run,
)
from testrig.wheel import checkout_build_lock

if TYPE_CHECKING:
    from testrig.cluster import Node, TestCluster

log = logging.getLogger("sparkctl.testrig")

TEST_IMAGES = PROJECT_DIR / "tests" / "images"
SGLANG_BASE_REPO = "sparkctl-test-sglang-base"
VLLM_BASE_REPO = "sparkctl-test-vllm-base"
VLLM_SOURCE_PACKAGE = "/opt/vllm-src/vllm"        # where the test vLLM base keeps its vllm package
SGLANG_WORKSPACE_PACKAGE = "/sgl-workspace/sglang/python/sglang"    # lmsysorg/sglang's editable install


class EngineImages:
    """Builds and places the test images of one TestCluster (uses its nodes, workdir and timings)."""

    def __init__(self, cluster: TestCluster) -> None:
        self.cluster = cluster
        self.workdir = cluster.workdir

    # ------------------------------------------------------------------ emulator engine image
    def ensure(self) -> tuple[str, str]:
        """Every node holds the same test engine image; returns (tag, image id).

        Tag ``sparkctl-test-engine:<hash of rootfs package list + image files + project source>``. Skips the
        build when a node already has the tag, and copies it to each node without it (``docker save | docker load``,
        one node after the other: each node's data root keeps it across runs, so only a new cluster size or a
        source change copies).
        """
        nodes = self.cluster.nodes
        tag = f"{ENGINE_REPO}:{engine_content_hash()}"
        ids = {n.name: image_id(n, tag) for n in nodes.values()}
        source = next((name for name, iid in ids.items() if iid), None)
        if source is None:
            source = next(iter(nodes))   # spark-a
            self._build_engine(nodes[source], tag)
            ids[source] = image_id(nodes[source], tag)
        else:
            log.info("image %s already on %s: build skipped", tag, source)
        for n in nodes.values():
            if ids[n.name] != ids[source]:
                log.info("copying %s from %s to %s", tag, source, n.name)
                with self.cluster._timed(f"image.copy-{n.name}"):
                    copy_image(nodes[source], n, tag)
                ids[n.name] = image_id(n, tag)
        if len(set(ids.values())) != 1:
            raise ClusterError("engine image differs between nodes", where=tag, evidence=json.dumps(ids))
        return tag, str(ids[source])

    def _build_engine(self, node: Node, tag: str) -> None:
        base = f"{BASE_REPO}:{_rootfs_key()}"
        if not image_id(node, base):
            rootfs = self._ensure_rootfs()
            with self.cluster._timed("image.import"):
                _run(["docker", "-H", node.docker_host, "import", str(rootfs), base], timeout=300)
        ctx = self.workdir / "image-build"
        shutil.rmtree(ctx, ignore_errors=True)
        ctx.mkdir(parents=True)
        shutil.copy2(TEST_IMAGES / "test-engine" / "Dockerfile", ctx / "Dockerfile")
        # build from a copy: setuptools writes *.egg-info next to the sources it builds
        shutil.copytree(TEST_IMAGES / "test-engine" / "sglang_shim", ctx / "sglang_shim")
        with self.cluster._timed("image.wheels"):
            shutil.copytree(self._ensure_dependency_wheels(), ctx / "deps")
            with checkout_build_lock(PROJECT_DIR):      # setuptools builds in the checkout: one build at a time
                _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(ctx / "project"),
                      str(PROJECT_DIR), str(ctx / "sglang_shim")], timeout=600,
                     log_to=self.workdir / "logs" / "pip-wheel.log")
        with self.cluster._timed("image.build"):
            docker_build(node, ctx, tag, {"BASE": base}, {"org.sparkctl.test-engine": tag},
                         self.workdir / "logs" / "image-build.log")
        self._prune(ENGINE_REPO, keep=tag)

    def _ensure_dependency_wheels(self) -> Path:
        """Wheels of the project's runtime dependencies plus the `router` extra (sglang-router, which the
        lmsysorg/sglang images carry: the router container runs ``python3 -m sglang_router.launch_router`` from the
        engine image), cached by that list + Python version."""
        deps = image_dependencies()
        key = hashlib.sha256(f"{sys.version_info[:2]} {sorted(deps)}".encode()).hexdigest()[:16]
        path = IMAGE_CACHE / f"wheels-{key}"
        if path.is_dir():
            return path
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(tmp), *deps], timeout=600,
             log_to=self.workdir / "logs" / "pip-wheel-deps.log")
        if path.is_dir():   # another cluster built it meanwhile
            shutil.rmtree(tmp)
        else:
            tmp.rename(path)
        return path

    def _prune(self, repo: str, keep: str) -> None:
        """Drop older tags of ``repo`` (and their layers) from the nodes so rebuilds do not fill the disk."""
        for n in self.cluster.nodes.values():
            tags = _run(["docker", "-H", n.docker_host, "images", "--format", "{{.Repository}}:{{.Tag}}",
                         repo], check=False).stdout.split()
            old = [t for t in tags if t != keep]
            if old:   # also removes their untagged parent layers
                _run(["docker", "-H", n.docker_host, "rmi", *old], check=False, timeout=120)

    def _ensure_rootfs(self) -> Path:
        """The cached Debian rootfs tarball, made with mmdebstrap when missing (keyed by the package list)."""
        path = _rootfs_path()
        if path.exists():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with self.cluster._timed("image.mmdebstrap"):
            _run(["mmdebstrap", "--variant=apt", f"--include={','.join(BASE_PACKAGES)}", "--format=tar",
                  DEBIAN_SUITE, str(tmp)], timeout=900, log_to=self.workdir / "logs" / "mmdebstrap.log")
        tmp.rename(path)
        return path

    # ------------------------------------------------------------------ SGLang test base image
    def ensure_sglang_base(self, node: str, version: str = "0.5.23") -> str:
        """The test base image carrying SGLang ``version``'s real source, on ``node`` only; returns its tag.

        Built FROM the cluster's engine image (so the emulator runs it); the other node deliberately does not
        get it, so distribution tests see what a peer without the base receives.
        """
        from sparkctl.images.series import ensure_wheel, unpack_package

        engine = self.cluster.engine_image or self.ensure()[0]
        wheel = ensure_wheel(version)
        dockerfile = TEST_IMAGES / "test-sglang-base" / "Dockerfile"
        key = hashlib.sha256(f"{engine} {wheel.name} {hashlib.sha256(wheel.read_bytes()).hexdigest()}".encode()
                             + dockerfile.read_bytes()).hexdigest()[:12]
        tag = f"{SGLANG_BASE_REPO}:{version}-{key}"
        n = self.cluster.node(node)
        if image_id(n, tag):
            return tag
        ctx = self.workdir / "sglang-base-build"
        shutil.rmtree(ctx, ignore_errors=True)
        ctx.mkdir(parents=True)
        shutil.copy2(dockerfile, ctx / "Dockerfile")
        package = unpack_package(wheel, ctx / "src")
        shim = TEST_IMAGES / "test-engine" / "sglang_shim" / "sglang"
        for name in ("__init__.py", "launch_server.py"):
            shutil.copy2(shim / name, package / name)
        with self.cluster._timed("image.sglang-base"):
            docker_build(n, ctx, tag, {"ENGINE": engine}, {"org.sparkctl.test-sglang-base": tag},
                         self.workdir / "logs" / "sglang-base-build.log")
        shutil.rmtree(ctx, ignore_errors=True)
        return tag

    def ensure_vllm_base(self, node: str, series: str = "gb10-vllm-0.32.0") -> str:
        """The test vLLM base image (tests/images/test-vllm-base) on ``node`` only: the engine image + vLLM 0.32.0's
        real files that ``series`` touches and its _version.py, as the package ``vllm``; returns its tag."""
        from sparkctl.images import seriesapply
        from sparkctl.images.series import load_series
        from testrig.realengine import ensure_real_vllm

        real = ensure_real_vllm()
        purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        site = Path(subprocess.run([str(real.python), "-c", purelib], capture_output=True, text=True,
                                   check=True).stdout.strip())
        files = sorted({"_version.py", *seriesapply.touched(load_series(series).dir / "series")})
        engine = self.cluster.engine_image or self.ensure()[0]
        dockerfile = TEST_IMAGES / "test-vllm-base" / "Dockerfile"
        h = hashlib.sha256(f"{engine} {series}".encode() + dockerfile.read_bytes())
        for rel in files:
            h.update(rel.encode() + b"\0" + (site / "vllm" / rel).read_bytes())
        tag = f"{VLLM_BASE_REPO}:0.32.0-{h.hexdigest()[:12]}"
        n = self.cluster.node(node)
        if image_id(n, tag):
            return tag
        ctx = self.workdir / "vllm-base-build"
        shutil.rmtree(ctx, ignore_errors=True)
        package = ctx / "src" / "vllm"
        package.mkdir(parents=True)
        shutil.copy2(dockerfile, ctx / "Dockerfile")
        (package / "__init__.py").write_text("# test image: vLLM 0.32.0's files a patch series touches; not vLLM\n")
        for rel in files:
            (package / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(site / "vllm" / rel, package / rel)
        with self.cluster._timed("image.vllm-base"):
            docker_build(n, ctx, tag, {"ENGINE": engine}, {"org.sparkctl.test-vllm-base": tag},
                         self.workdir / "logs" / "vllm-base-build.log")
        shutil.rmtree(ctx, ignore_errors=True)
        return tag


# ---------------------------------------------------------------------- helpers on one node's daemon
def docker_build(node: Node, ctx: Path, tag: str, build_args: dict[str, str], labels: dict[str, str],
                 log_to: Path) -> None:
    argv = ["docker", "-H", node.docker_host, "build", "--quiet", "-t", tag]
    for k, v in build_args.items():
        argv += ["--build-arg", f"{k}={v}"]
    for k, v in labels.items():
        argv += ["--label", f"{k}={v}"]
    _run([*argv, str(ctx)], timeout=900, env={**os.environ, "DOCKER_BUILDKIT": "0"}, log_to=log_to)


def copy_image(src: Node, dst: Node, tag: str, timeout: float = 300.0) -> None:
    save = subprocess.Popen(["docker", "-H", src.docker_host, "save", tag], stdout=subprocess.PIPE)
    try:
        _run(["docker", "-H", dst.docker_host, "load", "--quiet"], stdin=save.stdout, timeout=timeout)
    finally:
        assert save.stdout is not None
        save.stdout.close()
        save.wait(timeout=timeout)
    if save.returncode:
        raise ClusterError(f"docker save {tag} failed on {src.name}", where=src.name)


def image_id(node: Node, ref: str) -> str | None:
    result = _run(["docker", "-H", node.docker_host, "image", "inspect", "--format", "{{.Id}}", ref], check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def image_dependencies() -> list[str]:
    """What the test engine image installs besides the project: its dependencies and the `router` extra."""
    import tomllib

    project = tomllib.loads((PROJECT_DIR / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["router"]]


def engine_content_hash() -> str:
    """Hash of what goes into the engine image: rootfs key, image files, pyproject and the package source."""
    h = hashlib.sha256(_rootfs_key().encode())
    roots = [TEST_IMAGES / "test-engine", PROJECT_DIR / "sparkctl"]
    files = [PROJECT_DIR / "pyproject.toml"] + sorted(
        p for root in roots for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith((".pyc", ".egg-info"))
        and not any(part.endswith(".egg-info") for part in p.parts))
    for p in files:
        h.update(str(p.relative_to(PROJECT_DIR)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]
