"""SVG charts: decode throughput per class and arm of one card (bars, medians with min-max whiskers), and the
decode ON/OFF history of many cards (lines over time, whiskers, a dashed marker where something changed).

SVG rather than PNG: it needs no plotting library (matplotlib would add ~40 MB for one chart),
renders in any browser and in GitHub's Markdown, and stays diffable text.
"""
from __future__ import annotations

from xml.sax.saxutils import escape as _xml_escape

from sparkctl.jsontypes import JSONObject
from sparkctl.untrusted import clean

__all__ = ["decode_svg", "history_svg"]

def escape(text: str) -> str:
    """A label from a card (class, role, change, time) as SVG text: control characters escaped by the one
    sanitiser (sparkctl.untrusted.clean; XML cannot hold most of them), bounded, then XML-escaped."""
    return _xml_escape(clean(text, 200))


_COLORS = {"ON": "#2b6cb0", "OFF": "#a0aec0", "A": "#2b6cb0", "B": "#a0aec0"}


def decode_svg(result: JSONObject) -> str | None:
    """The chart, or None when no arm measured decode throughput."""
    bars: list[tuple[str, str, JSONObject]] = []     # (class, role, summary)
    for a in result.get("arms") or []:
        for cls, e in ((a["results"].get("decode") or {}).get("classes") or {}).items():
            if e.get("decode_tok_s"):
                bars.append((cls, a["config"]["role"], e["decode_tok_s"]))
    if not bars:
        return None
    bars.sort(key=lambda b: (b[0], b[1] not in ("ON", "A")))
    top = max(b[2]["max"] for b in bars) * 1.15
    w, h, left, bottom, bw, gap = 120 + 70 * len(bars), 260, 60, 40, 46, 24
    plot_h = h - bottom - 30

    def y(v: float) -> float:
        return 30 + plot_h * (1 - v / top)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="16" font-size="12">Decode tok/s, medians (min–max)'
           f'{" — EMULATED" if result.get("emulated") else ""}</text>',
           f'<line x1="{left}" y1="{y(0):.1f}" x2="{w - 10}" y2="{y(0):.1f}" stroke="#333"/>']
    x = left + gap / 2
    prev_cls = None
    for cls, role, s in bars:
        if prev_cls is not None and cls != prev_cls:
            x += gap
        prev_cls = cls
        color = _COLORS.get(role, "#718096")
        out.append(f'<rect x="{x:.1f}" y="{y(s["median"]):.1f}" width="{bw}" height="{y(0) - y(s["median"]):.1f}" '
                   f'fill="{color}"/>')
        cx = x + bw / 2
        out.append(f'<line x1="{cx:.1f}" y1="{y(s["min"]):.1f}" x2="{cx:.1f}" y2="{y(s["max"]):.1f}" stroke="#000"/>')
        out.append(f'<text x="{cx:.1f}" y="{y(s["max"]) - 4:.1f}" text-anchor="middle">{s["median"]:,.1f}</text>')
        out.append(f'<text x="{cx:.1f}" y="{h - 24}" text-anchor="middle">{escape(role)}</text>')
        out.append(f'<text x="{cx:.1f}" y="{h - 10}" text-anchor="middle">{escape(cls)}</text>')
        x += bw + 8
    out.append("</svg>")
    return "\n".join(out) + "\n"


_SERIES = (("on", "code", "#2b6cb0", ""), ("on", "prose", "#63b3ed", ""),
           ("off", "code", "#4a5568", "5,3"), ("off", "prose", "#a0aec0", "5,3"))


def history_svg(rows: list[JSONObject]) -> str:
    """Decode tok/s medians (min-max whiskers) of ON and OFF per class, one x step per card in time order; a
    vertical dashed line before each card whose configuration changed, labelled with the change."""
    n = len(rows)
    pts: dict[tuple[str, str], list[tuple[int, JSONObject]]] = {}
    top = 1.0
    for i, r in enumerate(rows):
        for role, cls, _, _ in _SERIES:
            s = ((r.get(role) or {}).get("decode") or {}).get(cls)
            if s:
                pts.setdefault((role, cls), []).append((i, s))
                top = max(top, float(s["max"]))
    top *= 1.15
    left, right, top_pad, bottom = 60, 150, 30, 70
    w = left + right + max(1, n - 1) * 70 + 40
    h = 320
    plot_h = h - top_pad - bottom

    def x(i: int) -> float:
        return left + 20 + i * 70

    def y(v: float) -> float:
        return top_pad + plot_h * (1 - v / top)

    emulated = any(r.get("emulated") for r in rows)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="16" font-size="12">Decode tok/s over time, medians (min–max)'
           f'{" — EMULATED" if emulated else ""}</text>',
           f'<line x1="{left}" y1="{y(0):.1f}" x2="{w - right}" y2="{y(0):.1f}" stroke="#333"/>',
           f'<line x1="{left}" y1="{y(0):.1f}" x2="{left}" y2="{top_pad}" stroke="#333"/>']
    for frac in (0.25, 0.5, 0.75, 1.0):
        v = top / 1.15 * frac
        out.append(f'<text x="{left - 4}" y="{y(v) + 4:.1f}" text-anchor="end">{v:,.0f}</text>')
    for i, r in enumerate(rows):
        out.append(f'<text x="{x(i):.1f}" y="{h - bottom + 14}" text-anchor="middle">{i + 1}</text>')
        out.append(f'<text x="{x(i):.1f}" y="{h - bottom + 26}" text-anchor="middle" font-size="9">'
                   f'{escape((r.get("started") or "")[5:16])}</text>')
        if r.get("changed") and not r.get("first"):
            xm = x(i) - 35
            out.append(f'<line x1="{xm:.1f}" y1="{top_pad}" x2="{xm:.1f}" y2="{y(0):.1f}" stroke="#dd6b20" '
                       f'stroke-dasharray="3,3"/>')
            label = escape("; ".join(r["changed"])[:60])
            out.append(f'<text x="{xm + 2:.1f}" y="{top_pad + 10}" font-size="9" fill="#dd6b20" '
                       f'transform="rotate(90 {xm + 2:.1f} {top_pad + 10})">{label}</text>')
    legend_y = top_pad + 4
    for role, cls, color, dash in _SERIES:
        series = pts.get((role, cls))
        if not series:
            continue
        d = " ".join(f"{'M' if k == 0 else 'L'}{x(i):.1f},{y(float(s['median'])):.1f}"
                     for k, (i, s) in enumerate(series))
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="2"{dash_attr}/>')
        for i, s in series:
            out.append(f'<line x1="{x(i):.1f}" y1="{y(float(s["min"])):.1f}" x2="{x(i):.1f}" '
                       f'y2="{y(float(s["max"])):.1f}" stroke="{color}"/>')
            out.append(f'<circle cx="{x(i):.1f}" cy="{y(float(s["median"])):.1f}" r="3" fill="{color}"/>')
        out.append(f'<line x1="{w - right + 10}" y1="{legend_y}" x2="{w - right + 30}" y2="{legend_y}" '
                   f'stroke="{color}" stroke-width="2"{dash_attr}/>')
        out.append(f'<text x="{w - right + 34}" y="{legend_y + 4}">{role.upper()} {escape(cls)}</text>')
        legend_y += 16
    out.append(f'<text x="{left}" y="{h - 8}" font-size="9">cards in time order (numbered as in the table); '
               f'dashed orange line: the configuration changed</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
