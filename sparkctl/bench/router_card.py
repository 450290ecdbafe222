"""The card's "through the router" section, and the single pair's figures it sets beside the router's.

The single pair's figures are measured data only: the latest card in this cluster's bench history (``CardIndex``)
of a single-group deployment (mode ``deployment``, no router section) of the same model with concurrency figures.
Without one the card says none was measured; a number is never made up.
"""
from __future__ import annotations

from sparkctl.jsontypes import JSONObject
from sparkctl.state.cards import CardIndex
from sparkctl.state.ledger import Ledger
from sparkctl.state.runs import SinglePairCard

__all__ = ["single_pair", "render_router"]


def _same_model(arm: JSONObject, model: str | None, served: str | None) -> bool:
    if model and arm.get("model"):
        return arm["model"] == model
    return bool(served) and arm.get("served_model") == served


def single_pair(ledger: Ledger, model: str | None, served: str | None) -> tuple[SinglePairCard | None, str]:
    """The latest single-group card of this model with aggregate figures, and a sentence saying which (or why none)."""
    what = model or served or "this model"
    try:
        entries = CardIndex(ledger).query()
    except Exception as exc:  # noqa: BLE001 - the history is derived data; without it, say so
        return None, f"none measured: the bench history could not be read ({exc})"
    for e in reversed(entries):
        if e.get("replicated") or e.get("mode") != "deployment":
            continue
        for arm in e.get("arms") or []:
            figs = {k.split(".", 1)[1]: v["median"] for k, v in (arm.get("metrics") or {}).items()
                    if k.startswith("aggregate.c") and isinstance(v, dict) and v.get("median") is not None}
            if figs and _same_model(arm, model, served):
                card = SinglePairCard(run_id=e["run_id"], started=e.get("started"), profile=arm.get("profile"),
                                      deployment=arm.get("deployment"), emulated=bool(arm.get("emulated")),
                                      path=e.get("path"), aggregate_tok_s=figs)
                label = " (EMULATED)" if card.emulated else ""
                return card, (f"measured: card {card.run_id} ({card.profile}, {card.started}){label}, the latest "
                              f"single-group card of {what} with concurrency figures")
    return None, (f"none measured: no single-group card of {what} with concurrency figures in this cluster's "
                  f"bench history (`sparkctl bench` on a single-group deployment records one)")


def _n(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def render_router(L: list[str], result: JSONObject) -> None:
    r = result.get("router")
    if not r:
        return
    label = " (EMULATED)" if r.get("emulated") else ""
    L += ["", f"## Through the router{label}", ""]
    L.append(f"Router `{r['url']}` in front of {len(r['replicas'])} replicas of `{r.get('profile')}` "
             f"({r.get('model')}); every request of this card went through it.")
    for rep in r["replicas"]:
        L.append(f"- replica {rep['index']}: `{rep['url']}` on {', '.join(rep['nodes']) or '?'} "
                 f"(deployment {rep.get('deployment') or 'unknown'}), max_running_requests "
                 f"{rep.get('max_running_requests')} ({rep.get('max_running_requests_source')})")
    L.append("")
    L.append(f"Requests per replica: {r['requests_source']}.")
    L.append(f"Tokens per replica: {r['tokens_source']}." if r.get("tokens_source") else
             f"Tokens per replica: unavailable ({r.get('tokens_error')}).")
    if r.get("metrics_error"):
        L.append(f"**Per-replica split unavailable**: {r['metrics_error']}.")
    sp = r.get("single_pair")
    L.append(f"Single pair: {r['single_pair_note']}.")
    if not r.get("levels"):
        L += ["", "No concurrency level was measured (the concurrency gate did not run or failed)."]
        return
    idx = [rep["index"] for rep in r["replicas"]]
    head = (["concurrency", "aggregate tok/s"] + [f"replica {i} requests (share)" for i in idx]
            + ([f"replica {i} tokens" for i in idx] if r.get("tokens_source") else [])
            + ["single pair tok/s" + (" (emulated)" if sp and sp.get("emulated") else ""), "vs single pair"])
    L += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for lv in r["levels"]:
        by = {s["index"]: s for s in lv.get("replicas") or []}
        cells = [f"c{lv['concurrency']}", _n(lv.get("aggregate_tok_s"))]
        for i in idx:
            s = by.get(i) or {}
            cells.append("unavailable" if s.get("requests") is None else
                         f"{s['requests']:g} ({_n(s.get('share'), '{:.0%}')})")
        if r.get("tokens_source"):
            cells += ["-" if (by.get(i) or {}).get("tokens") is None else f"{by[i]['tokens']:g}" for i in idx]
        cells.append("none measured" if sp is None else
                     _n(lv.get("single_pair_tok_s")) if lv.get("single_pair_tok_s") is not None else
                     f"not measured at c{lv['concurrency']}")
        cells.append(_n(lv.get("vs_single_pair"), "{:.2f}x"))
        L.append("| " + " | ".join(cells) + " |")
    notes = [f"- c{lv['concurrency']}: {lv['split_note']}" for lv in r["levels"] if lv.get("split_note")]
    if notes:
        L += [""] + notes
