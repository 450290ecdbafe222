"""`sparkctl watch`: the supervisor of one cluster (sparkctl/watch/), and its systemd unit (--install/--uninstall)."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sparkctl.cli import bounds
from sparkctl.cli.deploy_cmds import INVENTORY_OPT, _deployer
from sparkctl.cli.options import flag
from sparkctl.errors import ConfigError

if TYPE_CHECKING:
    from sparkctl.watch.supervisor import WatchOptions


def _carried(inventory_path: str, opts: dict[str, float | str | None]) -> list[str]:
    """The options a unit's `sparkctl watch` runs with: the inventory the installer resolved (absolute, whichever
    lookup found it) and every option given (a --notify-file path made absolute)."""
    args = ["watch", "--inventory", os.path.abspath(inventory_path)]
    for name, value in opts.items():
        if value is None:
            continue
        if name == "--notify-file":
            value = os.path.abspath(os.path.expanduser(str(value)))
        args += [name, f"{value:g}" if isinstance(value, float) else str(value)]
    return args


def _defines(env_file: Path, name: str) -> bool:
    try:
        text = env_file.read_text(errors="replace")
    except OSError:
        return False
    return any(re.match(rf"\s*{re.escape(name)}\s*=", ln) for ln in text.splitlines())


def _install(inventory: str | None, opts: dict[str, float | str | None], *, system: bool, uninstall: bool,
             unit_dir: str | None, force: bool) -> None:
    from sparkctl.config.inventory import resolve_inventory
    from sparkctl.watch import systemd

    scope: systemd.Scope = "system" if system else "user"
    inv = resolve_inventory(inventory)
    name = systemd.unit_name(inv.cluster.name)
    directory = Path(unit_dir) if unit_dir else systemd.unit_dir(scope)
    if uninstall:
        removed = systemd.uninstall(directory, name)
        print(f"removed {removed}" if removed else f"no unit {directory / name} to remove")
        for step in systemd.next_steps(scope, name, installed=False):
            print(f"next: {step}")
        return
    inputs = systemd.resolved_inputs(systemd.sparkctl_argv() + _carried(inv.path, opts))
    text = systemd.unit_text(inputs, inv.cluster.name, scope=scope)
    path = systemd.install(text, directory, name, force=force)
    print(f"wrote {path}")
    secrets = systemd.secrets_file(scope)
    var = opts.get("--notify-env")
    if var and not _defines(secrets, str(var)):
        print(f"next: put {var}=<the webhook URL> in {secrets} (chmod 600): the unit reads it from there, never "
              "from its ExecStart")
    for step in systemd.next_steps(scope, name, installed=True):
        print(f"next: {step}")


def _notify_url(notify: str | None, notify_file: str | None, notify_env: str | None) -> str | None:
    """The webhook URL from the one place it was given (module notify: a URL with credentials never from argv)."""
    from sparkctl.watch import notify as hook

    given = [n for n, v in (("--notify", notify), ("--notify-file", notify_file), ("--notify-env", notify_env))
             if v is not None]
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)} each name the webhook: give one of them",
                          hint="--notify URL (no credentials in it), --notify-file PATH or --notify-env VAR")
    if notify is not None:
        return hook.check_argv_url(notify)
    if notify_file is not None:
        return hook.read_url_file(notify_file)
    if notify_env is not None:
        return hook.read_url_env(notify_env)
    return None


def register(app: typer.Typer) -> None:
    app.command()(watch)


def watch(inventory: str | None = INVENTORY_OPT,
          interval: float = typer.Option(5.0, "--interval", parser=bounds.seconds(0.0, 3600), metavar="SECONDS",
                                         help="Seconds between two checks."),
          backoff: float = typer.Option(10.0, "--backoff", parser=bounds.seconds(0.0, 3600), metavar="SECONDS",
                                        help="Wait after a failed restart; doubles with each failure in a row."),
          backoff_max: float = typer.Option(300.0, "--backoff-max", parser=bounds.seconds(0.0, 86400),
                                            metavar="SECONDS", help="Longest wait between two restarts."),
          max_failures: int = typer.Option(3, "--max-failures", parser=bounds.count(1, 1000), metavar="N",
                                           help="Failed restarts within --window that make a crash loop: roll "
                                                "back, then stop acting."),
          window: float = typer.Option(600.0, "--window", parser=bounds.seconds(0.0, 7 * 86400),
                                       metavar="SECONDS", help="The crash-loop window (default 10 minutes)."),
          boot_timeout: float | None = typer.Option(None, "--boot-timeout", parser=bounds.seconds(),
                                                       metavar="SECONDS", help="Each restart's boot timeout "
                                                                               "(default: the profile's)."),
          fail_checks: int = typer.Option(2, "--fail-checks", parser=bounds.count(1, 1000), metavar="N",
                                          help="Failed checks within --fail-window before a restart (one "
                                               "missed check is a slow rank, not a dead one)."),
          fail_window: float = typer.Option(60.0, "--fail-window", parser=bounds.seconds(0.0, 86400),
                                            metavar="SECONDS", help="The window of --fail-checks."),
          metrics_port: int | None = typer.Option(None, "--metrics-port", parser=bounds.count(0, 65535),
                                                     metavar="PORT", help="Serve Prometheus metrics on this port "
                                                                          "(needs the `watch` extra)."),
          metrics_addr: str = typer.Option("127.0.0.1", "--metrics-addr", metavar="ADDR",
                                           help="Address the metrics are served on."),
          notify: str | None = typer.Option(None, "--notify", metavar="URL",
                                               help="POST a JSON event to this webhook on each restart and "
                                                    "give-up (no secrets in it). A URL with credentials (user, "
                                                    "password, query, token in its path) is refused here: use "
                                                    "--notify-file or --notify-env."),
          notify_file: str | None = typer.Option(None, "--notify-file", metavar="PATH",
                                                    help="Read the webhook URL from this file (its first line; "
                                                         "0600 when it holds credentials)."),
          notify_env: str | None = typer.Option(None, "--notify-env", metavar="VAR",
                                                   help="Read the webhook URL from this environment variable "
                                                        "(for the unit: set in its EnvironmentFile)."),
          force: bool = flag("--force", help="With --install: replace an existing unit file."),
          install: bool = flag("--install", help="Write a systemd unit that runs this watcher (with these "
                                                  "options) instead of running it."),
          uninstall: bool = flag("--uninstall", help="Remove the systemd unit."),
          user: bool = flag("--user", help="With --install/--uninstall: a user unit (the default)."),
          system: bool = flag("--system", help="With --install/--uninstall: a system unit (root)."),
          unit_dir: str | None = typer.Option(None, "--unit-dir", metavar="DIR", hidden=True,
                                                 help="Write the unit there (tests)."),
          ) -> None:
    """Supervise the cluster: restart a failed TP group as a group, in order, gated; roll back a crash loop.

    Runs in the foreground until SIGINT/SIGTERM (a restart in progress is finished or restored first); logs to
    stderr and to the state directory's watch.log. A user's `up`, `rollback` or `down` becomes its desired
    state. `sparkctl status` shows it."""
    _check_unit_options(install=install, uninstall=uninstall, user=user, system=system, unit_dir=unit_dir,
                        force=force)
    url = _notify_url(notify, notify_file, notify_env)
    if metrics_port is not None:
        from sparkctl.watch.metrics import require_prometheus
        require_prometheus()
    if install or uninstall:
        _install(inventory, {"--interval": interval, "--backoff": backoff, "--backoff-max": backoff_max,
                             "--max-failures": max_failures, "--window": window, "--boot-timeout": boot_timeout,
                             "--fail-checks": fail_checks, "--fail-window": fail_window,
                             "--metrics-port": metrics_port,
                             "--metrics-addr": metrics_addr if metrics_port is not None else None,
                             "--notify": notify, "--notify-file": notify_file, "--notify-env": notify_env},
                 system=system, uninstall=uninstall, unit_dir=unit_dir, force=force)
        return
    from sparkctl.watch.supervisor import WatchOptions
    opts = WatchOptions(interval_s=interval, backoff_s=backoff, backoff_max_s=backoff_max,
                        max_failures=max_failures, window_s=window, boot_timeout_s=boot_timeout,
                        fail_checks=fail_checks, fail_window_s=fail_window)
    _run(inventory, opts, metrics_port, metrics_addr, url)


def _check_unit_options(*, install: bool, uninstall: bool, user: bool, system: bool, unit_dir: str | None,
                        force: bool) -> None:
    """The unit options (--install/--uninstall, --user/--system, --unit-dir, --force) given together only as they
    make sense, else ConfigError (exit 2) before anything is read."""

    if user and system:
        raise ConfigError("--user and --system choose where the unit goes: give one of them",
                          hint="sparkctl watch --install --user (default) or --install --system")
    if install and uninstall:
        raise ConfigError("--install and --uninstall: give one of them", hint="sparkctl watch --install")
    if (user or system or unit_dir) and not (install or uninstall):
        raise ConfigError("--user/--system/--unit-dir go with --install or --uninstall",
                          hint="sparkctl watch --install --user")
    if force and not install:
        raise ConfigError("--force goes with --install (it replaces an existing unit file)",
                          hint="sparkctl watch --install --force")


def _run(inventory: str | None, opts: WatchOptions, metrics_port: int | None, metrics_addr: str,
         notify: str | None) -> None:
    from sparkctl.state.watchfile import WATCH_LOG
    from sparkctl.watch.log import WatchLog, WatchReporter
    from sparkctl.watch.supervisor import Watcher

    d = _deployer(inventory)
    reporter = WatchReporter(WatchLog(d.ledger.root / WATCH_LOG), sys.stderr)
    metrics = None
    if metrics_port is not None:
        from sparkctl.watch.metrics import WatchMetrics
        metrics = WatchMetrics(metrics_port, metrics_addr, d.inventory.cluster.name)
    notifier = None
    if notify is not None:
        from sparkctl.watch.notify import Notifier
        notifier = Notifier(notify)
    try:
        Watcher(d.inventory, reporter, opts, metrics=metrics, notifier=notifier).run()
    finally:
        if metrics is not None:
            metrics.close()
