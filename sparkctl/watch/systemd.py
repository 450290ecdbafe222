"""The systemd unit `sparkctl watch --install [--user|--system]` writes, and `--uninstall` removes.

The unit is what the user ran: every input the installing `sparkctl watch` resolved (`resolved_inputs`) is written
into it, made absolute, so that the service watches the same cluster and deployment whatever environment and
directory systemd starts it in:

* ExecStart: this sparkctl's executable, `watch`, ``--inventory`` with the inventory's absolute path (found by
  ``--inventory``, ``SPARKCTL_INVENTORY``, ``./inventory/sparks.yml``, ``~/.config/sparkctl/...`` or the embedded
  cluster: whichever lookup found it), and the options given;
* Environment=: ``SPARKCTL_STATE_DIR`` (the state directory from its variable or the XDG default),
  ``XDG_CONFIG_HOME`` and ``XDG_STATE_HOME`` (absolute), ``SPARKCTL_PROFILES_DIR`` when set;
* WorkingDirectory=: the installer's working directory (``./profiles`` and ``./inventory`` are looked up there);
* EnvironmentFile=: the optional secrets file (``$XDG_CONFIG_HOME/sparkctl/watch.env`` or
  ``/etc/sparkctl/watch.env``, 0600) where the API key's variable and a ``--notify-env`` variable go. Secrets never
  go into the unit itself, nor into its ExecStart.

Each kind of line is escaped as systemd.syntax(7) / systemd.service(5) / systemd.exec(5) say for it (checked
against systemd's load-fragment.c and systemd-analyze verify): an ExecStart argument is double-quoted with C escapes
for ``\\`` and ``"``, ``%`` doubled (specifiers) and ``$`` doubled (variable expansion); the program, its first
word, is quoted with ``%`` doubled but ``$`` literal (never expanded there), a quote or backslash in it refused
(systemd refuses them in an executable's name); an Environment= assignment is quoted the same way but
keeps ``$`` (no expansion there); a WorkingDirectory= / EnvironmentFile= path is raw (no quoting), ``%`` doubled.
What a unit file cannot carry is refused with the value's name (`UnitValueError`): a newline or another control
character, text that is not UTF-8, a path that is not absolute, or a raw value ending in a space or a backslash
(the unit parser strips the one and continues the line after the other). Example::

    text = unit_text(resolved_inputs(["/usr/local/bin/sparkctl", "watch"], inventory_path), "local", scope="user")
"""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sparkctl.errors import ConfigError, OutputPathError
from sparkctl.resources import config_home
from sparkctl.statefiles import default_state_root
from sparkctl.userfiles import write_user_text

Scope = Literal["user", "system"]


class UnitValueError(ConfigError):
    """A value the systemd unit cannot carry as given (exit 2)."""


def unit_name(cluster: str) -> str:
    return f"sparkctl-watch-{cluster}.service"


def unit_dir(scope: Scope) -> Path:
    if scope == "system":
        return Path("/etc/systemd/system")
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def secrets_file(scope: Scope) -> Path:
    """The unit's optional EnvironmentFile: the API key's variable, a --notify-env variable (0600, the user's)."""
    if scope == "system":
        return Path("/etc/sparkctl/watch.env")
    return Path(os.path.abspath(config_home())) / "watch.env"


def _representable(value: str, what: str) -> None:
    bad = next((c for c in value if ord(c) < 0x20 or ord(c) == 0x7f or 0xd800 <= ord(c) <= 0xdfff), None)
    if bad is not None:
        kind = "a newline" if bad in "\r\n" else ("text that is not UTF-8" if ord(bad) >= 0xd800
                                                  else f"the control character {bad!r}")
        raise UnitValueError(f"{what} {value!r} holds {kind}: a systemd unit cannot carry it", where="--install",
                             hint="use a path or value without control characters (rename the directory, or point "
                                  "the option or variable elsewhere)")


def _quoted(value: str, what: str, *, dollar: bool) -> str:
    _representable(value, what)
    out = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return '"' + (out.replace("$", "$$") if dollar else out) + '"'


def exec_word(arg: str) -> str:
    """One ExecStart argument (systemd.service(5), "Command lines"): double-quoted, ``\\`` and ``"`` escaped,
    ``%`` -> ``%%`` (specifiers), ``$`` -> ``$$`` (variable expansion); a quoted lone ``;`` is an argument."""
    return _quoted(arg, "an ExecStart argument", dollar=True)


systemd_quote = exec_word            # the name older callers use


