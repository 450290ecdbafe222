"""Range-checked number options: a bad value is a usage error (exit 2) naming the flag, before anything runs.

`--boot-timeout -5` used to stop the healthy deployment and then fail, `0` silently meant the profile's 1800 s
and `nan` never timed out; `logs --tail -3` printed all but the first three lines. Each option that takes a
number declares its range here, as a typer `parser`::

    boot_timeout: Optional[float] = typer.Option(None, "--boot-timeout", parser=bounds.seconds(),
                                                 metavar="SECONDS", help="...")

Values are parsed by the same rules as the config's value policy (sparkctl/config/values.py; its bounds in
limits.py): finite, in range, an integer where a count is meant (`--tail 2.5` is refused, not truncated).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import typer

from sparkctl.config.limits import INT_MAX, SECONDS_MAX


def seconds(low: float = 0.0, high: float = SECONDS_MAX) -> Callable[[str], float]:
    """A duration in seconds: finite, more than `low`, at most `high` (a week by default)."""

    def parse(text: str | float) -> float:
        # typer may hand back a value it already converted (a default, a re-validation): check it the same way
        if isinstance(text, bool):
            raise typer.BadParameter(f"{text!r} is not a number of seconds (e.g. 600)")
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise typer.BadParameter(f"{text!r} is not a number of seconds (e.g. 600)") from None
        if not math.isfinite(value) or not low < value <= high:
            raise typer.BadParameter(f"{text} is not a number of seconds in ({low:g}, {high:g}]: give a finite "
                                     f"duration such as 600")
        return value

    return parse


def count(low: int = 0, high: int = INT_MAX, *, what: str = "a whole number") -> Callable[[str], int]:
    """An integer in [low, high] (no sign tricks, no fractions: `-3` and `2.5` are refused)."""

    def parse(text: str | int) -> int:
        if isinstance(text, bool) or not isinstance(text, (str, int)):
            raise typer.BadParameter(f"{text!r} is not {what} (an integer from {low} to {high})")
        try:
            value = text if isinstance(text, int) else int(text.strip(), 10)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not {what} (an integer from {low} to {high})") from None
        if not low <= value <= high:
            raise typer.BadParameter(f"{value} is out of range: give {what} from {low} to {high}")
        return value

    return parse
