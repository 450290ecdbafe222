"""Benchmark (not a test): what an engine image carrying the real SGLang CPU environment would cost CI.

The path real Sparks take is SSH + Docker: the engine runs from an image on each node. Putting the real engine
there means an image with testrig/realengine's virtualenv (~2.8 GB: SGLang 0.5.23, the CPU torch and their
dependencies) and the tiny models, built on spark-a and copied to spark-b on every fresh CI machine (the nodes'
Docker data roots do not survive a CI run). Needs root (like tests/cluster). In one run, on a two-node test
cluster:
  1. the test engine image the suite already builds (for reference: what CI pays today);
  2. `docker build` of FROM <that image> + the real-engine venv and models (the build context sent to the daemon,
     the layer committed), on spark-a;
  3. `docker save | docker load` of that image from spark-a to spark-b (what the test rig's copy does);
  4. its size.
Run:  SPARKCTL_TEST_CLUSTER_PREFIX=brei SPARKCTL_TEST_CLUSTER_NET=9 \\
      .venv/bin/python benchmarks/bench_real_engine_image.py
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testrig.cluster import TestCluster, _run  # noqa: E402
from testrig.engine_image import copy_image, docker_build, image_id  # noqa: E402
from testrig.realengine import ensure_real_engine  # noqa: E402

DOCKERFILE = """ARG BASE
FROM ${BASE}
# the real-engine venv at the path it was built at (its pyvenv.cfg names the base python: Debian's python3.11)
COPY real-engine/ /opt/sparkctl-real-engine/
ENV PATH=/opt/sparkctl-real-engine/venv/bin:$PATH SGLANG_USE_CPU_ENGINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
"""


def main() -> None:
    engine = ensure_real_engine()
    prefix = os.environ.get("SPARKCTL_TEST_CLUSTER_PREFIX", "brei")
    net = int(os.environ.get("SPARKCTL_TEST_CLUSTER_NET", "9"))
    with tempfile.TemporaryDirectory(prefix="sparkctl-bench-rei-") as tmp:
        cluster = TestCluster(workdir=Path(tmp) / "cluster", name_prefix=prefix, net_index=net)
        with cluster:
            cluster.up()
            t0 = time.monotonic()
            base = cluster.ensure_engine_image()
            t_base = time.monotonic() - t0
            a, b = cluster.node("spark-a"), cluster.node("spark-b")
            ctx = Path(tmp) / "ctx"
            (ctx / "real-engine").mkdir(parents=True)
            (ctx / "Dockerfile").write_text(DOCKERFILE)
            t0 = time.monotonic()
            # hard links: the context costs no copy here (the daemon still reads and stores every byte)
            shutil.copytree(engine.root / "venv", ctx / "real-engine" / "venv", symlinks=True, copy_function=os.link)
            shutil.copytree(engine.root / "models", ctx / "real-engine" / "models", copy_function=os.link)
            t_ctx = time.monotonic() - t0
            tag = "sparkctl-bench-real-engine:latest"
            t0 = time.monotonic()
            docker_build(a, ctx, tag, {"BASE": base}, {"org.sparkctl.bench": "real-engine"},
                         Path(tmp) / "build.log")
            t_build = time.monotonic() - t0
            size = int(_run(["docker", "-H", a.docker_host, "image", "inspect", "--format", "{{.Size}}", tag]
                            ).stdout.strip())
            t0 = time.monotonic()
            copy_image(a, b, tag, timeout=1800)
            t_copy = time.monotonic() - t0
            assert image_id(a, tag) == image_id(b, tag)
            t0 = time.monotonic()
            probe = _run(["docker", "-H", b.docker_host, "run", "--rm", "--network", "none", tag, "python", "-c",
                          "import importlib.util as u; print(bool(u.find_spec('sglang')))"], timeout=300).stdout
            t_probe = time.monotonic() - t0
    print(f"test engine image (what the suite builds today, incl. copy): {t_base:.1f}s"
          + (" (the nodes' data roots already held it: a fresh CI machine builds and copies it)" if t_base < 5 else ""))
    print(f"real-engine image: {size / 1e9:.2f} GB; context {t_ctx:.1f}s, docker build {t_build:.1f}s, "
          f"save|load to spark-b {t_copy:.1f}s, run probe {t_probe:.1f}s (sglang importable: {probe.strip()})")
    ratio = f" ({(t_build + t_copy) / t_base:.1f}x the test engine image)" if t_base >= 5 else ""
    print(f"added per CI run before any boot: {t_build + t_copy:.1f}s{ratio}")


if __name__ == "__main__":
    main()
