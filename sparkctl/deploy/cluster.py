"""The bottom of `deploy/`: one cluster's context (inventory, ledger, runtimes, API client, reporter).

It knows no command: observe, settle, plan, apply and the commands above it take a `Cluster` and never
call back up. Example::

    Cluster(resolve_inventory(None), Reporter()).health_of(record)
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import BaseModel

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.deploy.progress import Reporter
from sparkctl.deploy.runtimes import Runtimes, embedded_notice
from sparkctl.engines import render
from sparkctl.errors import LedgerError
from sparkctl.extras import require
from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.launch import LaunchSpec, RankSpec
from sparkctl.sglang.render import RenderResult
from sparkctl.sglang.responses import SGLangAPIError
from sparkctl.state.ledger import Ledger
from sparkctl.state.records import DeploymentRecord
from sparkctl.statefiles import check_room  # the threshold lives with the writes it protects

if TYPE_CHECKING:     # httpx loads with the first client (`client`), not at `up`'s start
    from sparkctl.sglang.client import SGLangClient

# Room a rank log needs to keep growing through a boot: twice the largest boot log measured (real SGLang rank logs
# of a boot are 10-35 KB, see statefiles.ROOM_BYTES). Below it (or read-only), readiness is rank 0's /health alone.
LOG_ROOM_BYTES = 64 * 1024


class RankHealth(BaseModel):
    rank: int
    node: str
    alive: bool
    state: str
    health: int | None = None     # rank 0's /health code; None on other ranks or when it did not answer


class Cluster:
    """One cluster's context. The ledger and the reporter are the cluster's, shared by every layer above."""

    def __init__(self, inventory: Inventory, reporter: Reporter | None = None, ledger: Ledger | None = None) -> None:
        ssh = [n.name for n in inventory.nodes if n.ssh.connection == "ssh"]
        if ssh:   # said before anything is looked at or changed, not as each node's failure (nodes/fanout.py)
            require("nodes", f"reaching {', '.join(ssh)} over SSH")
        self.inventory = inventory
        self.reporter = reporter or Reporter(quiet=True)
        self.ledger = ledger or Ledger.for_cluster(inventory.cluster.name)

    @property
    def name(self) -> str:
        return self.inventory.cluster.name

    def runtimes(self, dep_id: str) -> Runtimes:
        """The runtime of each node, for the engines of deployment `dep_id` (logs, liveness, stop)."""
        return Runtimes(self.inventory, self.ledger, dep_id)

    @staticmethod
    def client(spec0: LaunchSpec | RankSpec | JSONObject, key_env: str | None,
               timeout: float = 60.0) -> SGLangClient:
        """Client for rank 0's API (its launch, or its recorded spec); the API key comes from the environment
        variable the profile names."""
        host = spec0.api_host if isinstance(spec0, LaunchSpec | RankSpec) else spec0["api_host"]
        port = spec0.api_port if isinstance(spec0, LaunchSpec | RankSpec) else spec0["api_port"]
        key = os.environ.get(key_env) if key_env else None
        from sparkctl.sglang.client import SGLangClient  # httpx: loaded with the first client, not by `up`'s start
        return SGLangClient(f"http://{host}:{port}", api_key=key or None, timeout=timeout)

    @staticmethod
    def endpoint(spec0: LaunchSpec) -> str:
        return f"http://{spec0.api_host}:{spec0.api_port}"

    def health_probe(self, spec0: LaunchSpec, key_env: str | None) -> Callable[[], bool]:
        """True once rank 0's /health answers 200 (connection refused or 503 = not yet). The client is made at the
        first probe, once the engines have started: its HTTP stack's import is then not between `up`'s start and
        the first rank's."""
        client: SGLangClient | None = None

        def probe() -> bool:
            nonlocal client
            if client is None:
                client = self.client(spec0, key_env, timeout=5)
            try:
                return client.health() == 200
            except SGLangAPIError:
                return False
        return probe

    def health_of(self, record: DeploymentRecord) -> tuple[bool, str, list[RankHealth]]:
        """Live health of a recorded deployment: every rank alive, rank 0 /health 200."""
        rts = self.runtimes(record.id)
        ranks: list[RankHealth] = []
        healthy = True
        for handle in record.handles:
            live = rts.for_node(handle.node).liveness(handle)
            entry = RankHealth(rank=handle.rank, node=handle.node, alive=live.alive, state=live.detail)
            if handle.rank == 0 and live.alive:
                try:
                    with self.client(record.specs[0], record.api_key_env, timeout=5) as c:
                        entry.health = c.health()
                    healthy &= entry.health == 200
                except SGLangAPIError as exc:
                    entry.state += f"; /health: {exc.message}"
                    healthy = False
            healthy &= live.alive
            ranks.append(entry)
        if not ranks or {r.rank for r in ranks} != {s.rank for s in record.specs}:
            healthy = False          # a rank without a recorded engine does not serve
        detail = "; ".join(f"rank {r.rank} {r.state}" + (f", /health {r.health}" if r.rank == 0 else "")
                           for r in ranks) or "no ranks recorded"
        return healthy, detail, ranks

    def render(self, profile: Profile) -> RenderResult:
        """Every rank's launch for this profile on this cluster (ConfigError when the profile cannot run here)."""
        return render(profile, self.inventory)

    @property
    def embedded_notice(self) -> str | None:
        return embedded_notice(self.inventory)

    def log_room(self, dep_id: str) -> Callable[[], bool]:
        """Whether deployment `dep_id`'s rank logs (process runtime: in the state directory) can still grow: at
        least `LOG_ROOM_BYTES` and an inode free, and writable. When not, `boot` takes rank 0's /health alone.

        On a Spark (docker runtime) a rank's log is its container's Docker log on the node (dockerd's log
        directory, /var/lib/docker/containers/), not the state directory: it keeps growing while the state
        directory is full, the "fired up" line arrives, and this only lets /health 200 (503 until SGLang is ready)
        stand alone as well. What a full state directory costs there: the archive of a removed container's log
        (`DockerRuntime.remove` goes on without it) and the records, which the restore does without."""
        path = self.ledger.log_dir(dep_id)

        def room() -> bool:
            try:
                check_room(path, need_bytes=LOG_ROOM_BYTES, need_inodes=1)
            except LedgerError:
                return False
            return True
        return room

    def check_room(self) -> None:
        """Before a command changes the cluster: StateDirFullError (exit 6) when the state directory is full."""
        check_room(self.ledger.root)
