"""Facts about the environment the tests run in (importable from any test directory)."""
from __future__ import annotations

import os


def in_ci() -> bool:
    """True under CI=true, where a missing prerequisite must fail instead of skipping."""
    return os.environ.get("CI", "").lower() == "true"
