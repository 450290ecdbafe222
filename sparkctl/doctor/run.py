"""The doctor's two entry points, one per target: files the user names, or a deployment of the ledger.

Example::

    report = doctor_files([Path("rank0.log")])
    report = doctor_deployment(Deployer(resolve_inventory(None)).cluster, bundle=Path("bundle.json"))
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sparkctl.deploy.observe import leftovers
from sparkctl.doctor.bundle import bundle_data, secret_values, write_bundle
from sparkctl.doctor.collect import (
    Collected,
    DoctorReport,
    collect_deployment,
    collect_files,
    pick_deployment,
    report_of,
)
from sparkctl.redaction import redact
from sparkctl.state.records import DeploymentRecord

if TYPE_CHECKING:
    from sparkctl.deploy.cluster import Cluster


def _finish(got: Collected, rec: DeploymentRecord | None, bundle: Path | None, force: bool = False) -> DoctorReport:
    secrets = secret_values(rec)
    for t in got.texts:     # a --log file may hold what sparkctl's own logs never do: redacted before any output
        t.text = redact(t.text, secrets)
    report = report_of(got, rec)
    if bundle is not None:
        write_bundle(bundle, bundle_data(report, got, rec, secrets), force=force)
        report.bundle = str(bundle)
    return report


def doctor_files(paths: list[Path], *, bundle: Path | None = None, force: bool = False) -> DoctorReport:
    """Match the catalogue in `paths` (the last 8 MiB of each); ConfigError for a directory or unreadable file.
    `force`: an existing `bundle` file is replaced."""
    return _finish(collect_files(paths), None, bundle, force)


def doctor_deployment(cluster: Cluster, *, dep_id: str | None = None, bundle: Path | None = None,
                      kernel_log: bool = True, force: bool = False) -> DoctorReport | None:
    """Match the catalogue in what a deployment left: `dep_id`, else the active one when unhealthy, else the newest
    failed, cancelled or interrupted one (a bundle asked for: else the newest). None when nothing is to diagnose."""

    left = [lo.describe() for lo in leftovers(cluster)]
    rec = pick_deployment(cluster.ledger, health_of=cluster.health_of, dep_id=dep_id, any_record=bundle is not None)
    if rec is None:
        return DoctorReport(target="nothing", sources=[], findings=[], leftovers=left) if left else None
    got = collect_deployment(rec, cluster.ledger, cluster.runtimes(rec.id), kernel_log=kernel_log)
    report = _finish(got, rec, bundle, force)
    report.leftovers = left
    return report
