"""`sparkctl doctor`: match known SGLang / NCCL / GB10 failure signatures in a deployment's logs or in files."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sparkctl.cli.options import flag
from sparkctl.errors import STATUS_NOT_OK, ConfigError

if TYPE_CHECKING:
    from sparkctl.doctor.collect import DoctorReport


def _human(report: DoctorReport) -> None:
    r = report
    if r.deployment:
        where = f" (profile {r.profile}, {r.status}" + (f" at {r.failed_stage}" if r.failed_stage else "") + ")"
        print(f"doctor: deployment {r.deployment}{where}")
        if r.failure:
            print(f"  failure: {r.failure.split(chr(92) + 'n', 1)[0]}")
    for s in r.sources:
        print(f"  read {s.name}: " + (f"not readable: {s.error}" if s.error else
                                      f"{s.lines} lines" + (" (last 8 MiB)" if s.truncated else "")))
    for fact in r.facts:
        print(f"  preflight [{fact.node}] {fact.name}: {fact.severity}: {fact.seen}")
    for f in r.findings:
        print(f"FOUND {f.signature}: {f.title}")
        print(f"  cause: {f.cause}")
        print(f"  fix: {f.fix}")
        print(f"  source: {f.source}")
        print(f"  evidence ({f.matches} line{'s' if f.matches != 1 else ''}):")
        for e in f.evidence:
            print(f"    {e.source}:{e.line}: {e.text}")
    for lo in r.leftovers:
        print(f"LEFTOVER processes of {lo} outlived their engine: `sparkctl down` stops them")
    if not r.findings and r.target != "nothing":
        print("no known failure signature found (`sparkctl doctor --list` shows the catalogue)")
    if r.bundle:
        print(f"bundle written: {r.bundle}")


def _list() -> None:
    from sparkctl.enginelog import ALL_SIGNATURES
    for s in ALL_SIGNATURES:
        print(f"{s.id}: {s.title}\n  pattern: {s.pattern.pattern}\n  fix: {s.fix}\n  source: {s.source}")


def register(app: typer.Typer) -> None:
    @app.command()
    def doctor(log: list[Path] | None = typer.Option(None, "--log", metavar="FILE",
                                                     help="Read this log file instead of a deployment (repeatable)."),
               deployment: str | None = typer.Option(None, "--deployment", metavar="ID",
                                                        help="Diagnose this deployment (default: the active one when "
                                                             "unhealthy, else the newest failed one among the last "
                                                             "50)."),
               bundle: Path | None = typer.Option(None, "--bundle", metavar="FILE",
                                                     help="Also write a redacted support bundle (one JSON file)."),
               force: bool = flag("--force", help="Replace an existing --bundle file."),
               no_kernel_log: bool = flag("--no-kernel-log", help="Do not read the nodes' kernel logs (dmesg)."),
               list_: bool = flag("--list", help="Print the catalogue of known failure signatures and exit."),
               inventory: str | None = typer.Option(None, "--inventory", "-i",
                                                       help="Ansible inventory file (default: see README)."),
               as_json: bool = flag("--json", help="The report as JSON on stdout.")) -> None:
        """Match known SGLang / NCCL / GB10 failure signatures in the last failed or unhealthy deployment (rank logs,
        failure, journal, preflight facts, kernel logs where readable) or in --log files: cause, evidence, fix and
        source of each.

        Exit 0 when no known failure signature was found (or nothing failed), 8 when one was (or processes of an
        engine outlived it); 2 for a --log or --bundle that is a directory, a link or an existing file (without
        --force), an unreadable --log, an unknown --deployment."""

        if list_:
            _list()
            return
        if force and bundle is None:
            raise ConfigError("--force goes with --bundle (it replaces an existing bundle file)",
                              hint="sparkctl doctor --bundle FILE --force")
        if bundle is not None:              # refused before anything is read, as the writer would refuse it
            from sparkctl.userfiles import check_user_target
            check_user_target(bundle, overwrite=force, option="--bundle")
        if log and deployment:
            raise ConfigError("--log and --deployment name different things to read: give one of them",
                              hint="sparkctl doctor --log FILE, or sparkctl doctor --deployment ID")
        if log:
            from sparkctl.doctor.run import doctor_files
            report = doctor_files(list(log), bundle=bundle, force=force)
        else:
            from sparkctl.cli.deploy_cmds import _deployer
            from sparkctl.deploy.door import deployed
            from sparkctl.doctor.run import doctor_deployment
            d = _deployer(inventory, quiet=True)
            if deployed(d).kind == "replicated":
                raise ConfigError("the cluster runs a replicated deployment: the doctor reads one group's ledger",
                                  hint="save a replica's log (sparkctl logs --replica I --rank N --tail 0 > r.log) "
                                       "and run sparkctl doctor --log r.log")
            found = doctor_deployment(d.cluster, dep_id=deployment, bundle=bundle, kernel_log=not no_kernel_log,
                                      force=force)
            if found is None:
                from sparkctl.doctor.collect import LOOKBACK
                msg = f"nothing to diagnose: no failed, cancelled or interrupted deployment among the last " \
                      f"{LOOKBACK}, and the active one (if any) is healthy (an older one: --deployment ID)"
                if as_json:
                    from sparkctl.doctor.collect import DoctorReport
                    print(DoctorReport(target="nothing", sources=[], findings=[]).model_dump_json(indent=2))
                else:
                    print(f"doctor: {msg}")
                return
            report = found
        if as_json:
            print(report.model_dump_json(indent=2))
        else:
            _human(report)
        if report.findings or report.leftovers:
            sys.stdout.flush()
            raise typer.Exit(STATUS_NOT_OK)
