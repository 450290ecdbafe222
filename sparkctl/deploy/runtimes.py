"""Pick the runtime for each node of an inventory (process for the embedded cluster, docker for Sparks)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from sparkctl.config.inventory import Inventory, Node
from sparkctl.enginenames import ENGINE_NAMES
from sparkctl.errors import ConfigError
from sparkctl.nodes.process import ProcessRuntime
from sparkctl.nodes.runtime import Runtime
from sparkctl.state.ledger import Ledger

if TYPE_CHECKING:
    from sparkctl.deploy.image_stage import LaunchImage


def embedded_notice(inventory: Inventory) -> str | None:
    """The one line every command prints on a local cluster: the embedded one (its engine is the emulator), or
    any inventory whose process runtime runs a real engine on this machine's CPU; None for Sparks."""
    if inventory.real_engine_on_cpu:
        pythons = inventory.cluster.pythons()
        names = " or ".join(f"real {ENGINE_NAMES[e]}" for e in sorted(pythons))
        return (f"using a local cluster ({inventory.path}) whose engine is {names} on this machine's CPU "
                f"({', '.join(pythons[e] for e in sorted(pythons))}): its figures are a CPU's, not a GB10's")
    if not inventory.embedded:
        return None
    return (f"using the embedded local cluster ({inventory.path}); its engine is the sparkctl emulator, "
            f"and everything it reports is emulated")


class Runtimes:
    """One runtime object per node, created lazily (docker/SSH imports stay out of `--help`)."""

    def __init__(self, inventory: Inventory, ledger: Ledger, deployment_id: str = "shared") -> None:
        self.inventory = inventory
        self.ledger = ledger
        self.deployment_id = deployment_id
        self._cache: dict[str, Runtime] = {}
        self.launch: LaunchImage | None = None   # the launch image the docker ranks run, once bound

    def bind_launch(self, launch: LaunchImage | None) -> None:
        """Docker ranks run this launch image (entrypoint + launch document) instead of the engine image + argv."""
        self.launch = launch
        for rt in self._cache.values():
            if rt.runtime == "docker":
                rt.launch_image = launch  # type: ignore[attr-defined]

    def for_node(self, node: Node | str) -> Runtime:
        node = self.inventory.node(node) if isinstance(node, str) else node
        if node.name not in self._cache:
            self._cache[node.name] = self._make(node)
        return self._cache[node.name]

    def _make(self, node: Node) -> Runtime:
        if node.runtime == "process":
            cluster = self.inventory.cluster
            return ProcessRuntime(self.ledger.log_dir(self.deployment_id), cluster.sim,
                                  secrets_root=self.ledger.root / "secrets", engine=cluster.engine,
                                  engine_pythons=cluster.pythons(), models_dir=node.host_paths.models)
        if node.runtime == "docker":
            try:
                from sparkctl.nodes.docker_runtime import DockerRuntime
            except ImportError as exc:
                raise ConfigError(f"runtime 'docker' is unavailable: {exc}", where=f"[{node.name}]",
                                  hint="pip install 'sparkctl[nodes]'") from None
            rt = DockerRuntime(self.inventory, node, cluster=self.inventory.cluster.name,
                               log_dir=self.ledger.log_dir(self.deployment_id))
            rt.launch_image = self.launch
            return rt
        raise ConfigError(f"unknown runtime {node.runtime!r}", where=f"[{node.name}]")
