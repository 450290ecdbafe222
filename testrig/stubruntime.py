"""A base for the runtimes a unit test hands to sparkctl.deploy.boot: the whole Runtime protocol
(sparkctl.nodes.runtime), of which a test overrides what boot calls (start, liveness, read_log, poll_interval_s).
The rest raises NotImplementedError: boot never calls it, and a test that does needs its own."""
from __future__ import annotations

from sparkctl.nodes.handles import Handle, ProcessHandle
from sparkctl.nodes.node_facts import NodeFacts
from sparkctl.nodes.runtime import Liveness
from sparkctl.sglang.launch import LaunchSpec


class StubRuntime:
    """A local-process runtime that starts nothing by itself."""

    runtime = "process"
    needs_image = False
    poll_interval_s = 0.01

    def _not_stubbed(self, what: str) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__}.{what}: not part of this stand-in")

    def gather(self, spec: LaunchSpec) -> NodeFacts:
        raise self._not_stubbed("gather")

    def launch_argv(self, spec: LaunchSpec, deployment_id: str) -> list[str]:
        raise self._not_stubbed("launch_argv")

    def start(self, spec: LaunchSpec, deployment_id: str, prepared: object = None) -> Handle:
        raise self._not_stubbed("start")

    def prepare(self, spec: LaunchSpec, deployment_id: str) -> None:
        return None

    def follow(self, handle: ProcessHandle, bound_s: float) -> None:
        pass

    def unfollow(self) -> None:
        pass

    def liveness(self, handle: ProcessHandle) -> Liveness:
        raise self._not_stubbed("liveness")

    def read_log(self, handle: ProcessHandle, offset: int = 0) -> tuple[str, int]:
        raise self._not_stubbed("read_log")

    def stop(self, handle: ProcessHandle, *, timeout_s: float = 15.0) -> None:
        raise self._not_stubbed("stop")

    def remove(self, handle: ProcessHandle) -> None:
        raise self._not_stubbed("remove")

    def cleanup_secrets(self) -> list[str]:
        raise self._not_stubbed("cleanup_secrets")
