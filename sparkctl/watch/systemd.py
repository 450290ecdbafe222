"""The systemd unit `sparkctl watch --install [--user|--system]` writes, and `--uninstall` removes.

The unit runs `sparkctl watch` in the foreground with the options it was installed with (the inventory as an
absolute path), `Restart=on-failure`, after the network is online and Docker is up. The engine containers keep
`--restart no`: after a reboot the watcher, not Docker, brings the TP group back, as a group and in order
(Docker restarting each rank alone leaves a pair wedged). Secrets never go into the unit: the API key's variable
comes from an optional `EnvironmentFile` the user writes (``~/.config/sparkctl/watch.env``, 0600).
ExecStart arguments are quoted for systemd (`systemd_quote`), never joined into a shell string. Example::

    text = unit_text(["/usr/local/bin/sparkctl", "watch", "--interval", "5"], "local", scope="user")
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Literal

from sparkctl.errors import ConfigError, OutputPathError

Scope = Literal["user", "system"]
# Variables that choose what the watcher sees: carried into the unit when set (never a secret).
CARRIED_ENV = ("SPARKCTL_STATE_DIR", "SPARKCTL_INVENTORY", "SPARKCTL_PROFILES_DIR", "XDG_CONFIG_HOME")


def unit_name(cluster: str) -> str:
    return f"sparkctl-watch-{cluster}.service"


def unit_dir(scope: Scope) -> Path:
    if scope == "system":
        return Path("/etc/systemd/system")
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def env_file(scope: Scope) -> str:
    """Where the unit looks for the user's secrets file (optional: a leading '-')."""
    if scope == "system":
        return "-/etc/sparkctl/watch.env"
    return "-%h/.config/sparkctl/watch.env"


def systemd_quote(arg: str) -> str:
    """One ExecStart argument: double-quoted, with systemd's escapes (backslash, quote) and specifiers (% -> %%,
    $ -> $$) made literal."""
    if any(ch in arg for ch in "\n\r\0"):
        raise ConfigError(f"{arg!r} cannot be written into a systemd unit (a newline or NUL)", where="--install",
                          hint="use paths and values without control characters")
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$") + '"'


def sparkctl_argv() -> list[str]:
    """How to run this sparkctl from a unit: its console script when this process is one, else the one on PATH,
    else this Python with `-m sparkctl`."""
    me = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    if me is not None and me.name == "sparkctl" and os.access(me, os.X_OK):
        return [str(me)]
    found = shutil.which("sparkctl")
    if found:
        return [str(Path(found).resolve())]
    return [sys.executable, "-m", "sparkctl"]


def unit_text(argv: list[str], cluster: str, *, scope: Scope, environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    carried = [f"Environment={systemd_quote(f'{k}={env[k]}')}" for k in CARRIED_ENV if env.get(k)]
    lines = [
        "# written by `sparkctl watch --install`; remove with `sparkctl watch --uninstall` (sparkctl's docs/watch.md)",
        "# secrets (the API key's variable) go in the EnvironmentFile below (mode 0600), never in this unit",
        "[Unit]",
        f"Description=sparkctl watch: supervisor of the SGLang cluster {cluster}",
        "Wants=network-online.target docker.service",
        "After=network-online.target docker.service",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(systemd_quote(a) for a in argv),
        "Restart=on-failure",
        "RestartSec=10",
        # SIGTERM: a restart in progress is finished or restored first (the boot timeout bounds it)
        "KillSignal=SIGTERM",
        "TimeoutStopSec=15min",
        "SuccessExitStatus=130 143",
        f"EnvironmentFile={env_file(scope)}",
        *carried,
        "",
        "[Install]",
        f"WantedBy={'multi-user.target' if scope == 'system' else 'default.target'}",
        "",
    ]
    return "\n".join(lines)


def install(text: str, directory: Path, name: str) -> Path:
    """Write the unit through the one writer of user-named paths (`sparkctl.userfiles`: atomic, fsynced, a new file
    0600, a replaced one keeping its mode; a missing unit directory created). It may carry a webhook URL with a
    token: private unless the user opens it."""
    from sparkctl.userfiles import write_user_text
    return write_user_text(directory / name, text, overwrite=True, option="--install", create_parent=True)


def uninstall(directory: Path, name: str) -> Path | None:
    path = directory / name
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OutputPathError(f"cannot remove the unit: {exc.strerror or exc}", where=str(path),
                              hint="run as root for --system") from None
    return path


def next_steps(scope: Scope, name: str, installed: bool) -> list[str]:
    ctl = "systemctl --user" if scope == "user" else "systemctl"
    if installed:
        journal = "journalctl --user" if scope == "user" else "journalctl"
        steps = [f"{ctl} daemon-reload", f"{ctl} enable --now {name}", f"{journal} -u {name} -f"]
        if scope == "user":
            steps.append("loginctl enable-linger $USER   # so it starts at boot, before you log in")
        return steps
    return [f"{ctl} disable --now {name}", f"{ctl} daemon-reload"]
