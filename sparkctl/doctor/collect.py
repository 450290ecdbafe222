"""What the doctor reads: a deployment from the ledger (its rank logs, failure, journal, preflight facts, the nodes'
kernel logs where readable) or files the user names; and the report it returns.

Which deployment: the one asked for (`--deployment ID`), else the active one when it is unhealthy, else the newest
that failed, was cancelled or interrupted among the last `LOOKBACK` deployments (an older one by its id: the ledger
keeps every deployment, and a walk through all of them grew with it). Rank logs are read the way `sparkctl logs`
reads them (the runtime of the rank's node, from the handle in the record), falling back to the archive a removed
container left in the state directory (logs/<id>/rank<N>-<container>.log). Every read is bounded: the last
`MAX_READ_BYTES` of each source.
"""
from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from sparkctl.enginelog import ALL_SIGNATURES
from sparkctl.errors import ConfigError, SparkctlError
from sparkctl.sglang.findings import Finding, LogText, match_sources, printable
from sparkctl.state.records import DeploymentRecord, Status

if TYPE_CHECKING:
    from collections.abc import Callable

    from sparkctl.deploy.results import RankHealth
    from sparkctl.deploy.runtimes import Runtimes
    from sparkctl.nodes.handles import Handle
    from sparkctl.state.ledger import Ledger

log = logging.getLogger("sparkctl.doctor")

MAX_READ_BYTES = 8 * 1024 * 1024
DIAGNOSABLE = (Status.FAILED, Status.CANCELED, Status.INTERRUPTED)
LOOKBACK = 50    # deployments looked through, newest first, for a failed one (tests/lifecycle/test_history_bound)
KERNEL_LOG_ARGV = ["dmesg", "--level=emerg,alert,crit,err,warn"]
KERNEL_LOG_TIMEOUT_S = 15.0


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceRead(_Out):
    name: str
    path: str | None = Field(None, description="The file read (rank logs of the process runtime, --log files).")
    lines: int = 0
    bytes: int = 0
    truncated: bool = Field(False, description="Only the last 8 MiB were read.")
    error: str | None = Field(None, description="Why it could not be read (escaped).")


class FactLine(_Out):
    node: str
    name: str
    severity: str
    seen: str
    fix: str


class DoctorReport(_Out):
    """`sparkctl doctor --json`: what was read and every known failure signature found in it."""

    target: str = Field(description="'deployment ID' or 'files'.")
    deployment: str | None = None
    profile: str | None = None
    status: str | None = None
    failed_stage: str | None = None
    failure: str | None = Field(None, description="The record's failure message (escaped, first 600 chars).")
    sources: list[SourceRead]
    facts: list[FactLine] = Field(default_factory=list,
                                  description="Preflight checks of the deployment that warned or failed.")
    findings: list[Finding]
    bundle: str | None = Field(None, description="The support bundle written (--bundle).")
    leftovers: list[str] = Field(default_factory=list, description=(
        "Processes of sparkctl's engines that outlived them, by deployment and rank (an orphaned scheduler holds "
        "the rank's ports and, on a GB10, its memory): `sparkctl down` stops them."))


class Collected:
    """What was read, kept for the report and the bundle: texts (already redacted by their readers) and notes."""

    def __init__(self) -> None:
        self.texts: list[LogText] = []
        self.reads: list[SourceRead] = []

    def add(self, name: str, text: str, *, path: str | None = None, truncated: bool = False,
            secondary: bool = False) -> None:
        self.texts.append(LogText(name, text, secondary))
        self.reads.append(SourceRead(name=printable(name, 120), path=printable(path, 300) if path else None,
                                     lines=text.count("\n") + (1 if text and not text.endswith("\n") else 0),
                                     bytes=len(text.encode("utf-8", "replace")), truncated=truncated))

    def failed(self, name: str, error: str, *, path: str | None = None) -> None:
        self.reads.append(SourceRead(name=printable(name, 120), path=printable(path, 300) if path else None,
                                     error=printable(error, 300)))


def _tail_bytes(data: bytes) -> tuple[str, bool]:
    """The last MAX_READ_BYTES of `data` as text (undecodable bytes replaced), from a line start when cut."""
    if len(data) <= MAX_READ_BYTES:
        return data.decode("utf-8", "replace"), False
    tail = data[-MAX_READ_BYTES:]
    nl = tail.find(b"\n")
    return tail[nl + 1:].decode("utf-8", "replace") if 0 <= nl < 4096 else tail.decode("utf-8", "replace"), True


def read_file(path: Path) -> tuple[str, bool]:
    """The last MAX_READ_BYTES of a file the user named; ConfigError (exit 2) for a directory, a missing or an
    unreadable file."""
    if path.is_dir():
        raise ConfigError(f"--log {printable(str(path))} is a directory, not a log file",
                          hint="name a file, e.g. sparkctl logs --rank 0 --tail 0 > rank0.log; sparkctl doctor "
                               "--log rank0.log")
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_READ_BYTES:
                fh.seek(size - MAX_READ_BYTES)
            data = fh.read(MAX_READ_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"--log {printable(str(path))}: cannot read it: {exc.strerror or exc}",
                          hint="check the path and its permissions") from None
    text, cut = _tail_bytes(data)
    return text, cut or size > MAX_READ_BYTES


def collect_files(paths: list[Path]) -> Collected:
    got = Collected()
    for p in paths:
        text, cut = read_file(p)
        got.add(str(p), text, path=str(p), truncated=cut)
    return got


