"""Where sparkctl finds its files: the user's own first, then what the package ships.

Shipped data (``sparkctl/data/``: profiles, the embedded inventory, Dockerfile templates, GB10 patch series,
Ansible playbooks) is package data read through ``importlib.resources``, so an installed wheel (``pip`` or
``pipx``) works with no source tree. A user's own profiles and inventory are looked up, in this order:

1. the working directory (``./profiles/``, ``./inventory/sparks.yml``);
2. the user's configuration directory, ``$XDG_CONFIG_HOME/sparkctl/`` (default ``~/.config/sparkctl/``);
3. what the package ships (``sparkctl/data/``).
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from sparkctl.errors import SparkctlError


def shipped(*parts: str) -> Path:
    """A file or directory the package ships under ``sparkctl/data/`` (e.g. ``shipped("profiles")``).

    Returns a real filesystem path: Ansible, ``docker build`` contexts and the patch applier read these files
    directly, and wheels install unzipped. A zipped install is refused with what to do instead."""
    root = resources.files("sparkctl") / "data"
    found = root.joinpath(*parts) if parts else root
    if not isinstance(found, Path):
        raise SparkctlError(f"sparkctl's data is inside an archive ({found}): it needs an unpacked install",
                            hint="install sparkctl with pip or pipx (not as a zipped egg or zipapp)")
    return found


def version() -> str:
    """The installed distribution's version (the checkout's ``sparkctl.__version__`` when not installed)."""
    from importlib import metadata
    try:
        return metadata.version("sparkctl")
    except metadata.PackageNotFoundError:
        from sparkctl import __version__
        return __version__


def config_home() -> Path:
    """The user's sparkctl configuration directory: ``$XDG_CONFIG_HOME/sparkctl`` or ``~/.config/sparkctl``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sparkctl"


def user_dirs() -> list[Path]:
    """Where a user's own files are looked for before the shipped ones: the working directory, then config_home()."""
    return [Path.cwd(), config_home()]


def search_dirs(kind: str) -> list[Path]:
    """Every directory named `kind` (``profiles``, ``inventory``) in lookup order: user_dirs() then the shipped one."""
    return [base / kind for base in user_dirs()] + [shipped(kind)]
