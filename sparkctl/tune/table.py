"""The table of a tune's trials (plain text; `sparkctl tune --json` prints the journal itself)."""
from __future__ import annotations

from typing import Any


def trial_table(data: dict[str, Any]) -> str:
    """The table of all trials, plain text (the CLI prints it; --json gives `data`)."""
    obj = data["options"]["objective"]
    rows = [["#", "changes", "status", f"{obj} median (min-max)", "accept len", "time s", "card / reason"]]
    for t in data["trials"]:
        ch = "baseline" if t["baseline"] else ", ".join(f"{k}={v}" for k, v in t["changes"].items())
        o = t.get("objective")
        rows.append([str(t["index"]), ch, t["status"], f"{o['median']:.2f} ({o['min']:.2f}-{o['max']:.2f})" if o else "-",
                     f"{t['accept_len']:.2f}" if t.get("accept_len") else "-",
                     f"{t['elapsed_s']:.1f}" if t.get("elapsed_s") is not None else "-",
                     t.get("card") or t.get("reason") or "-"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    w = data.get("winner") or {}
    lines.append("")
    lines.append(f"winner: {w.get('profile')} ({w.get('path')})" if w.get("promoted") else
                 f"nothing promoted: {w.get('why')}")
    e, tm = data.get("estimate") or {}, data.get("timing") or {}
    if e:
        lines.append(f"estimate after the first trial: {e.get('total_s')} s; actual total {tm.get('total_s')} s "
                     f"(trials {tm.get('trials_sum_s')} s, restore {tm.get('restore_s')} s)")
    r = data.get("restore") or {}
    lines.append(f"restored: {r.get('profile') or r.get('action')} ({'ok' if r.get('ok') else 'FAILED'})")
    return "\n".join(lines) + "\n"
