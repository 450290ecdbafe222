"""Plain-text tables (a pipe, a file, a terminal without colour) through rich's `Table`: columns sized to their
widest cell, two spaces between them, no borders, no wrapping, lines right-stripped. rich's own rendering is
used where colour belongs (`sparkctl.tune.table.render` on a terminal); this is the same table without it.

Example::

    lines(["run", "status"], [["bench-1", "ok"], ["bench-2", "failed"]])
    # ['run      status', 'bench-1  ok', 'bench-2  failed']
"""
from __future__ import annotations

import io
from collections.abc import Sequence


def lines(head: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """The table as lines: `head` then one line per row, cells as ``str(cell)``, left-aligned."""
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 0, 0, 2), header_style="",
                  show_header=True)
    for h in head:
        table.add_column(h, no_wrap=True, overflow="ignore")
    for row in rows:
        table.add_row(*(str(c) for c in row))
    columns = list(zip(*([str(h) for h in head], *([str(c) for c in r] for r in rows)), strict=False))
    width = sum(max(len(c) for c in col) + 2 for col in columns)      # wide enough that nothing is cut
    out = io.StringIO()
    Console(file=out, width=max(width, 80), color_system=None, highlight=False, markup=False, emoji=False,
            soft_wrap=False, legacy_windows=False).print(table)
    return [ln.rstrip() for ln in out.getvalue().splitlines()]
