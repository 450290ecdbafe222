"""Option helpers shared by the CLI modules."""
from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup


def flag(*names: str, help: str) -> Any:  # noqa: A002 - typer's own keyword
    """A plain on/off flag (``--yes``), shown in help without a ``<bool>`` value (it takes none)."""
    return typer.Option(False, *names, help=help, metavar="")


def _plain_help(opt: Any) -> Any:
    if opt is not None and opt.metavar is None:
        opt.metavar = ""          # typer shows `--help <bool>` otherwise
    return opt


class PlainFlagsCommand(TyperCommand):
    """A command whose --help, like every flag, is shown without a value."""

    def get_help_option(self, ctx: Any) -> Any:
        return _plain_help(super().get_help_option(ctx))


class PlainFlagsGroup(TyperGroup):
    def get_help_option(self, ctx: Any) -> Any:
        return _plain_help(super().get_help_option(ctx))


def plain_flags(app: typer.Typer) -> None:
    """Every registered command shows its flags (and --help) without ``<bool>``."""
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = PlainFlagsCommand
    for group in app.registered_groups:          # sub-apps (`image ...`, `patches ...`) too
        if group.typer_instance is not None:
            plain_flags(group.typer_instance)
