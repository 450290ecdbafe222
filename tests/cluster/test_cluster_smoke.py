"""Smoke checks of the test cluster itself: SSH with pinned host keys, per-node Docker daemons with the
nvidia runtime, the MTU 9000 fabric, the engine image on both nodes, and the sglang shim inside it."""
from __future__ import annotations

import json
import subprocess

import pytest

from testrig.cluster import FABRIC_IFACE, TestCluster

pytestmark = pytest.mark.cluster

NODES = ("spark-a", "spark-b")


def _ssh(cluster: TestCluster, node: str, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cluster.ssh_argv(node, *command), capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("node", NODES)
def test_ssh_reaches_the_nodes_own_docker_daemon_with_nvidia_runtime(test_cluster: TestCluster, node: str) -> None:
    result = _ssh(test_cluster, node, "docker", "info", "--format", "{{json .}}")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["Name"] == node
    assert info["DockerRootDir"].endswith(test_cluster.node(node).netns)
    assert "nvidia" in info["Runtimes"]


def test_unknown_host_key_is_refused(test_cluster: TestCluster) -> None:
    """Strict host-key checking is real: a rotated key is rejected until known_hosts is rescanned."""
    test_cluster.rotate_host_key("spark-b")
    try:
        refused = _ssh(test_cluster, "spark-b", "true")
        assert refused.returncode == 255
        assert "HOST IDENTIFICATION HAS CHANGED" in refused.stderr or "verification failed" in refused.stderr
    finally:
        test_cluster.restore_host_keys()
    assert _ssh(test_cluster, "spark-b", "true").returncode == 0


def test_fabric_carries_jumbo_frames_without_fragmenting(test_cluster: TestCluster) -> None:
    peer = test_cluster.node("spark-b").fabric_address
    result = test_cluster.run_on("spark-a", ["ping", "-M", "do", "-s", "8972", "-c1", "-W1", peer], check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_fabric_link_down_and_up(test_cluster: TestCluster) -> None:
    peer = test_cluster.node("spark-b").fabric_address
    test_cluster.link_down("spark-b")
    try:
        down = test_cluster.run_on("spark-a", ["ping", "-c1", "-W1", peer], check=False)
        assert down.returncode != 0
    finally:
        test_cluster.link_up("spark-b")
    up = test_cluster.run_on("spark-a", ["ping", "-c1", "-W2", peer], check=False)
    assert up.returncode == 0, up.stdout


def test_engine_image_is_identical_on_both_nodes(test_cluster: TestCluster) -> None:
    assert test_cluster.engine_image
    ids = {n: test_cluster.run_on(n, ["docker", "image", "inspect", "--format", "{{.Id}}",
                                      test_cluster.engine_image]).stdout.strip() for n in NODES}
    assert ids["spark-a"] == ids["spark-b"] == test_cluster.engine_image_id


def test_host_network_container_with_nvidia_runtime_sees_the_fabric(test_cluster: TestCluster) -> None:
    node = test_cluster.node("spark-b")
    result = test_cluster.run_on("spark-b", [
        "docker", "run", "--rm", "--network", "host", "--runtime", "nvidia", str(test_cluster.engine_image),
        "ip", "-o", "-4", "addr", "show", "dev", FABRIC_IFACE], timeout=120)
    assert f"inet {node.fabric_address}/24" in result.stdout


def test_sglang_launch_server_runs_the_shim(test_cluster: TestCluster) -> None:
    result = test_cluster.run_on("spark-a", [
        "docker", "run", "--rm", "--runtime", "nvidia", str(test_cluster.engine_image),
        "python3", "-m", "sglang.launch_server", "--help"], timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr      # the shim runs the emulator's launcher
    assert "--model-path" in result.stdout + result.stderr
