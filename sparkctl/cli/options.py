"""Option helpers shared by the CLI modules."""
from __future__ import annotations

from typing import Any

import typer
from typer._click.core import Context, Parameter  # typer >= 0.26 carries its own click
from typer.core import TyperCommand, TyperGroup, TyperOption

EXIT_CODES = ("Exit codes: 0 ok, 1 cancelled at the prompt, 2 bad profile/inventory/flag or a request that cannot "
              "be done as given, 3 preflight failed, 4 deploy or image step failed, 5 cluster locked, 6 ledger "
              "corrupt or state directory not writable, 7 node command failed, 8 status not ok, 70 internal error "
              "(traceback in the state directory's debug.log), 128+N killed by signal N.")


def flag(*names: str, help: str) -> Any:  # noqa: A002 - typer's own keyword
    """A plain on/off flag (``--yes``), shown in help without a ``<bool>`` value (it takes none). ``Any`` as
    ``typer.Option`` itself returns: the OptionInfo stands as the default of a ``bool`` parameter."""
    return typer.Option(False, *names, help=help, metavar="")


def _plain_help(opt: TyperOption | None) -> TyperOption | None:
    if opt is not None and opt.metavar is None:
        opt.metavar = ""          # typer shows `--help <bool>` otherwise
    return opt


class PlainFlagsCommand(TyperCommand):
    """A command whose --help, like every flag, is shown without a value."""

    def get_help_option(self, ctx: Context) -> TyperOption | None:
        return _plain_help(super().get_help_option(ctx))


class PlainFlagsGroup(TyperGroup):
    def get_help_option(self, ctx: Context) -> TyperOption | None:
        return _plain_help(super().get_help_option(ctx))

    def get_params(self, ctx: Context) -> list[Parameter]:
        """Typer's own root flags (--install-completion, --show-completion) shown without ``<bool>`` too."""
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


def plain_flags(app: typer.Typer) -> None:
    """Every registered command shows its flags (and --help) without ``<bool>``."""
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = PlainFlagsCommand
        if not info.epilog:
            info.epilog = EXIT_CODES           # every command's --help says what its exit status means
    for group in app.registered_groups:          # sub-apps (`image ...`, `patches ...`) too
        if group.typer_instance is not None:
            plain_flags(group.typer_instance)
