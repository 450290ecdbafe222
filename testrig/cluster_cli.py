"""``scripts/test-cluster``: bring the test cluster (two nodes, or up to four on a switch) up or down by hand,
show its status, print its env."""
from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sparkctl.errors import SparkctlError
from testrig.cluster import TestCluster


def main(argv: Sequence[str] | None = None) -> int:
    """``test-cluster {up,down,status,env} [--workdir D] [--prefix P] [--net N] [--nodes 2..4] [--no-image]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="test-cluster", description="Spark test cluster (2-4 nodes) on this machine")
    parser.add_argument("command", choices=["up", "down", "status", "env"])
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get(
        "SPARKCTL_TEST_CLUSTER_DIR", "/var/tmp/sparkctl-test-cluster")))
    parser.add_argument("--prefix", default=os.environ.get("SPARKCTL_TEST_CLUSTER_PREFIX", "spk"))
    parser.add_argument("--net", type=int, default=0, help="subnet index: 198.19.N.0/24 mgmt, 198.18.N.0/24 fabric")
    parser.add_argument("--nodes", type=int, default=2, choices=range(2, 5),
                        help="node count: 2 (direct fabric cable) or 3-4 (fabric switch); give the same to down")
    parser.add_argument("--no-image", action="store_true", help="skip the engine image")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    try:
        cluster = TestCluster(args.workdir, args.prefix, args.net, build_image=not args.no_image,
                              node_count=args.nodes)
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
            env: dict[str, str | Path] = {"SPARKCTL_INVENTORY": cluster.inventory_path,
                                          "SPARKCTL_TEST_KNOWN_HOSTS": cluster.known_hosts_path,
                   "SPARKCTL_TEST_SSH_KEY": cluster.ssh_key_path}
            env.update({f"SPARKCTL_TEST_DOCKER_HOST_{n.name.upper().replace('-', '_')}": n.docker_host
                        for n in cluster.nodes.values()})
            print("\n".join(f"export {k}={shlex.quote(str(v))}" for k, v in env.items()))
    except SparkctlError as exc:
        print(exc.render(), file=sys.stderr)
        return exc.exit_code
    return 0
