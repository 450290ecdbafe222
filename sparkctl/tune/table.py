"""The table of a tune's trials: rich on a terminal, plain text otherwise (`sparkctl tune --json` prints the
journal itself). Infeasible trials show their reason (and the first line of the error behind it)."""
from __future__ import annotations

from typing import IO

from sparkctl import texttable
from sparkctl.state.tunejournal import TuneJournal, TuneTrial
from sparkctl.untrusted import clean, raw_stream

HEADER = ("#", "changes", "status", "{obj} median (min-max)", "accept len", "G6", "time s", "card / reason")


def _reason(t: TuneTrial) -> str:
    if t.status in ("infeasible", "skipped"):
        err = (t.error or "").strip().splitlines()
        return f"{t.reason}: {err[0][:120]}" if err else str(t.reason)
    return t.card or "-"


def rows(data: TuneJournal) -> list[list[str]]:
    """One row of cells per trial (the same cells in both renderings)."""
    out = []
    for t in data.trials:
        ch = "baseline" if t.baseline else ", ".join(f"{k}={v}" for k, v in t.changes.items())
        o = t.objective
        g = t.g6
        g6 = "-" if g is None else g.verdict + (f" {g.identical}/{g.n}" if g.identical is not None and g.n else "")
        out.append([str(t.index), ch, t.status,
                    f"{o.median:.2f} ({o.min:.2f}-{o.max:.2f})" if o else "-",
                    f"{t.accept_len:.2f}" if t.accept_len else "-", g6,
                    f"{t.elapsed_s:.1f}" if t.elapsed_s is not None else "-", _reason(t)])
    return out


def footer(data: TuneJournal) -> list[str]:
    w = data.winner
    lines = [f"winner: {w.profile} ({w.path})" if w and w.promoted else f"nothing promoted: {w.why if w else None}"]
    e, tm = data.estimate, data.timing
    if e:
        lines.append(f"estimate after the first trial: {e.total_s} s; actual total {tm.total_s} s "
                     f"(trials {tm.trials_sum_s} s, restore {tm.restore_s} s)")
    r = data.restore
    what = r and (r.profile or r.action)
    if r and r.ok:                  # read back from the cluster after it (deploy.door.read_back)
        lines.append(f"restored: {what} (ok)" + (f", serving {r.serving}" if r.serving else ""))
    else:
        lines.append(f"restored: {what} (FAILED: {clean(str(r and r.error or 'no restore recorded'), 400)})")
    return lines


def _header(data: TuneJournal) -> list[str]:
    return [h.format(obj=data.options.objective) for h in HEADER]


def trial_table(data: TuneJournal) -> str:
    """The table of all trials, plain text (for a pipe or a file)."""
    return "\n".join(texttable.lines(_header(data), rows(data)) + [""] + footer(data)) + "\n"


_STYLE = {"feasible": "green", "infeasible": "red", "skipped": "yellow", "pending": "dim"}


def render(data: TuneJournal, stream: IO[str], *, terminal: bool | None = None, width: int | None = None) -> None:
    """Write the table to `stream`: a rich table when it is a terminal (or ``terminal=True``), else plain text.
    ``width``: the terminal's columns (None: rich asks the terminal)."""
    if terminal is None:
        isatty = getattr(stream, "isatty", None)
        terminal = bool(isatty and isatty())
    if not terminal:
        stream.write(trial_table(data))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text


    # rich writes its own escape sequences, so past the terminal guard: every cell from the journal is cleaned.
    w = data.winner
    table = Table(title=Text(clean(f"tune {data.run_id} ({data.profile})")), title_justify="left")
    for h in _header(data):
        table.add_column(clean(h), overflow="fold", justify="right" if h in ("#", "time s") else "left")
    for t, cells in zip(data.trials, rows(data)):
        style = _STYLE.get(t.status, "")
        if w and w.promoted and t.index == w.candidate:
            style = "bold green"
        table.add_row(*[Text(clean(c), style=style) if k in (2, 7) else Text(clean(c)) for k, c in enumerate(cells)])
    console = Console(file=raw_stream(stream), force_terminal=True, highlight=False, soft_wrap=False, width=width)
    console.print(table)
    for line in footer(data):
        console.print(Text(clean(line)))
