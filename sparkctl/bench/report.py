"""The measurement card (Markdown), rendered only from the result JSON, so the card's numbers are the JSON's.

Sections follow the hand-written measurement card this reproduces: serving config, cold start,
decode throughput (ON / OFF / ratio, with the scheduler gauge peak labelled as a gauge), acceptance
(saying which source), the G6 greedy comparison, TTFT, concurrency, the router's per-replica split (a replicated
deployment: sparkctl.bench.router_card), and the reference-comparison slot.
Emulated results say so at the top and on every arm. Display rounding: tok/s 1 decimal, seconds
3 decimals, ratios 2 decimals, accept len/rate 2 decimals.
"""
from __future__ import annotations

from typing import Any

from sparkctl.bench.router_card import render_router
from sparkctl.jsontypes import JSONObject

__all__ = ["render_card", "fmt_tps", "fmt_s", "fmt_ratio"]


def fmt_tps(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.1f}"


def fmt_s(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def fmt_ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}×"


def _f2(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _rng(r: Any) -> str:
    if not r:
        return "n/a"
    lo, hi = r
    return f"{lo:.2f}–{hi:.2f}"


def _summary_cell(s: JSONObject | None, unit: str = " tok/s") -> str:
    if not s:
        return "not measured"
    cell = f"{fmt_tps(s['median'])}{unit} ({fmt_tps(s['min'])}–{fmt_tps(s['max'])})"
    if s.get("noisy"):
        cell += f" NOISY (spread {s['spread_pct']:.1f}% > 2%)"
    return cell


def _arm_title(a: JSONObject) -> str:
    c = a["config"]
    t = f"{c['role']}: {c['name']}" + (f" ({c['engine_label']})" if c.get("engine_label") else "")
    if c.get("emulated"):
        t += " (emulated)"
    return t


def _by_role(result: JSONObject) -> dict[str, JSONObject]:
    return {a["config"]["role"]: a for a in result.get("arms") or []}


def render_card(result: JSONObject) -> str:
    L: list[str] = []
    arms = result.get("arms") or []
    model = next((a["config"].get("model") for a in arms if a["config"].get("model")), None)
    what = model or (result.get("log_only") or {}).get("log") or "endpoint"
    L.append(f"# Measured results — {what}")
    L.append("")
    if result.get("emulated"):
        L.append("> **EMULATED**: these numbers come from sparkctl's SGLang emulator (no GPU). They test the "
                 "harness, not a Spark; never quote them as hardware results.")
        L.append("")
    L.append(f"Run `{result['run_id']}` ({result['mode']}), {result.get('started')} → {result.get('finished')}, "
             f"status **{result['status']}**, prompt set `{result.get('prompt_set')}`.")
    death = result.get("rank_death")
    if death:
        L += ["", f"**Rank {death['rank']} ({death['node']}) died during the run**: found dead at {death['at']} "
                  f"({death['elapsed_s']} s in, during {death['during']}): {death['state']}."]
    for e in result.get("errors") or []:
        L.append("")
        L.append(f"**Error**: {e.splitlines()[0]}")
    if result.get("mode") == "log-only":
        _log_only(L, result)
        return "\n".join(L) + "\n"
    _serving(L, result)
    _cold(L, result)
    _decode(L, result)
    _acceptance(L, result)
    _g6(L, result)
    _ttft(L, result)
    _concurrency(L, result)
    render_router(L, result)
    _reference(L, result)
    _restore(L, result)
    L.append("")
    files = result.get("files") or {}
    L.append(f"Every number above, with the configuration it came from: `{files.get('json', 'report.json')}`.")
    return "\n".join(L) + "\n"


def _serving(L: list[str], result: JSONObject) -> None:
    L += ["", "## Serving config", ""]
    for a in result.get("arms") or []:
        c = a["config"]
        if c.get("engine_facts"):
            _serving_engine(L, a)
            continue
        si = c.get("server_info") or {}
        res = si.get("resolved") or {}
        mrr = c.get("max_running_requests") or {}
        spec = c.get("speculative_algorithm")
        total = res.get('max_total_num_tokens') or (c.get('capacity') or {}).get('max_total_num_tokens') or 'unknown'
        L.append(f"**{_arm_title(a)}** — {c['endpoint']}")
        L.append(f"- SGLang {c.get('sglang_version') or 'unknown'}; model {c.get('model') or 'unknown'}; "
                 f"speculative {spec + ' (' + str(c.get('draft_tokens')) + ' draft tokens)' if spec else 'off'}")
        L.append(f"- context {c.get('context_length') or 'unknown'}, max_total_num_tokens "
                 f"{total}, "
                 f"max_running_requests resolved to {mrr.get('value') if mrr.get('value') is not None else 'unknown'} "
                 f"({mrr.get('source', 'unknown')}), KV {si.get('kv_cache_dtype') or 'unknown'}, "
                 f"mem-fraction-static {si.get('mem_fraction_static') or 'unknown'}, "
                 f"prefix cache {c.get('prefix_cache')}")
        _provenance(L, c, "scheduler log")
        L.append("")
    o = result.get("options") or {}
    L.append(f"Workload: temperature 0, streamed, max_tokens {o.get('max_tokens')}, n={o.get('runs')} per class, "
             f"warm-up {o.get('warmup')} × {o.get('warmup_max_tokens') or o.get('max_tokens')} tokens after the "
             f"first request.")
    lim = o.get("limits")
    if lim:
        L.append(f"Bounds: connect {lim['connect_s']:g} s, read {lim['read_s']:g} s, idle {lim['idle_s']:g} s, "
                 f"request deadline {lim['request_s']:g} s, run deadline {o.get('run_deadline_s') or 'none'} s, "
                 f"body cap {lim['max_body_bytes']:,} bytes, event cap {lim['max_event_bytes']:,} bytes.")


def _provenance(L: list[str], c: JSONObject, log_name: str) -> None:
    """Where an arm's figures come from: profile, deployment, identity, images, clocks, its log, rank 0's argv."""
    L.append(f"- profile {c.get('profile') or 'none (bare endpoint)'}, deployment {c.get('deployment') or 'none'}, "
             f"identity {c.get('identity') or 'unknown'}, image {', '.join(c.get('images') or []) or 'unknown'}")
    L.append(f"- clocks: {c.get('clocks_policy', 'unknown')}; {log_name}: {c.get('log') or 'none'}")
    argv = (c.get("argv_per_rank") or {}).get("0")
    if argv:
        L.append(f"- rank 0 argv (redacted): `{' '.join(argv)}`")


def _serving_engine(L: list[str], a: JSONObject) -> None:
    """An arm served by an engine other than SGLang (vLLM): its configuration as that engine reported it, in its
    own names, and what SGLang's card shows that it does not report."""
    c = a["config"]
    f = c["engine_facts"]
    name = f.get("engine_name") or f.get("engine")
    spec = f.get("speculative_method")
    tokens = f.get("draft_tokens")
    L.append(f"**{_arm_title(a)}** — {c['endpoint']}")
    L.append(f"- {name} {f.get('version') or 'unknown'}; model {c.get('model') or 'unknown'}; speculative "
             + (f"{spec} ({tokens if tokens is not None else 'unknown'} {f.get('draft_tokens_meaning')})" if spec
                else "off"))
    conc, kv = f.get("kv_concurrency"), f.get("kv_tokens")
    L.append(f"- context {f.get('context_length') or 'unknown'} ({f.get('context_source')}), KV cache "
             + (f"{kv:,} tokens" if isinstance(kv, int) else "unknown")
             + (f" (holds {conc:.2f} requests of the full context at once)" if isinstance(conc, (int, float)) else "")
             + f", KV {f.get('kv_dtype') or 'unknown'}, {f.get('memory_fraction_name') or 'memory fraction'} "
               f"{f.get('memory_fraction') or 'unknown'}, "
               f"prefix cache {f.get('prefix_cache')}")
    mrr = f.get("max_running_requests")
    L.append(f"- max running requests {mrr if mrr is not None else 'unknown'} ({f.get('max_running_requests_source')})")
    L.append(f"- read from: {'; '.join(f.get('sources') or [])}")
    _provenance(L, c, "engine log")
    missing = c.get("not_reported") or {}
    if missing:
        L.append(f"- not reported by {name} (so not on this card):")
        L += [f"  - {what.replace('_', ' ')}: {why}" for what, why in missing.items()]
    L.append("")


def _cold(L: list[str], result: JSONObject) -> None:
    rows = [(a, (a["results"].get("cold") or {})) for a in result.get("arms") or [] if a["results"].get("cold")]
    if not rows:
        return
    L += ["", "## Cold start (excluded from every median)", ""]
    for a, cold in rows:
        if cold.get("error"):
            L.append(f"- {_arm_title(a)}: FAILED: {cold['error'].splitlines()[0]}")
            continue
        fr = cold.get("first_request") or {}
        L.append(f"- {_arm_title(a)}: first request of this bench {fmt_s(fr.get('latency_s'))} s "
                 f"(TTFT {fmt_s(fr.get('ttft_s'))} s, {fr.get('completion_tokens')} tokens)")
        boot = cold.get("at_boot")
        if boot:
            L.append(f"  - first request after boot (deployment warm-up): {fmt_s(boot.get('elapsed_s'))} s, "
                     f"{boot.get('completion_tokens')} tokens")


def _decode(L: list[str], result: JSONObject) -> None:
    arms = result.get("arms") or []
    if not any(a["results"].get("decode") for a in arms):
        return
    o = result.get("options") or {}
    roles = _by_role(result)
    cols = [r for r in ("ON", "OFF", "A", "B") if r in roles]
    L += ["", f"## Decode throughput — warmed, temp 0, stream, {o.get('max_tokens')} max_tokens, "
              f"n={o.get('runs')}, medians (min–max)", ""]
    comp = (result.get("comparison") or {}).get("decode") or {}
    head = "| prompt | " + " | ".join(f"{r} ({roles[r]['config']['name']})" for r in cols)
    if len(cols) == 2:
        head += f" | ratio {cols[0]}/{cols[1]} |"
    elif len(cols) == 1:
        other = "OFF" if cols[0] == "ON" else "ON"
        head += f" | {other} | ratio |"
    L.append(head)
    L.append("|" + "---|" * (head.count("|") - 1))
    classes = list(dict.fromkeys(c for a in arms for c in ((a["results"].get("decode") or {}).get("classes") or {})))
    for cls in classes:
        entry0: JSONObject = next(((a["results"]["decode"]["classes"][cls]) for a in arms
                       if cls in ((a["results"].get("decode") or {}).get("classes") or {})), {})
        cells = [f"{entry0.get('prompt')} ({entry0.get('title')})"]
        for r in cols:
            e = (((roles[r]["results"].get("decode") or {}).get("classes") or {}).get(cls)) or {}
            cells.append(_summary_cell(e.get("decode_tok_s")))
        if len(cols) == 2:
            cells.append(fmt_ratio((comp.get(cls) or {}).get("ratio")))
        elif len(cols) == 1:
            cells += ["not measured (use --compare PROFILE)", "n/a"]
        L.append("| " + " | ".join(cells) + " |")
    if any(((e or {}).get("decode_tok_s") or {}).get("noisy") for a in arms
           for e in ((a["results"].get("decode") or {}).get("classes") or {}).values()):
        L.append("")
        L.append("NOISY: a spread above 2% means the machine was not quiet; re-run before quoting these.")
    chart = (result.get("files") or {}).get("chart")
    if chart:
        L += ["", "![decode throughput per arm](decode.svg)"]
    L.append("")
    L.append("tok/s = (completion_tokens − 1) / (last token − first token) per streamed request, "
             "completion_tokens from usage (reasoning included), never the chunk count.")
    for a in arms:
        for cls, e in ((a["results"].get("decode") or {}).get("classes") or {}).items():
            g = ((e.get("scheduler_log") or {}).get("decode") or {}).get("peak_gen_throughput")
            if g is not None:
                L.append(f"Instantaneous scheduler gauge peaked at {fmt_tps(g)} tok/s during {cls} decode "
                         f"({a['config']['role']}); reported here only as a gauge peak — the sustained medians "
                         f"above are the comparable numbers.")
    for a in arms:
        d = a["results"].get("decode") or {}
        if d.get("error"):
            L.append(f"Decode on {_arm_title(a)} FAILED: {d['error'].splitlines()[0]}")


def _acceptance(L: list[str], result: JSONObject) -> None:
    arms = [a for a in result.get("arms") or [] if a["results"].get("acceptance")]
    if not arms:
        return
    L += ["", "## Acceptance", ""]
    for a in arms:
        acc = a["results"]["acceptance"]
        if acc.get("status"):
            L.append(f"- {_arm_title(a)}: {acc['status']}")
            continue
        if acc.get("engine"):
            _acceptance_engine(L, a, acc)
            continue
        ver = acc.get("sglang_version") or "unknown"
        lg = acc.get("log") or {}
        dt = acc.get("draft_tokens")
        if lg.get("accept_len"):
            L.append(f"- {_arm_title(a)} ({lg.get('source')}): accept len {_rng(lg.get('accept_len'))} "
                     f"(bonus included; max {dt if dt else 'the draft-token count'}), accept rate "
                     f"{_rng(lg.get('accept_rate'))} (formula of SGLang {ver}; it changed in PR #23530), over "
                     f"{lg.get('active_batches')} decode-batch lines")
        else:
            L.append(f"- {_arm_title(a)}: scheduler log: {lg.get('note') or 'no accept len lines'}")
        wf = acc.get("log_whole_file")
        if wf:
            L.append(f"- {_arm_title(a)} ({wf['source']}; {wf['scope']}: {wf['log']}): accept len "
                     f"{_rng(wf.get('accept_len'))}, accept rate {_rng(wf.get('accept_rate'))} (SGLang {ver} "
                     f"as this server reports; the capture's own version may differ)")
        gen = acc.get("generate") or {}
        s = gen.get("accept_len")
        if s:
            L.append(f"- {_arm_title(a)} (per request, {gen.get('source')}): accept len {_f2(s['median'])} median "
                     f"({_f2(s['min'])}–{_f2(s['max'])}), n={s['n']}; SGLang {ver}")
        else:
            L.append(f"- {_arm_title(a)} (per request, /generate meta_info): {gen.get('note') or gen.get('error')}")


def _acceptance_engine(L: list[str], a: JSONObject, acc: JSONObject) -> None:
    """Acceptance on an engine other than SGLang: its counters' deltas and its own log lines."""
    ver = acc.get("sglang_version") or "unknown"
    cnt = acc.get("counters") or {}
    if cnt.get("mean_acceptance_length") is not None:
        L.append(f"- {_arm_title(a)} ({cnt.get('source')}): mean acceptance length "
                 f"{_f2(cnt['mean_acceptance_length'])} (bonus included), acceptance rate "
                 f"{_f2(cnt.get('acceptance_rate'))}: {cnt.get('accepted_tokens'):.0f} accepted of "
                 f"{cnt.get('draft_tokens'):.0f} draft tokens in {cnt.get('drafts'):.0f} drafts; {cnt.get('formula')}; "
                 f"version {ver}")
    else:
        L.append(f"- {_arm_title(a)} (counters): {cnt.get('note') or 'not measured'}")
    lg = acc.get("engine_log") or {}
    if lg.get("accept_len"):
        L.append(f"- {_arm_title(a)} ({lg.get('source')}): mean acceptance length {_rng(lg.get('accept_len'))}, draft "
                 f"acceptance rate {_rng(lg.get('accept_rate'))} over {lg.get('spec_lines')} line(s)")
    else:
        L.append(f"- {_arm_title(a)} (engine log): {lg.get('note') or 'no acceptance lines'}")
    if acc.get("not_reported"):
        L.append(f"- {_arm_title(a)} (per request): not reported: {acc['not_reported']}")


def _g6(L: list[str], result: JSONObject) -> None:
    g = result.get("g6")
    gates = (result.get("options") or {}).get("gates") or []
    if not g:
        if "g6" in gates:
            L += ["", "## G6 greedy comparison (ON vs OFF)", "",
                  "Not measured: G6 needs two arms (`--compare PROFILE` or `--compare-endpoint URL`)."]
        return
    L += ["", f"## G6 greedy comparison ({g['on']} vs {g['off']}, {g['n']} fixed prompts, temp 0, "
              f"{g['max_tokens']} max_tokens)", ""]
    L.append(f"**{g['summary']}**")
    L.append("")
    L.append(f"Captured: {g['captured']}.")
    L.append("")
    L.append(f"| prompt | verdict | token index | {g['on']} around the index | {g['off']} around the index |")
    L.append("|---|---|---|---|---|")

    def esc(s: str | None) -> str:
        return (s or "").replace("|", "\\|").replace("\n", " ")

    for p in g["prompts"]:
        verdict = {"identical": "identical", "diverged": "diverged", "void": "VOID"}[p["status"]]
        if p["status"] == "diverged" and p.get("detail"):
            verdict += f" ({p['detail']})"
        if p["status"] == "void":
            verdict += f" ({p.get('detail')})"
        idx = "" if p.get("index") is None else str(p["index"]) + (f" ({p['channel']})" if p.get("channel") else "")
        L.append(f"| {p['prompt_id']} | {verdict} | {idx} | {esc(p.get('on_context'))} | {esc(p.get('off_context'))} |")


def _ttft(L: list[str], result: JSONObject) -> None:
    arms = [a for a in result.get("arms") or [] if a["results"].get("ttft")]
    if not arms:
        return
    for a in arms:
        t = a["results"]["ttft"]
        L += ["", f"## TTFT ({_arm_title(a)}; stream, clock stops at the first content or reasoning delta, warm)", ""]
        if t.get("error"):
            L.append(f"FAILED: {t['error'].splitlines()[0]}")
            continue
        cal = t.get("calibration") or {}
        for e in t.get("sizes") or []:
            size = e["target_tokens"]
            if e.get("status") == "measured":
                s, p = e.get("ttft_s") or {}, e.get("prefill_tok_s") or {}
                L.append(f"- ~{size:,}-token prompt ({', '.join(str(x) for x in e.get('prompt_tokens') or [])} "
                         f"prompt tokens, unique prefix, uncached): TTFT {fmt_s(s.get('median'))} s"
                         + (f" ({fmt_s(s.get('min'))}–{fmt_s(s.get('max'))}, n={s.get('n')})"
                            if s.get("n", 1) > 1 else "")
                         + f", prefill {fmt_tps(p.get('median'))} tok/s"
                         + (f"; {e['note']}" if e.get("note") else ""))
            else:
                L.append(f"- ~{size:,}: {e.get('note')}")
        c = t.get("cached_repeat")
        if c:
            s = c.get("ttft_s") or {}
            L.append(f"- radix-cached repeat of the ~{c.get('target_tokens'):,} prompt: "
                     f"TTFT {fmt_s(s.get('median'))} s; "
                     f"{'recognised as cached' if c.get('radix_cached') else 'NOT recognised as cached'} "
                     f"({c.get('basis')})")
        L.append(f"- prompt sizes from {'a measured' if cal.get('measured') else 'an assumed'} token calibration "
                 f"({cal.get('tokens_per_word')} tokens/word)"
                 + (", each prompt then fitted to within 2 % of its label by the server's own count"
                    if cal.get("marker_tokens") is not None else "")
                 + f"; context window {t.get('context_length') or 'unknown'}")


def _concurrency(L: list[str], result: JSONObject) -> None:
    arms = [a for a in result.get("arms") or [] if a["results"].get("concurrency")]
    for a in arms:
        c = a["results"]["concurrency"]
        L += ["", f"## Concurrency ({_arm_title(a)}; identical requests started together, {c.get('max_tokens')} "
                  f"max_tokens)", ""]
        if c.get("error"):
            L.append(f"FAILED: {c['error'].splitlines()[0]}")
            continue
        for lv in c.get("levels") or []:
            line = (f"- c{lv['concurrency']}: aggregate {fmt_tps(lv.get('aggregate_tok_s'))} tok/s "
                    f"({lv.get('total_completion_tokens')} tokens in {fmt_s(lv.get('wall_s'))} s)")
            if lv["concurrency"] > 1 and lv.get("vs_c1") is not None:
                line += f", {fmt_ratio(lv['vs_c1'])} the single stream"
            if lv.get("errors"):
                line += f"; {len(lv['errors'])} request(s) failed: {lv['errors'][0]}"
            L.append(line)
            ser = lv.get("serialization")
            if ser and ser.get("serialized"):
                L.append(f"  - **SERIALIZED**: the server ran these requests one at a time: "
                         f"{'; '.join(ser['evidence'])}")
                if ser.get("reason"):
                    L.append(f"  - why ({ser.get('reason_source')}): `{ser['reason']}`; to change it: {ser.get('fix')}")
                else:
                    L.append("  - why: the engine gave no reason that sparkctl could read (no cap warning in its "
                             "log, no --max-running-requests in its launch command)")
            elif ser:
                L.append(f"  - ran concurrently (checked: {', '.join(ser['checked'])})")
        if a["config"].get("engine_facts") and c.get("max_running_requests") is None:
            L.append(f"- max running requests unknown ({c.get('max_running_requests_source')})")
        else:
            L.append(f"- max_running_requests resolved to {c.get('max_running_requests')} "
                     f"({c.get('max_running_requests_source')})")


def _reference(L: list[str], result: JSONObject) -> None:
    L += ["", "## Reference comparison (other published numbers, different stacks; not measured here)", ""]
    ref = result.get("reference") or []
    if ref:
        L += [f"- {r}" for r in ref]
    else:
        L.append("- none given (`--reference FILE`: one line per published number, with its source and stack)")


def _restore(L: list[str], result: JSONObject) -> None:
    r = result.get("restore")
    if r is None:
        return
    L.append("")
    if r.get("ok"):
        L.append(f"The original deployment ({r.get('profile')}) was restored after the comparison "
                 f"({r.get('outcome')}, {r.get('deployment')}).")
    else:
        L.append(f"**RESTORE FAILED** for {r.get('profile')}: {(r.get('error') or '').splitlines()[0]}")


def _log_only(L: list[str], result: JSONObject) -> None:
    lo = result.get("log_only") or {}
    if not lo:
        return
    L += ["", "## Acceptance (captured log only)", ""]
    L.append(f"Source: {lo['source']}; {lo['scope']}: `{lo['log']}` ({', '.join(lo.get('dialects') or [])} "
             f"dialect).")
    L.append("")
    L.append(f"- accept len {_rng(lo.get('accept_len'))}, accept rate {_rng(lo.get('accept_rate'))} over "
             f"{lo.get('active_batches')} active decode-batch lines (SGLang version {lo.get('sglang_version')}: "
             f"the rate's formula depends on it)")
    if lo.get("gauge_peak_gen_throughput") is not None:
        L.append(f"- scheduler gauge peak {fmt_tps(lo['gauge_peak_gen_throughput'])} tok/s (a gauge, not a "
                 f"sustained rate)")
    L.append(f"- max #running-req in decode lines: {lo.get('max_running_req')}")
    cap = lo.get("capacity") or {}
    if cap.get("max_running_requests") is not None:
        L.append(f"- capacity printed at boot: max_total_num_tokens {cap.get('max_total_num_tokens')}, "
                 f"max_running_requests {cap.get('max_running_requests')}, context_len {cap.get('context_len')}")
