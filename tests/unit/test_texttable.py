"""Plain-text tables come from rich (sparkctl.texttable) and look as the hand-written ones did: each column as wide
as its widest cell, two spaces between columns, lines right-stripped. Wide characters are measured by their cells
on a terminal (rich), not by `len` as `str.ljust` did."""
from __future__ import annotations

import string

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.texttable import lines

CELL = st.text(alphabet=string.ascii_letters + string.digits + string.punctuation + " ", max_size=12)


def _by_hand(head: list[str], rows: list[list[str]]) -> list[str]:
    """What bench history and tune printed before (str.ljust)."""
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5).flatmap(lambda n: st.tuples(
    st.lists(CELL.filter(lambda c: c.strip() == c and c), min_size=n, max_size=n),
    st.lists(st.lists(CELL.map(str.strip), min_size=n, max_size=n), max_size=6))))
def test_an_ascii_table_is_what_ljust_made(table):
    head, rows = table
    assert lines(head, rows) == _by_hand(head, rows)


def test_markup_is_text_and_wide_characters_take_their_cells():
    out = lines(["name", "status"], [["[red]x[/red]", "ok"], ["日本", "ok"]])
    assert out == ["name          status", "[red]x[/red]  ok", "日本          ok"]
