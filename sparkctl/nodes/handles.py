"""Handles: how a later sparkctl command finds an engine again (stored in the deployment record).

A runtime's `start` returns one; `liveness`, `read_log`, `stop` and `remove` take it back. The two are
told apart by `runtime` (a discriminated union), so a record read from disk comes back as the right class.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from sparkctl.jsontypes import JSONObject, renamed_keys

# Keys of a stored handle renamed since: old name -> new name (a record's own keys: state.records.RENAMED_KEYS).
RENAMED_KEYS = {
    "kind": "runtime",          # 2026-12
}


class _HandleBase(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)   # extra: keys a newer sparkctl wrote survive a re-save

    node: str
    rank: int
    deployment: str

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: object) -> object:
        return renamed_keys(data, RENAMED_KEYS) if isinstance(data, dict) else data

    @property
    def where(self) -> str:
        """Where the engine runs, for messages: 'pid 123' or 'container sparkctl-...'."""
        raise NotImplementedError

    @property
    def log_ref(self) -> str:
        raise NotImplementedError


class ProcessHandle(_HandleBase):
    """A local emulator process: PID plus its kernel start time (a recycled PID is never taken for ours)."""

    runtime: Literal["process"] = "process"
    pid: int
    start_ticks: int | None = None
    log: str
    # Where this boot attempt's lines start in `log` (bytes): earlier attempts of the same rank and deployment (a
    # restore, a rollback's restart) come before it, and readiness and fatal-line detection never read them.
    log_offset: int = 0
    spec: JSONObject = Field(default_factory=dict)
    # The cgroup (v2) every process of this engine was born in, where the node let sparkctl make one
    # (sparkctl.nodes.enginegroup); None: its session alone tracks it.
    cgroup: str | None = None

    @property
    def where(self) -> str:
        return f"pid {self.pid}"

    @property
    def log_ref(self) -> str:
        return self.log


class DockerHandle(_HandleBase):
    """An engine container on a node: name and ID, image, and where this run's log starts."""

    runtime: Literal["docker"] = "docker"
    cluster: str
    container: str
    container_id: str
    image: str | None = None
    image_id: str | None = None
    log: None = None
    log_since: str | None = None      # docker timestamp of this start (a reused container's log starts here)
    started_at: str | None = None

    @property
    def where(self) -> str:
        return f"container {self.container}"

    @property
    def log_ref(self) -> str:
        return self.container


def _runtime_of(value: object) -> object:
    """Which handle a stored one is: its `runtime` (`kind` in a record written before the rename)."""
    if isinstance(value, dict):
        return renamed_keys(value, RENAMED_KEYS).get("runtime")
    return getattr(value, "runtime", None)


Handle = Annotated[Annotated[ProcessHandle, Tag("process")] | Annotated[DockerHandle, Tag("docker")],
                   Discriminator(_runtime_of)]