def exec_program(path: str) -> str:
    """ExecStart's first word, the program: absolute, double-quoted, ``%`` doubled; ``$`` is literal there (it is
    never expanded, so never doubled), and a quote or a backslash in it is refused, as systemd refuses it
    ("Executable name contains special characters", checked with systemd-analyze verify)."""
    _representable(path, "the program")
    if not os.path.isabs(path):
        raise UnitValueError(f"the unit's program {path!r} is not an absolute path", where="--install")
    if any(c in path for c in "\\\"'"):
        raise UnitValueError(f"the program's path {path!r} holds a quote or a backslash, which systemd refuses in "
                             "an executable's name", where="--install",
                             hint="install sparkctl under a path without quotes or backslashes")
    return '"' + path.replace("%", "%%") + '"'


def env_assignment(name: str, value: str) -> str:
    """One Environment= word (systemd.exec(5)): ``"NAME=value"`` with C escapes and ``%%``; ``$`` stays literal
    (Environment= does not expand variables)."""
    if not name.replace("_", "a").isalnum() or name[0].isdigit():
        raise UnitValueError(f"{name!r} is not a variable name", where="--install")
    return _quoted(f"{name}={value}", f"the variable {name}", dollar=False)


def path_value(path: str, what: str) -> str:
    """A raw path setting (WorkingDirectory=, EnvironmentFile=): absolute, ``%`` doubled, nothing else escaped."""
    _representable(path, what)
    if not os.path.isabs(path):
        raise UnitValueError(f"{what} {path!r} is not an absolute path", where="--install")
    if path != path.rstrip() or path.endswith("\\"):
        raise UnitValueError(f"{what} {path!r} ends in a space or a backslash, which a unit line cannot end with",
                             where="--install", hint="rename it, or run the installer from another directory")
    return path.replace("%", "%%")


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


@dataclass
class UnitInputs:
    """What the installing `sparkctl watch` resolved: the unit runs exactly this."""
    argv: list[str]
    environment: dict[str, str] = field(default_factory=dict)
    working_directory: str = "/"


def resolved_inputs(argv: list[str], environ: dict[str, str] | None = None, cwd: str | None = None) -> UnitInputs:
    """The environment that chooses what the watcher sees, as this process resolved it (absolute): the state
    directory, the XDG roots, the profiles directory; and the working directory. `argv` already carries the
    inventory's absolute path."""

    env = os.environ if environ is None else environ
    xdg_state = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    out = {"SPARKCTL_STATE_DIR": os.path.abspath(default_state_root()),
           "XDG_CONFIG_HOME": os.path.abspath(config_home().parent),
           "XDG_STATE_HOME": os.path.abspath(xdg_state)}
    if env.get("SPARKCTL_PROFILES_DIR"):
        out["SPARKCTL_PROFILES_DIR"] = os.path.abspath(env["SPARKCTL_PROFILES_DIR"])
    return UnitInputs(argv=list(argv), environment=out, working_directory=os.path.abspath(cwd or os.getcwd()))


def unit_text(inputs: UnitInputs, cluster: str, *, scope: Scope) -> str:
    """The unit's text; UnitValueError for any input a unit cannot carry (nothing is written then)."""
    if not inputs.argv:
        raise UnitValueError("the unit has no program to run", where="--install")
    _representable(cluster, "the cluster name")
    lines = [
        "# written by `sparkctl watch --install`; remove with `sparkctl watch --uninstall` (sparkctl's docs/watch.md)",
        "# secrets (the API key's variable, a --notify-env URL) go in the EnvironmentFile below (mode 0600), never "
        "in this unit",
        "[Unit]",
        f"Description=sparkctl watch: supervisor of the SGLang cluster {cluster.replace('%', '%%')}",
        "Wants=network-online.target docker.service",
        "After=network-online.target docker.service",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join([exec_program(inputs.argv[0]), *(exec_word(a) for a in inputs.argv[1:])]),
        f"WorkingDirectory={path_value(inputs.working_directory, 'the working directory')}",
        *(f"Environment={env_assignment(k, v)}" for k, v in sorted(inputs.environment.items())),
        f"EnvironmentFile=-{path_value(str(secrets_file(scope)), 'the secrets file')}",
        "Restart=on-failure",
        "RestartSec=10",
        # SIGTERM: a restart in progress is finished or restored first (the boot timeout bounds it)
        "KillSignal=SIGTERM",
        "TimeoutStopSec=15min",
        "SuccessExitStatus=130 143",
        "",
        "[Install]",
        f"WantedBy={'multi-user.target' if scope == 'system' else 'default.target'}",
        "",
    ]
    return "\n".join(lines)


def install(text: str, directory: Path, name: str, *, force: bool = False) -> Path:
    """Write the unit through the one writer of user files (`sparkctl.userfiles`: atomic, fsynced, a new file 0600,
    a replaced one keeping its mode, no link followed; a missing unit directory created). An existing unit is
    replaced only with `force` (``--install --force``)."""
    return write_user_text(directory / name, text, overwrite=force, option="--install", create_parent=True)


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
