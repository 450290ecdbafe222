"""The docker runtime's secret files on the node (/dev/shm/sparkctl-secrets/<container>): `stop` removes them, and
`cleanup_secrets` removes those of this cluster's containers that no longer run, never another cluster's (even
one whose name starts with this one's) nor a running container's.

The node is this machine: every command but `docker` runs for real (find, rm on the real tmpfs directory);
`docker ps` / `docker stop` are answered as the daemon would.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkctl.config.inventory import ClusterSettings, HostPaths, Inventory, Node, SSHSettings
from sparkctl.nodes.container import SECRETS_HOST_ROOT, container_name
from sparkctl.nodes.docker_runtime import DockerRuntime
from sparkctl.nodes.handles import DockerHandle
from sparkctl.nodes.ssh import CommandResult


class LocalNode:
    """Runs every command here for real, except `docker`, answered from `containers` (name -> running)."""

    address = "root@localhost:22"

    def __init__(self, containers: dict[str, bool], cluster: str) -> None:
        self.containers = containers
        self.cluster = cluster
        self.calls: list[list[str]] = []

    def run(self, argv, *, check=False, stdin=None, **_kw):  # noqa: ANN001, ANN003
        argv = list(argv)
        self.calls.append(argv)
        if argv[0] == "docker":
            if argv[1] == "ps":
                out = "".join(f"{'i' * 12}{n[-3:]}\t{n}\t{'running' if up else 'exited'}\t"
                              f"dep\t{n.split('rank')[1][0]}\n"
                              for n, up in self.containers.items())
                res = CommandResult("spark-a", argv, 0, out, "", 0.0)
            elif argv[1] == "stop":
                res = CommandResult("spark-a", argv, 0, argv[-1] + "\n", "", 0.0)
            elif argv[1] == "top":          # `stop` first looks for a stopped process (none here: docker's layout)
                res = CommandResult("spark-a", argv, 0, "PID                 STAT                COMMAND\n"
                                    "1542                Ss                  docker-init\n"
                                    "1555                S                   python3\n", "", 0.0)
            else:
                raise AssertionError(f"unexpected docker call {argv}")
        else:
            p = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
            res = CommandResult("spark-a", argv, p.returncode, p.stdout, p.stderr, 0.0)
        return res.check() if check else res


@pytest.fixture
def node_dirs():
    root = Path(SECRETS_HOST_ROOT)
    if not os.access(root if root.exists() else root.parent, os.W_OK):
        reason = f"{root} is not writable by this user (the docker runtime's node directory; root in CI)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (CI=true: this test must run)")
        pytest.skip(reason)
    created_root = not root.exists()
    if created_root:
        root.mkdir(mode=0o700)
    made: list[Path] = []
    yield made
    for d in made:
        shutil.rmtree(d, ignore_errors=True)
    if created_root:
        with contextlib.suppress(OSError):
            root.rmdir()


def _secret_dir(name: str, made: list[Path]) -> Path:
    d = Path(SECRETS_HOST_ROOT) / name
    d.mkdir(mode=0o700)
    (d / "hf-token").write_text("hf_x")
    made.append(d)
    return d


def test_stop_and_cleanup_remove_only_this_clusters_stopped_secrets(node_dirs):
    cluster = f"sec{secrets.token_hex(3)}"
    running, stopped = container_name(cluster, 0, "dep"), container_name(cluster, 1, "dep")
    lookalike = container_name(cluster + "-b", 1, "dep")          # another cluster whose name starts with ours
    other = container_name(f"oth{secrets.token_hex(3)}", 1, "dep")
    dirs = {n: _secret_dir(n, node_dirs) for n in (running, stopped, lookalike, other)}
    node = Node(name="spark-a", ssh=SSHSettings(host="198.19.0.1"), fabric_interface="lo", fabric_address="127.0.0.9",
                host_paths=HostPaths(models="/srv/models", cache="/srv/cache"), gpu_runtime="none")
    inv = Inventory(path="x", cluster=ClusterSettings(name=cluster), nodes=[node])
    conn = LocalNode({running: True, stopped: False}, cluster)
    rt = DockerRuntime(inv, node, cluster=cluster, connector=conn, environ={})  # type: ignore[arg-type]

    assert rt.cleanup_secrets() == [f"[spark-a] {SECRETS_HOST_ROOT}/{stopped}"]
    assert not dirs[stopped].exists()
    assert dirs[running].exists() and dirs[lookalike].exists() and dirs[other].exists()
    assert rt.cleanup_secrets() == []                     # idempotent

    h = DockerHandle(node="spark-a", rank=0, deployment="dep", cluster=cluster, container=running,
                     container_id="i" * 12 + running[-3:])
    rt.stop(h, timeout_s=1)
    assert not dirs[running].exists()                     # a stopped container keeps no secret on the node
    assert dirs[lookalike].exists() and dirs[other].exists()
