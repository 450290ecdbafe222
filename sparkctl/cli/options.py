"""Option helpers shared by the CLI modules."""
from __future__ import annotations

from typing import Any

import typer


def flag(*names: str, help: str) -> Any:  # noqa: A002 - typer's own keyword
    """A plain on/off flag (``--yes``), shown in help without a ``<bool>`` value (it takes none)."""
    return typer.Option(False, *names, help=help, metavar="")
