"""A small SVG bar chart of decode throughput per class and arm (medians, with min-max whiskers).

SVG rather than PNG: it needs no plotting library (matplotlib would add ~40 MB for one chart),
renders in any browser and in GitHub's Markdown, and stays diffable text.
"""
from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape

__all__ = ["decode_svg"]

_COLORS = {"ON": "#2b6cb0", "OFF": "#a0aec0", "A": "#2b6cb0", "B": "#a0aec0"}


def decode_svg(result: dict[str, Any]) -> str | None:
    """The chart, or None when no arm measured decode throughput."""
    bars: list[tuple[str, str, dict[str, Any]]] = []     # (class, role, summary)
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
    y = (lambda v: 30 + plot_h * (1 - v / top))
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
