"""Kept for importers of the old module: the commands live in `deploy/commands.py` (see its docstring)."""
from __future__ import annotations

from sparkctl.deploy.commands import Deployer, UpOptions

__all__ = ["Deployer", "UpOptions"]
