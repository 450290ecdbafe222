"""Where sparkctl finds its files: the user's own first, then what the package ships.

Shipped data lives at the top of the repository (``profiles/``, ``inventory/``, ``images/`` (the Dockerfile
templates), ``patches/``, ``playbooks/``, ``grafana/`` (the dashboard of `sparkctl watch`)): one copy of each
file. The wheel carries them under
``sparkctl/data/<kind>/`` (``setup.py`` maps each directory into the package at build time), and this module is
the one reader of both places, through ``importlib.resources``:

- an installed wheel (``pip``/``pipx``): ``sparkctl/data/<kind>/`` inside the installed package;
- a checkout (an editable install, as ``bin/_bootstrap`` makes, or the tests importing the checkout): the
  directory next to the ``sparkctl`` package, ``<checkout>/<kind>/``, recognised by the checkout's
  ``pyproject.toml`` beside it.

A user's own profiles and inventory are looked up, in this order:

1. the working directory (``./profiles/``, ``./inventory/sparks.yml``);
2. the user's configuration directory, ``$XDG_CONFIG_HOME/sparkctl/`` (default ``~/.config/sparkctl/``);
3. what the package ships (above).

Run from the root of a checkout, ``./profiles/`` *is* the shipped directory: it keeps its place as the shipped
one (after the configuration directory), so a checkout behaves like an installed package.
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from sparkctl import __version__
from sparkctl.errors import SparkctlError

# The shipped directories: each is a top-level directory of the repository and sparkctl/data/<name>/ in the
# wheel. setup.py maps the same names (tests/unit/test_resources.py checks the two lists agree).
SHIPPED_DIRS = ("profiles", "inventory", "images", "patches", "playbooks", "grafana")


def data_root() -> Path:
    """The directory holding the shipped directories: the installed ``sparkctl/data/`` or the checkout's root.

    Returns a real filesystem path: Ansible, ``docker build`` contexts and the patch applier read these files
    directly, and wheels install unzipped. A zipped install is refused with what to do instead."""
    package = resources.files("sparkctl")
    if not isinstance(package, Path):
        raise SparkctlError(f"sparkctl's data is inside an archive ({package}): it needs an unpacked install",
                            hint="install sparkctl with pip or pipx (not as a zipped egg or zipapp)")
    checkout = package.parent
    if (checkout / "pyproject.toml").is_file() and all((checkout / kind).is_dir() for kind in SHIPPED_DIRS):
        return checkout                   # a checkout: the top-level directories themselves
    installed = package / "data"
    missing = [kind for kind in SHIPPED_DIRS if not (installed / kind).is_dir()]
    if missing:
        raise SparkctlError(f"sparkctl's shipped data is incomplete: {', '.join(missing)} not found in {installed} "
                            f"(installed package) nor in {checkout} (checkout)",
                            hint="reinstall sparkctl (pip install --force-reinstall, or pipx reinstall sparkctl); "
                                 "in a checkout, restore the top-level directories with `git checkout -- .`")
    return installed


def shipped(*parts: str) -> Path:
    """A file or directory sparkctl ships (e.g. ``shipped("profiles")``, ``shipped("images", "engine")``)."""
    root = data_root()
    return root.joinpath(*parts) if parts else root


def version() -> str:
    """The installed distribution's version (the checkout's ``sparkctl.__version__`` when not installed)."""
    from importlib import metadata
    try:
        return metadata.version("sparkctl")
    except metadata.PackageNotFoundError:
        return __version__


def config_home() -> Path:
    """The user's sparkctl configuration directory: ``$XDG_CONFIG_HOME/sparkctl`` or ``~/.config/sparkctl``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sparkctl"


def user_dirs() -> list[Path]:
    """Where a user's own files are looked for before the shipped ones: the working directory, then config_home()."""
    return [Path.cwd(), config_home()]


def search_dirs(kind: str) -> list[Path]:
    """Every directory named `kind` (``profiles``, ``inventory``) in lookup order: user_dirs() then the shipped one.

    A user directory that is the shipped one (the working directory is a checkout's root) is left out of the
    user's part: the shipped files keep their place after the configuration directory."""
    own = shipped(kind)
    return [base / kind for base in user_dirs() if os.path.realpath(base / kind) != os.path.realpath(own)] + [own]