# ----------------------------------------------------------------------------------------------- deployments
def pick_deployment(ledger: Ledger, *, health_of: Callable[[DeploymentRecord], tuple[bool, str, list[RankHealth]]],
                    dep_id: str | None = None, any_record: bool = False) -> DeploymentRecord | None:
    """The deployment to diagnose (module doc); with `any_record` (a bundle was asked for) the newest record when
    nothing failed. None when there is nothing to diagnose."""
    if dep_id is not None:
        if dep_id not in ledger.history():
            raise ConfigError(f"--deployment {printable(dep_id, 80)}: no such deployment in the ledger",
                              where=str(ledger.root), hint="`sparkctl status` and the ledger's deployments/ list them")
        return ledger.load(dep_id)
    active = ledger.active()
    if active is not None and not health_of(active)[0]:
        return active
    for rid in reversed(ledger.history()[-LOOKBACK:]):
        rec = ledger.load(rid)
        if rec.status in DIAGNOSABLE:
            return rec
    if any_record:
        history = ledger.history()
        return active or (ledger.load(history[-1]) if history else None)
    return None


def _archived_log(ledger: Ledger, rec: DeploymentRecord, handle: Handle) -> Path | None:
    """The archive of a removed container's log (DockerRuntime.remove), or a process runtime's rank log."""
    d = ledger.log_dir(rec.id)
    name = getattr(handle, "container", None)
    for cand in ([d / f"rank{handle.rank}-{name}.log"] if name else []) + [d / f"rank{handle.rank}.log"]:
        if cand.is_file():
            return cand
    return None


def collect_deployment(rec: DeploymentRecord, ledger: Ledger, runtimes: Runtimes, *,
                       kernel_log: bool = True) -> Collected:
    """Rank logs, the kernel log of each node, the failure and the journal of `rec` (in that order: the rank logs'
    lines are the evidence a finding shows first)."""
    got = Collected()
    for h in sorted(rec.handles, key=lambda h: h.rank):
        name = f"rank {h.rank} [{h.node}]"
        try:
            text, _ = runtimes.for_node(h.node).read_log(h, 0)
            text, cut = _tail_bytes(text.encode("utf-8", "replace"))
            got.add(name, text, path=getattr(h, "log", None), truncated=cut)
            continue
        except (SparkctlError, OSError) as exc:
            err = exc.render() if isinstance(exc, SparkctlError) else str(exc)
        archived = _archived_log(ledger, rec, h)
        if archived is not None:
            text, cut = read_file(archived)
            got.add(name + " (archived)", text, path=str(archived), truncated=cut)
        else:
            got.failed(name, err.splitlines()[0] if err else "unreadable")
    if kernel_log:
        _kernel_logs(rec, runtimes, got)
    failure = "\n".join(filter(None, [rec.failure.message if rec.failure else None]
                               + [s.error for s in rec.steps if s.error]))
    if failure:
        got.add("failure record", failure, secondary=True)
    if rec.journal:
        got.add("journal", "\n".join(e.line() for e in rec.journal), secondary=True)
    return got


def _kernel_logs(rec: DeploymentRecord, runtimes: Runtimes, got: Collected) -> None:
    """`dmesg` (errors and warnings) of each node of `rec`, where the user may read it (kernel.dmesg_restrict=1 is
    common: then a note, never sudo). The process runtime's nodes are this machine: read once."""
    local_done = False
    for node in sorted({h.node for h in rec.handles} | {s.node for s in rec.specs}):
        try:
            rt = runtimes.for_node(node)
        except SparkctlError as exc:
            got.failed(f"kernel log [{node}]", exc.message)
            continue
        ssh = getattr(rt, "ssh", None)
        if ssh is not None:
            try:
                res = ssh.run(KERNEL_LOG_ARGV, check=False, timeout=KERNEL_LOG_TIMEOUT_S)
            except SparkctlError as exc:
                got.failed(f"kernel log [{node}]", exc.message)
                continue
            out, rc, err = res.stdout, res.returncode, res.stderr
        elif not local_done:
            local_done = True
            node = f"{node}: this machine"
            try:
                p = subprocess.run(KERNEL_LOG_ARGV, capture_output=True, timeout=KERNEL_LOG_TIMEOUT_S, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                got.failed(f"kernel log [{node}]", str(exc))
                continue
            out, rc = p.stdout.decode("utf-8", "replace"), p.returncode
            err = p.stderr.decode("utf-8", "replace")
        else:
            continue
        if rc != 0:
            got.failed(f"kernel log [{node}]", (err.strip().splitlines() or [f"dmesg exited {rc}"])[-1])
        else:
            text, cut = _tail_bytes(out.encode("utf-8", "replace"))
            got.add(f"kernel log [{node}]", text, truncated=cut)


def facts_of(rec: DeploymentRecord) -> list[FactLine]:
    return [FactLine(node=printable(c.node, 80), name=printable(c.name, 80), severity=c.severity,
                     seen=printable(c.seen, 600), fix=printable(c.fix, 600))
            for c in rec.preflight if not c.ok or c.severity != "ok"]


def report_of(got: Collected, rec: DeploymentRecord | None) -> DoctorReport:
    findings = match_sources(got.texts, ALL_SIGNATURES)
    if rec is None:
        return DoctorReport(target="files", sources=got.reads, findings=findings)
    stage = rec.failure.step if rec.failure else None
    return DoctorReport(target=f"deployment {rec.id}", deployment=rec.id, profile=rec.profile,
                        status=rec.status.value, failed_stage=stage,
                        failure=printable(rec.failure.message, 600) if rec.failure else None,
                        sources=got.reads, facts=facts_of(rec), findings=findings)
