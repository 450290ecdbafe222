"""`sparkctl bench history [--profile P]`: every indexed card in time order, decode ON/OFF per class, what changed.

One row per card (oldest first): run id, start time, status, the ON and OFF arms' decode medians (tok/s) for each
prompt class with their min-max, and what changed since the previous row of the same listing (flags, image tags
and IDs, patch series, SGLang version; computed on the ON arm, else the first arm). The SVG chart
(``sparkctl.bench.chart.history_svg``) plots the same rows and marks each change.
"""
from __future__ import annotations

from pathlib import Path

from sparkctl import texttable
from sparkctl.bench.chart import history_svg
from sparkctl.jsontypes import JSONObject
from sparkctl.state.cards import CardIndex, changes, describe_change, pick_arm
from sparkctl.statefiles import write_text_atomic
from sparkctl.userfiles import write_user_text

__all__ = ["history", "render_history"]


def _primary(entry: JSONObject) -> JSONObject | None:
    return pick_arm(entry, "ON") or next(iter(entry.get("arms") or []), None)


def history(index: CardIndex, *, profile: str | None = None, chart: Path | None = None,
            user_chart: bool = False, overwrite: bool = False) -> JSONObject:
    """Rows of the history (and the SVG written to ``chart`` when given). ``user_chart``: ``chart`` is a path the
    user named (``--chart``), written as given (`sparkctl.userfiles`: refused when it is a directory, not
    writable, or exists without ``overwrite``); else it is the ledger's own ``history.svg`` (private)."""

    entries = index.query(profile=profile)
    rows: list[JSONObject] = []
    prev: JSONObject | None = None
    for e in entries:
        on, off = pick_arm(e, "ON"), pick_arm(e, "OFF")
        cur = _primary(e)
        ch = changes(prev, cur) if prev is not None and cur is not None else []
        rows.append({"run_id": e["run_id"], "started": e.get("started"), "status": e.get("status"),
                     "emulated": e.get("emulated"), "profiles": e.get("profiles"),
                     "on": {"profile": on.get("profile"), "decode": on.get("decode")} if on else None,
                     "off": {"profile": off.get("profile"), "decode": off.get("decode")} if off else None,
                     "changed": [describe_change(c) for c in ch], "first": prev is None, "path": e.get("path")})
        if cur is not None:
            prev = cur
    out: JSONObject = {"profile": profile, "cards": rows, "skipped": list(index.skipped),
                           "index": str(index.path), "chart": None}
    if chart is not None and rows:
        if user_chart:
            write_user_text(chart, history_svg(rows), overwrite=overwrite, option="--chart")
        else:
            write_text_atomic(chart, history_svg(rows))
        out["chart"] = str(chart)
    return out


def _cell(arm: JSONObject | None, cls: str) -> str:
    s = ((arm or {}).get("decode") or {}).get(cls)
    if not s:
        return "-"
    return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"


def render_history(h: JSONObject) -> str:
    rows = h["cards"]
    if not rows:
        return f"no cards{' for profile ' + h['profile'] if h['profile'] else ''} in {h['index']}\n"
    classes = sorted({c for r in rows for arm in (r["on"], r["off"]) if arm for c in (arm.get("decode") or {})}) \
        or ["code", "prose"]
    head = ["run", "started", "status"] + [f"{role} {c} tok/s" for role in ("ON", "OFF") for c in classes] + ["changed"]
    body = []
    for r in rows:
        changed = "first card" if r["first"] else ("; ".join(r["changed"]) or "nothing recorded")
        body.append([r["run_id"], (r["started"] or "")[:19], str(r["status"]) + (" EMULATED" if r["emulated"] else "")]
                    + [_cell(r[role], c) for role in ("on", "off") for c in classes] + [changed])
    lines = texttable.lines(head, body)
    if h.get("chart"):
        lines.append(f"chart: {h['chart']}")
    for s in h.get("skipped") or []:
        lines.append(f"skipped (unreadable card): {s}")
    return "\n".join(lines) + "\n"
