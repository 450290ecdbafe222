"""Commands that change the cluster: up, rollback, down, and their read-only companions."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    return None
