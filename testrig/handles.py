"""What the tests read from a deployment record, typed: the record types a rank's handle as either kind (a local
process or a Docker container) or None, and the ledger's active record as optional. A test knows which it deployed;
these helpers say so (an assertion naming the record when it is not) and give the type checker the narrowed type."""
from __future__ import annotations

from sparkctl.nodes.handles import DockerHandle, ProcessHandle
from sparkctl.state.ledger import Ledger
from sparkctl.state.records import DeploymentRecord


def record(rec: DeploymentRecord | None) -> DeploymentRecord:
    """`rec`, which the test expects to be there (the ledger's active record, a known-good one)."""
    assert rec is not None, "no deployment record"
    return rec


def active(ledger: Ledger) -> DeploymentRecord:
    """The ledger's active deployment record (the test deployed one)."""
    rec = ledger.active()
    assert rec is not None, f"no active deployment in {ledger.root}"
    return rec


def process_handle(rec: DeploymentRecord | None, rank: int) -> ProcessHandle:
    """Rank `rank` of `rec`, run as a local process."""
    handle = record(rec).handle_of(rank)
    assert isinstance(handle, ProcessHandle), f"rank {rank} of {record(rec).id} is not a local process: {handle}"
    return handle


def docker_handle(rec: DeploymentRecord | None, rank: int) -> DockerHandle:
    """Rank `rank` of `rec`, run as a Docker container."""
    handle = record(rec).handle_of(rank)
    assert isinstance(handle, DockerHandle), f"rank {rank} of {record(rec).id} is not a container: {handle}"
    return handle


def pid_of(rec: DeploymentRecord | None, rank: int) -> int:
    """The recorded pid of rank `rank` of `rec` (a local process: its log pipe)."""
    return process_handle(rec, rank).pid


def process_handles(rec: DeploymentRecord | None) -> list[ProcessHandle]:
    """Every handle of `rec`, each a local process."""
    handles = record(rec).handles
    assert all(isinstance(h, ProcessHandle) for h in handles), f"{record(rec).id} has a handle that is no process"
    return [h for h in handles if isinstance(h, ProcessHandle)]


def docker_handles(rec: DeploymentRecord | None) -> list[DockerHandle]:
    """Every handle of `rec`, each a Docker container."""
    handles = record(rec).handles
    assert all(isinstance(h, DockerHandle) for h in handles), f"{record(rec).id} has a handle that is no container"
    return [h for h in handles if isinstance(h, DockerHandle)]


def pids(rec: DeploymentRecord | None) -> list[int]:
    """The recorded pids of every rank of `rec` (local processes), in the record's order."""
    return [h.pid for h in process_handles(rec)]
