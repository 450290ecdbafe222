"""Session fixtures: the real Spark test clusters (sshd + dockerd per network namespace).

* ``test_cluster``: two nodes on a direct fabric cable, brought up once per session.
* ``test_cluster4``: four nodes on a fabric switch (a bridge), its own prefix and subnets; brought up only when
  a test asks for it (the first one), torn down at session end.
* ``real_engine_cluster``: two nodes for real SGLang in containers (no emulator image), in the real engine's worker.

Skipped with a reason when this machine cannot run it (not root, a tool missing); under CI (``CI=true``)
a missing prerequisite FAILS instead, so a broken CI machine never passes by skipping.
Env: SPARKCTL_TEST_CLUSTER_PREFIX (default ``spkt``, apart from ``scripts/test-cluster``'s ``spk``) and
SPARKCTL_TEST_CLUSTER_NET (subnet index, default 0) for the two-node cluster; SPARKCTL_TEST_CLUSTER4_PREFIX
(default ``spkq``) and SPARKCTL_TEST_CLUSTER4_NET (default 1) for the four-node one.
"""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from testrig.cluster import TestCluster, missing_prerequisites


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"test cluster unavailable under CI: {reason}", pytrace=False)
    pytest.skip(f"test cluster unavailable: {reason}")


def _session_cluster(factory: pytest.TempPathFactory, name: str, env: str, prefix: str, net: int,
                     node_count: int = 2, build_image: bool = True) -> Iterator[TestCluster]:
    """A cluster brought up once per session (engine image included) and torn down at the end; its prefix and net
    index from ``<env>_PREFIX`` / ``<env>_NET``."""
    missing = missing_prerequisites()
    if missing:
        _unavailable("; ".join(missing))
    cluster = TestCluster(factory.mktemp(name), name_prefix=os.environ.get(f"{env}_PREFIX", prefix),
                          net_index=int(os.environ.get(f"{env}_NET", str(net))), node_count=node_count,
                          build_image=build_image)
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def test_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    """The two-node cluster (SPARKCTL_TEST_CLUSTER_PREFIX/_NET, default spkt/0)."""
    yield from _session_cluster(tmp_path_factory, "cluster", "SPARKCTL_TEST_CLUSTER", "spkt", 0)


@pytest.fixture(scope="session")
def real_engine_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    """Two nodes for real SGLang in containers (SPARKCTL_TEST_REAL_CLUSTER_PREFIX/_NET, default spkr/2): a cluster of
    its own, without the emulator image, so the real-engine container tests run in the real engine's worker (one
    real TP=2 engine on the machine at a time) beside the emulator cluster's tests rather than after them."""
    yield from _session_cluster(tmp_path_factory, "real-cluster", "SPARKCTL_TEST_REAL_CLUSTER", "spkr", 2,
                                build_image=False)


@pytest.fixture(scope="session")
def test_cluster4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    """Four nodes (spark-a .. spark-d) through a fabric switch (SPARKCTL_TEST_CLUSTER4_PREFIX/_NET, default spkq/1)."""
    yield from _session_cluster(tmp_path_factory, "cluster4", "SPARKCTL_TEST_CLUSTER4", "spkq", 1, node_count=4)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failed cluster test carries the tail of each node's sshd log in its report (CI keeps only the output:
    a dropped SSH session is otherwise a bare EOFError)."""
    outcome = yield
    report = outcome.get_result()
    funcargs = getattr(item, "funcargs", {})
    for cluster in (funcargs.get("test_cluster"), funcargs.get("test_cluster4")):
        if report.failed and isinstance(cluster, TestCluster):
            for log in sorted((cluster.workdir / "logs").glob("*-sshd.log")):
                tail = log.read_text(errors="replace").splitlines()[-25:]
                report.sections.append((f"{log.name} (last {len(tail)} lines)", "\n".join(tail)))


# The test clusters' nodes share this machine's kernel, so preflight judges every node's memory from this host's
# /proc/meminfo: d5's mem_fraction_static 0.88 of 23.5 GiB asks for 20.7 GiB free, which a quiet machine has with
# about 1 GiB to spare and a machine running the rest of the suite beside these tests (pytest-xdist workers) does not
# ("0.0 GiB short"). These tests prove the SSH + Docker path, not that this host has a GB10's free memory: each of
# them sees a `d5` that asks for 0.5 (everything else as shipped), with the emulator's KV pool anchored at 0.5 so the
# capacity gate sees d5's pool. Profiles that extend d5 inherit it: the tests' own, and dflash-off, copied beside it
# (a profile's `extends:` looks in its own directory first, so the shipped dflash-off would find the shipped d5).
CLUSTER_MEM_FRACTION = "0.5"


def _d5_for_a_shared_host(directory: os.PathLike[str]) -> None:
    from pathlib import Path
    shipped = Path(__file__).resolve().parents[2] / "profiles" / "d5.yml"
    text = shipped.read_text()
    assert "  mem_fraction_static: 0.88\n" in text, f"{shipped}: mem_fraction_static moved; update this fixture"
    text = text.replace("  mem_fraction_static: 0.88\n", f"  mem_fraction_static: {CLUSTER_MEM_FRACTION}\n")
    text += f"env: {{SPARKCTL_SIM_KV_REF_MEM_FRACTION: '{CLUSTER_MEM_FRACTION}'}}\n"
    (Path(directory) / "d5.yml").write_text(text)
    dflash_off = shipped.with_name("dflash-off.yml").read_text()
    assert "extends: d5\n" in dflash_off, "dflash-off no longer extends d5; update this fixture"
    (Path(directory) / "dflash-off.yml").write_text(dflash_off)


@pytest.fixture(autouse=True)
def _cluster_d5(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                monkeypatch: pytest.MonkeyPatch) -> None:
    if getattr(request.module, "SHIPPED_D5", False):    # a module that boots nothing and compares with the shipped d5
        return
    if "profiles_dir" in request.fixturenames:       # the test's own profiles directory, searched first
        _d5_for_a_shared_host(request.getfixturevalue("profiles_dir"))
        return
    directory = tmp_path_factory.mktemp("cluster-profiles")
    _d5_for_a_shared_host(directory)
    monkeypatch.setenv("SPARKCTL_PROFILES_DIR", str(directory))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The benchmarks' smoke runs (test_bench_smoke_cluster.py, test_bench_smoke_real_cluster.py) after every other
    test: they build and remove images on the nodes and run prepare on them (and put back what they changed), so no
    other test sees a cluster a benchmark has been through (the real-engine one after test_real_engine_containers.py,
    on the same cluster in the same worker)."""
    items.sort(key=lambda item: item.path.name.startswith("test_bench_smoke_"))
