"""`sparkctl tune`: search launch flags on the cluster, confirm the winner A B A B, restore (library: sparkctl.tune)."""
from __future__ import annotations

import re
import sys

import typer

from sparkctl.cli.options import flag
from sparkctl.errors import ConfigError

_DURATION_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def parse_duration(text: str, option: str = "--budget") -> float:
    """``2h`` / ``90m`` / ``1h30m`` / ``600`` (seconds) -> seconds; ConfigError naming the flag otherwise."""
    m = _DURATION_RE.match(text.strip().lower()) if text else None
    if not m or not any(m.groups()):
        raise ConfigError(f"{text!r} is not a duration", where=option, hint="e.g. 2h, 90m, 1h30m or 600 (seconds)")
    h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    total = h * 3600 + mi * 60 + s
    if not 0 < total <= 30 * 86400:
        raise ConfigError(f"{text!r} is out of range", where=option, hint="between 1 s and 30 days")
    return total


def register(app: typer.Typer) -> None:
    @app.command()
    def tune(profile: str | None = typer.Option(None, "--profile", "-p", help="The profile to tune (the baseline)."),
             vary: list[str] = typer.Option([], "--vary", help="KEY=V1,V2,... a dotted profile key and its values "
                                            "(repeat for a grid), e.g. speculative.num_draft_tokens=4,6,8."),
             objective: str = typer.Option("decode", "--objective", help="decode (code tok/s, higher), ttft "
                                           "(smallest size, lower) or aggregate-c2 (c2 aggregate tok/s, higher)."),
             budget: str | None = typer.Option(None, "--budget", help="Wall-clock budget (2h, 90m, 600): no trial "
                                                  "starts that would not fit with the confirmation."),
             trials: int | None = typer.Option(None, "--trials", min=1, max=10_000, help="At most N candidates "
                                                  "(grid order) besides the baseline."),
             runs: int = typer.Option(5, "--runs", min=1, max=1000, help="Decode runs per trial (medians)."),
             max_tokens: int = typer.Option(800, "--max-tokens", min=2, max=1 << 20, help="max_tokens per decode run."),
             warmup: int = typer.Option(1, "--warmup", min=0, max=1000, help="Warm-up requests per trial."),
             confirm_rounds: int = typer.Option(2, "--confirm-rounds", min=1, max=50, help="A B rounds of the "
                                                "confirmation (2 = A B A B)."),
             resume_run: str | None = typer.Option(None, "--resume", help="Continue this tune run (finished "
                                                      "trials are not redone)."),
             inventory: str | None = typer.Option(None, "--inventory", "-i", help="Ansible inventory file."),
             force: bool = flag("--force", help="Replace a tuned profile file of the same name in the profiles "
                                "directory ($SPARKCTL_PROFILES_DIR; without --force it is refused before any trial)."),
             as_json: bool = flag("--json", help="The whole tune journal as JSON on stdout.")) -> None:
        """Grid search of launch flags: each trial a full deploy + bench; the best candidate confirmed against the
        baseline A B A B beyond the noise band and written as a profile; what ran before restored (journaled)."""

        from sparkctl.config.inventory import resolve_inventory
        from sparkctl.deploy.commands import Deployer
        from sparkctl.deploy.progress import Reporter
        from sparkctl.state.tunejournal import TuneOptions, journal_path
        from sparkctl.tune import run as tr

        reporter = Reporter()
        reporter.stage("tune")

        def progress(message: str) -> None:
            reporter.stage_name = "tune"
            reporter.event(message)
        deployer = Deployer(resolve_inventory(inventory), reporter)
        if resume_run:
            if profile or vary:
                raise ConfigError("--resume continues a recorded tune: its profile and --vary are in its journal",
                                  where="--resume", hint=f"sparkctl tune --resume {resume_run}")
            data = tr.resume(deployer, resume_run, progress)
        else:
            if not profile or not vary:
                raise ConfigError("tune needs --profile and at least one --vary", where="--profile/--vary",
                                  hint="e.g. sparkctl tune --profile d5 --vary speculative.num_draft_tokens=4,6,8")
            opts = TuneOptions(profile=profile, vary=list(vary), objective=objective,
                                  budget_s=parse_duration(budget) if budget else None, trials=trials, runs=runs,
                                  max_tokens=max_tokens, warmup=warmup, confirm_rounds=confirm_rounds,
                                  overwrite=force)
            data = tr.tune(deployer, opts, progress)
        if as_json:
            from sparkctl.cli.outputs import print_json
            print_json(data.as_json())
        else:
            from sparkctl.tune.table import render
            render(data, sys.stdout)                 # rich on a terminal, plain text in a pipe
        print(f"sparkctl: tune {data.run_id}: journal {journal_path(deployer.ledger, data.run_id)}",
              file=sys.stderr)
