"""One error tree for sparkctl.

Library code raises these; only the CLI turns them into exit codes. Every error
carries *what* was wrong, *where* (file, key path, node, stage) and *what to do*,
plus optional evidence (a log tail, a command's output) so a failure explains itself.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar, Unpack

_E = TypeVar("_E", bound="SparkctlError")

# `sparkctl status`: the active deployment is unhealthy, a deployment was interrupted (its controller died), or
# a `bench --compare` did not finish its restore. Not an error (status reports it), so no class: the CLI's.
STATUS_NOT_OK = 8


class ErrorContext(TypedDict, total=False):
    """The keywords every error takes beside its message (SparkctlError's): a subclass passes them on as
    ``**kw: Unpack[ErrorContext]``."""

    where: str | None
    hint: str | None
    evidence: str | None


class SparkctlError(Exception):
    """A known, user-facing failure. Printed as one clear message, never a traceback.

    A bare SparkctlError is a request that cannot be done as given (exit 2): exit 1 is CancelledError's alone."""

    exit_code = 2

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None,
                 evidence: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.where = where
        self.hint = hint
        self.evidence = evidence

    def amended(self: _E, *, message: str | None = None, where: str | None = None,
                evidence: str | None = None) -> _E:
        """A copy with a new message, place or evidence (raise it `from` this one); a raised error is never
        changed."""
        new = copy.copy(self)
        new.message = self.message if message is None else message
        new.where = self.where if where is None else where
        new.evidence = self.evidence if evidence is None else evidence
        new.args = (new.message,)
        return new

    def render(self) -> str:
        parts = []
        head = f"{self.where}: {self.message}" if self.where else self.message
        parts.append(head)
        if self.hint:
            parts.append(f"  fix: {self.hint}")
        if self.evidence:
            parts.append("  evidence:")
            parts.extend("    " + line for line in self.evidence.rstrip().splitlines())
        return "\n".join(parts)

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.render()


class ConfigError(SparkctlError):
    """Bad profile, inventory or flag: exit status 2."""

    exit_code = 2


class MissingExtraError(ConfigError):
    """An optional extra of sparkctl (pyproject.toml: `nodes`, `prepare`, `router`, `watch`) that this command
    needs is not installed; `extra` names it and the hint gives the command that installs it (exit 2: the request
    cannot be done by this installation as it is; nothing was changed)."""

    def __init__(self, message: str, *, extra: str, **kw: Unpack[ErrorContext]) -> None:
        super().__init__(message, **kw)
        self.extra = extra


class OutputPathError(ConfigError):
    """A path the user named for an output (``--chart``, ``--out``, the tuned profile's directory) cannot take it
    as given: a directory, not writable, or an existing file without ``--force`` (exit 2, like a bad flag)."""


class RestartRefusedError(ConfigError):
    """An unattended restart (the watcher's) that cannot start exactly the recorded deployment here and now: a
    secret's variable missing from this environment, a rank that renders differently (the inventory changed), a
    recorded profile that no longer validates, a secret's value changed since, a file the launch needs gone from a
    node. Nothing was changed; starting something weaker is never the answer. `cause` names the kind (REFUSAL_CAUSES:
    the watcher's metrics label and webhook field)."""

    def __init__(self, message: str, *, cause: str = "not-as-recorded", **kw: Unpack[ErrorContext]) -> None:
        super().__init__(message, **kw)
        self.cause = cause if cause in REFUSAL_CAUSES else "not-as-recorded"


# Why an unattended restart is refused (RestartRefusedError.cause): a secret's variable unset here, set to another
# value than at deploy time, a node path the launch needs gone, the launch rendering differently (the inventory),
# the record itself (no profile kept, one that no longer validates).
REFUSAL_CAUSES = ("secret-missing", "secret-changed", "file-missing", "not-as-recorded", "record")


class PreflightError(SparkctlError):
    """A read-only check on a node failed before anything was changed; `checks` holds every check's result
    (empty when the failure was not a node check, e.g. the image stage)."""

    exit_code = 3

    def __init__(self, message: str, *, checks: list[Any] | None = None, **kw: Unpack[ErrorContext]) -> None:
        super().__init__(message, **kw)
        # sparkctl.state.records.CheckResult, which this module (the bottom of the import graph) cannot name
        self.checks: list[Any] = list(checks or [])


class DeployError(SparkctlError):
    """Boot, warm-up or verify failed (the lifecycle may have rolled back); `node` names the failing node and
    `failed_gates` the verify gates that failed (their names, e.g. ``capacity``), `failure_kind` what the engine's own
    fatal line said at a failed boot (``oom``, ``memory_budget``...): what `tune` classifies a candidate by, whatever
    the engine calls its numbers or words its errors)."""

    exit_code = 4

    def __init__(self, message: str, *, node: str | None = None, failed_gates: tuple[str, ...] = (),
                 failure_kind: str | None = None, **kw: Unpack[ErrorContext]) -> None:
        super().__init__(message, **kw)
        self.node = node
        self.failed_gates = failed_gates
        self.failure_kind = failure_kind     # a failed boot: the kind of the engine's fatal line (EventKind's value)


class LockHeldError(SparkctlError):
    """Another sparkctl command holds the cluster lock."""

    exit_code = 5


class LedgerError(SparkctlError):
    """A state record is corrupt or missing: reported, never silently replaced."""

    exit_code = 6


class StateDirError(LedgerError):
    """The state directory cannot be created or written (permissions, read-only file system, a file in the way)."""


class StateDirFullError(LedgerError):
    """The state directory's file system has no room (no space or no inodes left, or a quota reached): exit 6.

    `free_bytes` is the room seen (None when it could not be read), `need_bytes` the threshold it was held to.
    """

    def __init__(self, message: str, *, free_bytes: int | None = None, need_bytes: int | None = None,
                 **kw: Unpack[ErrorContext]) -> None:
        super().__init__(message, **kw)
        self.free_bytes = free_bytes
        self.need_bytes = need_bytes


class CancelledError(SparkctlError):
    """The user declined at the confirmation prompt; nothing was changed."""

    exit_code = 1


class NodeError(SparkctlError):
    """A command on a node failed (SSH, docker, process)."""

    exit_code = 7


@dataclass
class CommandFailed(NodeError):
    """A command on a node exited non-zero: keeps the argv, exit code and output tail."""

    node: str = ""
    argv: list[str] = field(default_factory=list)
    returncode: int | None = None
    output: str = ""

    def __post_init__(self) -> None:  # dataclass + Exception: build the message
        tail = "\n".join(self.output.rstrip().splitlines()[-20:])
        NodeError.__init__(self, f"command {self.argv!r} exited {self.returncode}",
                           where=f"[{self.node}]" if self.node else None, evidence=tail or None)


class ImageError(SparkctlError):
    """The image pipeline failed: a patch does not apply, a build or a copy to a node failed, a tag or an image
    ID does not match (exit 4, like a failed deploy: the running deployment is untouched)."""

    exit_code = 4


class BenchError(SparkctlError):
    """`sparkctl bench` could not measure honestly (exit 4, like a failed deploy): the endpoint broke a bound (a
    timeout, a deadline, a size cap) or the protocol (not JSON, malformed SSE), a rank died during the run, or a
    measurement failed. The card is still written, marked failed, with this error."""

    exit_code = 4


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP reached the CLI: handled like Ctrl-C (stop what started, restore the old).

    `signame` names the signal for messages and the record; the CLI exits 128 + `signum`.
    """

    def __init__(self, signum: int, signame: str) -> None:
        super().__init__(signame)
        self.signum = signum
        self.signame = signame


def interrupt_name(exc: BaseException) -> str:
    """'SIGTERM' for an Interrupted, 'SIGINT' for a plain KeyboardInterrupt (Python's own Ctrl-C)."""
    return getattr(exc, "signame", "SIGINT")
