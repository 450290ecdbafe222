"""Small statistics the card prints: median with (min-max), spread, the noisy flag, ratios.

Kept apart and pure so the numbers a card shows are computed in exactly one place.
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sparkctl.jsontypes import JSONObject

__all__ = ["Summary", "summarize", "ratio", "NOISY_SPREAD"]

NOISY_SPREAD = 0.02   # (max - min) / median above this: the machine was noisy, say so


@dataclass(frozen=True)
class Summary:
    """n samples: median, min, max; spread = (max - min) / median."""

    n: int
    median: float
    min: float
    max: float
    samples: tuple[float, ...]

    @property
    def spread(self) -> float:
        return (self.max - self.min) / self.median if self.median else 0.0

    @property
    def noisy(self) -> bool:
        return self.n > 1 and self.spread > NOISY_SPREAD

    def as_dict(self, digits: int = 3) -> JSONObject:
        return {"n": self.n, "median": round(self.median, digits), "min": round(self.min, digits),
                "max": round(self.max, digits), "spread": round(self.spread, 4),
                "spread_pct": round(self.spread * 100, 1), "noisy": self.noisy,
                "samples": [round(s, digits) for s in self.samples]}


def summarize(samples: Sequence[float | None]) -> Summary | None:
    """Summary of the non-None samples; None when there are none."""
    xs = [float(s) for s in samples if s is not None]
    if not xs:
        return None
    return Summary(len(xs), statistics.median(xs), min(xs), max(xs), tuple(xs))


def ratio(on: float | None, off: float | None) -> float | None:
    """median_on / median_off, None when either is missing or off is zero."""
    if on is None or off is None or off == 0:
        return None
    return on / off
