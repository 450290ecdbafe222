"""`sparkctl bench diff A B`: per metric the delta, the noise band and a verdict, and what changed between the cards.

The noise band of one metric (every figure a card keeps with its samples: decode tok/s per class, TTFT per size,
/generate accept length, concurrency aggregates) is computed from the two cards' own spreads::

    half_range(X) = (max(X) - min(X)) / 2                      (over the card's n runs)
    band          = max(half_range(A) + half_range(B), FLOOR * median(A))

so a difference is "beyond noise" only when it is larger than the two min-max ranges put together would allow if
they were centred on their medians (roughly: the ranges do not overlap). ``FLOOR`` (1% of A's median) keeps two
cards with suspiciously tight or single-sample figures (n=1: no spread of their own, e.g. concurrency aggregates)
from calling a 0.3% change real. Verdict: ``better`` / ``worse`` when ``|delta| > band`` in the metric's good
direction (tok/s and accept length up, TTFT down), else ``within noise``. ``band_basis`` says which term set it.
The same rule decides a tune's confirmation (sparkctl.bench.diff.compare_summaries).
"""
from __future__ import annotations

from sparkctl.jsontypes import JSONObject
from sparkctl.state.cards import CardIndex, changes, describe_change, pick_arm

__all__ = ["FLOOR", "compare_summaries", "diff_entries", "diff_cards", "render_diff"]

FLOOR = 0.01


def _lower_is_better(metric: str) -> bool:
    return metric.startswith("ttft.")


def _half_range(s: JSONObject) -> float:
    return (float(s["max"]) - float(s["min"])) / 2.0


def compare_summaries(a: JSONObject, b: JSONObject, *, lower_is_better: bool = False,
                      floor: float = FLOOR) -> JSONObject:
    """Delta of B against A (medians), the noise band from both spreads, and the verdict."""
    ma, mb = float(a["median"]), float(b["median"])
    delta = mb - ma
    spread_band = _half_range(a) + _half_range(b)
    floor_band = floor * abs(ma)
    band = max(spread_band, floor_band)
    basis = ("half-ranges of both cards" if spread_band >= floor_band else f"{floor:.0%} floor of A's median") + \
        ("" if min(int(a.get("n") or 1), int(b.get("n") or 1)) > 1 else " (a side has n=1: no spread of its own)")
    good = -delta if lower_is_better else delta
    verdict = "better" if good > band else "worse" if -good > band else "within noise"
    return {"a": round(ma, 4), "b": round(mb, 4), "delta": round(delta, 4),
            "delta_pct": round(100 * delta / ma, 2) if ma else None, "band": round(band, 4),
            "band_pct": round(100 * band / abs(ma), 2) if ma else None, "band_basis": basis,
            "n": [a.get("n"), b.get("n")], "range_a": [a["min"], a["max"]], "range_b": [b["min"], b["max"]],
            "verdict": verdict, "direction": "lower is better" if lower_is_better else "higher is better"}


def _pairs(a: JSONObject, b: JSONObject) -> list[tuple[str, JSONObject, JSONObject]]:
    """Matching arms of two cards: ON with ON and OFF with OFF when both have them, else A's arms with B's in order."""
    roles = [r for r in ("ON", "OFF") if pick_arm(a, r) and pick_arm(b, r)]
    if roles:
        return [(r, pick_arm(a, r), pick_arm(b, r)) for r in roles]   # type: ignore[misc]
    return [(f"{x.get('role')}/{y.get('role')}", x, y) for x, y in zip(a.get("arms") or [], b.get("arms") or [])]


def diff_entries(a: JSONObject, b: JSONObject) -> JSONObject:
    """The diff of two card index entries (sparkctl.state.cards.card_entry)."""
    arms = []
    for role, x, y in _pairs(a, b):
        mx, my = x.get("metrics") or {}, y.get("metrics") or {}
        metrics = {m: compare_summaries(mx[m], my[m], lower_is_better=_lower_is_better(m))
                   for m in sorted(set(mx) & set(my))}
        only = {"a": sorted(set(mx) - set(my)), "b": sorted(set(my) - set(mx))}
        ch = changes(x, y)
        arms.append({"role": role, "a_profile": x.get("profile"), "b_profile": y.get("profile"),
                     "metrics": metrics, "only_in": only, "changed": ch,
                     "changed_text": [describe_change(c) for c in ch]})
    ratio = {}
    decode_a = (a.get("comparison") or {}).get("decode") or {}
    decode_b = (b.get("comparison") or {}).get("decode") or {}
    for cls in sorted(set(decode_a) & set(decode_b)):
        ra, rb = a["comparison"]["decode"][cls].get("ratio"), b["comparison"]["decode"][cls].get("ratio")
        ratio[cls] = {"a": ra, "b": rb, "delta": None if ra is None or rb is None else round(rb - ra, 3)}
    return {"a": {k: a.get(k) for k in ("run_id", "started", "status", "emulated", "path", "profiles")},
            "b": {k: b.get(k) for k in ("run_id", "started", "status", "emulated", "path", "profiles")},
            "noise_band": "band = max(half_range(A) + half_range(B), 1% of A's median); half_range = (max-min)/2 "
                          "of a card's runs; better/worse only beyond the band",
            "arms": arms, "ratio": ratio,
            "emulated": bool(a.get("emulated") or b.get("emulated"))}


def diff_cards(index: CardIndex, ref_a: str, ref_b: str) -> JSONObject:
    return diff_entries(index.resolve(ref_a), index.resolve(ref_b))


def render_diff(d: JSONObject) -> str:
    lines = [f"A {d['a']['run_id']} ({d['a']['started']})", f"B {d['b']['run_id']} ({d['b']['started']})"]
    if d["emulated"]:
        lines.append("EMULATED: figures from sparkctl's SGLang emulator, not a Spark")
    lines.append(f"noise band: {d['noise_band']}")
    for arm in d["arms"]:
        lines += ["", f"[{arm['role']}] {arm['a_profile']} -> {arm['b_profile']}",
                  f"  {'metric':<16} {'A':>10} {'B':>10} {'delta':>10} {'band':>9}  verdict"]
        for name, m in arm["metrics"].items():
            pct = "" if m["delta_pct"] is None else f" ({m['delta_pct']:+.1f}%)"
            lines.append(f"  {name:<16} {m['a']:>10.3f} {m['b']:>10.3f} {m['delta']:>+10.3f} {m['band']:>9.3f}  "
                         f"{m['verdict']}{pct}")
        for side in ("a", "b"):
            if arm["only_in"][side]:
                lines.append(f"  only in {side.upper()}: {', '.join(arm['only_in'][side])}")
        lines.append("  changed: " + ("; ".join(arm["changed_text"]) if arm["changed_text"] else "nothing recorded"))
    for cls, r in d["ratio"].items():
        lines.append(f"ON/OFF ratio {cls}: {r['a']} -> {r['b']}")
    return "\n".join(lines) + "\n"
