"""The optional extras of pyproject.toml and the one path that says which is missing, with the command that
installs it.

Every import of an extra's package in sparkctl/ sits inside ``with needed("<extra>", "<what needs it>"):``
(tests/unit/test_extras.py reads the source and holds every import to that), so a `pip install sparkctl` without
the extra gets a `MissingExtraError` (exit 2) naming the extra and the install command, never a
ModuleNotFoundError reported as an internal error. The CLI's boundary maps a ModuleNotFoundError of an extra's
module the same way (`missing_extra`), for an import outside sparkctl's own code (a plugin of a library).
"""
from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from sparkctl.errors import MissingExtraError

# extra -> its requirements, exactly as pyproject.toml's [project.optional-dependencies] lists them (a test compares)
EXTRAS: dict[str, tuple[str, ...]] = {
    "nodes": ("fabric>=3.2", "paramiko>=3.4"),
    "prepare": ("ansible-core>=2.15,<2.18", "ansible-runner>=2.3"),
    "router": ("sglang-router==0.3.2",),
    "watch": ("prometheus_client>=0.17",),
}
# top-level import name -> the extra whose requirement brings it
MODULES: dict[str, str] = {
    "fabric": "nodes", "paramiko": "nodes",
    "ansible": "prepare", "ansible_runner": "prepare",
    "sglang_router": "router",
    "prometheus_client": "watch",
}


def install_hint(extra: str) -> str:
    """The commands that install `extra` into the environment sparkctl runs from (pip, or pipx's inject)."""
    reqs = " ".join(f"'{r}'" for r in EXTRAS[extra])
    return (f"pip install 'sparkctl[{extra}]' (into {sys.prefix}, the environment sparkctl runs from); "
            f"installed with pipx: pipx inject sparkctl {reqs}")


def missing_error(extra: str, what: str, missing: str) -> MissingExtraError:
    """`what` cannot run: `extra` is not installed (`missing` says what was looked for and not found)."""
    packages = ", ".join(re.split(r"[<>=!~]", r)[0] for r in EXTRAS[extra])
    return MissingExtraError(f"{what} needs the optional `{extra}` extra ({packages}), which is not installed "
                             f"here ({missing})", extra=extra, hint=install_hint(extra))


def broken_error(extra: str, what: str, missing: str) -> MissingExtraError:
    """`extra`'s packages are there but one they import is not (`missing`): a damaged install, which a plain
    `pip install` leaves as it is (already satisfied)."""
    return MissingExtraError(f"{what} needs the optional `{extra}` extra, which is incomplete here: its packages "
                             f"import {missing!r}, which is not installed", extra=extra,
                             hint=f"pip install --force-reinstall 'sparkctl[{extra}]' (into {sys.prefix}, the "
                                  f"environment sparkctl runs from)")


@contextmanager
def needed(extra: str, what: str) -> Iterator[None]:
    """Imports of `extra`'s packages for `what` (e.g. "SSH to the nodes"): a ModuleNotFoundError inside (the
    package itself or one it needs) becomes a MissingExtraError naming the extra and how to install it."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}")
    try:
        yield
    except ModuleNotFoundError as exc:
        name = exc.name or str(exc)
        if MODULES.get(name.split(".")[0]) == extra:
            raise missing_error(extra, what, f"no module named {name!r}") from None
        raise broken_error(extra, what, name) from None


def require(extra: str, what: str) -> None:
    """`extra`'s packages are importable (looked up, not imported: for what runs them in a child process, e.g.
    ``python -m sglang_router``); else a MissingExtraError."""
    for module, of in MODULES.items():
        if of == extra and importlib.util.find_spec(module) is None:
            raise missing_error(extra, what, f"no module named {module!r}")


def missing_extra(exc: ModuleNotFoundError, what: str) -> MissingExtraError | None:
    """The MissingExtraError for a ModuleNotFoundError of an extra's module, else None (a bug: not ours to name)."""
    top = (exc.name or "").split(".")[0]
    extra = MODULES.get(top)
    return missing_error(extra, what, f"no module named {exc.name!r}") if extra else None
