"""Load captured real SGLang output from tests/fixtures/captures/ (byte-identical copies of the project's reference
captures, each naming its source) for the tests' parsers. Each file has 3 header lines (# source/# what/# note) that
are not printed output: the helpers strip them. ``[...]`` lines are cut marks, kept unless asked."""
from __future__ import annotations

from pathlib import Path

CAPTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "captures"
CUT = "[...]"
HEADER_PREFIXES = ("# source:", "# what:", "# note:")


def capture_path(rel: str) -> Path:
    return CAPTURES / rel


def capture_text(rel: str) -> str:
    """The printed part of a capture, exactly as stored (``\\r`` and tabs kept)."""
    raw = capture_path(rel).read_bytes().decode("utf-8")
    lines = raw.split("\n")
    for line, prefix in zip(lines[:3], HEADER_PREFIXES):
        assert line.startswith(prefix), f"{rel}: header line {line[:40]!r} should start with {prefix!r}"
    return "\n".join(lines[3:])


def capture_lines(rel: str, *, drop_cuts: bool = False) -> list[str]:
    """Physical lines after the header (a trailing empty line from the final newline is dropped)."""
    lines = capture_text(rel).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line for line in lines if line != CUT] if drop_cuts else lines


def capture_names(subdir: str) -> list[str]:
    return sorted(f"{subdir}/{p.name}" for p in (CAPTURES / subdir).glob("*.txt"))
