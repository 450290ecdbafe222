"""Session fixture: the real two-node Spark test cluster (sshd + dockerd per network namespace).

Skipped with a reason when this machine cannot run it (not root, a tool missing); under CI (``CI=true``)
a missing prerequisite FAILS instead, so a broken CI machine never passes by skipping.
Env: SPARKCTL_TEST_CLUSTER_PREFIX (default ``spkt``, apart from ``scripts/test-cluster``'s ``spk``) and
SPARKCTL_TEST_CLUSTER_NET (subnet index, default 0).
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


@pytest.fixture(scope="session")
def test_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    """The cluster, brought up once per session (engine image included) and torn down at the end."""
    missing = missing_prerequisites()
    if missing:
        _unavailable("; ".join(missing))
    cluster = TestCluster(tmp_path_factory.mktemp("cluster"),
                          name_prefix=os.environ.get("SPARKCTL_TEST_CLUSTER_PREFIX", "spkt"),
                          net_index=int(os.environ.get("SPARKCTL_TEST_CLUSTER_NET", "0")))
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failed cluster test carries the tail of each node's sshd log in its report (CI keeps only the output:
    a dropped SSH session is otherwise a bare EOFError)."""
    outcome = yield
    report = outcome.get_result()
    cluster = getattr(item, "funcargs", {}).get("test_cluster")
    if report.failed and isinstance(cluster, TestCluster):
        for log in sorted((cluster.workdir / "logs").glob("*-sshd.log")):
            tail = log.read_text(errors="replace").splitlines()[-25:]
            report.sections.append((f"{log.name} (last {len(tail)} lines)", "\n".join(tail)))
