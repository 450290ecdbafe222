"""G6: greedy outputs with speculation ON vs OFF, compared token for token.

Per prompt the verdict is one of:

* ``identical``: reasoning and content are the same on both sides, character for character;
* ``diverged``: the first differing token index ``i`` (counted over reasoning then content), with both
  sides shown around ``i``. Tokens are the server's token ids/strings when both sides returned logprobs
  covering the whole completion, else whitespace-separated words (said in ``tokenization``). A difference
  in whitespace only is still a divergence (``whitespace only``);
* ``void``: nothing captured on both sides (or a request failed): a harness failure, never a pass.

The summary never calls the outputs lossless unless every prompt is identical.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sparkctl.bench.prompts import Prompt
from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.client import ChatResult, SGLangAPIError, SGLangClient

log = logging.getLogger("sparkctl.bench")

__all__ = ["Capture", "PromptVerdict", "capture_from_result", "compare", "summarize_verdicts", "run_g6_arm",
           "CONTEXT_TOKENS"]

CONTEXT_TOKENS = 8   # tokens shown each side of a divergence


@dataclass
class Capture:
    """What one arm produced for one prompt: both channels, and token ids/strings when available."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[JSONObject] = field(default_factory=list)
    tokens: list[str] | None = None          # server tokens (logprobs.content[].token), when given
    top2_gaps: list[float | None] | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.reasoning or self.content or self.tool_calls)

    def as_dict(self) -> JSONObject:
        return {"reasoning": self.reasoning, "content": self.content, "tool_calls": self.tool_calls,
                "completion_tokens": self.completion_tokens, "reasoning_tokens": self.reasoning_tokens,
                "finish_reason": self.finish_reason, "error": self.error,
                "server_tokens": len(self.tokens) if self.tokens is not None else None}


def _logprob_tokens(raw: JSONObject | None) -> tuple[list[str] | None, list[float | None] | None]:
    """Token strings and top-2 logprob gaps from a non-streamed body's ``choices[0].logprobs.content``."""
    if not raw:
        return None, None
    choice = (raw.get("choices") or [{}])[0]
    lp = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    if not isinstance(lp, list) or not lp:
        return None, None
    tokens: list[str] = []
    gaps: list[float | None] = []
    for entry in lp:
        if not isinstance(entry, dict) or "token" not in entry:
            return None, None
        tokens.append(str(entry["token"]))
        given = [t.get("logprob") for t in entry.get("top_logprobs") or [] if isinstance(t, dict)]
        top = sorted((x for x in given if isinstance(x, (int, float))), reverse=True)
        gaps.append(top[0] - top[1] if len(top) >= 2 else None)
    return tokens, gaps


def capture_from_result(res: ChatResult) -> Capture:
    tokens, gaps = _logprob_tokens(res.raw)
    return Capture(reasoning=res.reasoning_content, content=res.content, tool_calls=list(res.tool_calls),
                   tokens=tokens, top2_gaps=gaps, completion_tokens=res.usage.completion_tokens,
                   reasoning_tokens=res.usage.reasoning_tokens, finish_reason=res.finish_reason)


@dataclass
class PromptVerdict:
    prompt_id: str
    status: str                           # identical | diverged | void
    index: int | None = None              # first differing token
    channel: str | None = None            # reasoning | content | tool_calls at the divergence
    tokenization: str = "whitespace"      # whitespace | server tokens
    detail: str = ""
    on_context: str = ""
    off_context: str = ""
    top2_gap_on: float | None = None
    top2_gap_off: float | None = None
    tokens_compared: int = 0

    def as_dict(self) -> JSONObject:
        return {k: v for k, v in self.__dict__.items()}


def _sequence(c: Capture) -> list[tuple[str, str]]:
    seq = [("reasoning", t) for t in c.reasoning.split()]
    seq += [("content", t) for t in c.content.split()]
    seq += [("tool_calls", json.dumps(t, sort_keys=True)) for t in c.tool_calls]
    return seq


def _show(seq: Sequence[str], i: int, marker: bool = True) -> str:
    lo, hi = max(0, i - CONTEXT_TOKENS), min(len(seq), i + CONTEXT_TOKENS + 1)
    parts = list(seq[lo:i]) + ([f"[[{seq[i]}]]"] if i < len(seq) else ["[[<end>]]"]) + list(seq[i + 1:hi])
    return ("... " if lo > 0 else "") + " ".join(parts) + (" ..." if hi < len(seq) else "")


def compare(prompt_id: str, on: Capture, off: Capture) -> PromptVerdict:
    """The verdict for one prompt (pure). See the module docstring for the rules."""
    if on.error or off.error:
        which = "; ".join(f"{side}: {c.error}" for side, c in (("ON", on), ("OFF", off)) if c.error)
        return PromptVerdict(prompt_id, "void", detail=f"request failed ({which}): harness failure, not a pass")
    if on.empty and off.empty:
        return PromptVerdict(prompt_id, "void", detail="nothing captured on either side (no reasoning, no content): "
                                                 "harness failure, not a pass")
    use_server = (on.tokens is not None and off.tokens is not None
                  and on.completion_tokens == len(on.tokens) and off.completion_tokens == len(off.tokens))
    if use_server:
        a, b = on.tokens or [], off.tokens or []
        i: int | None = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        if a == b and on.reasoning == off.reasoning and on.content == off.content:
            return PromptVerdict(prompt_id, "identical", tokenization="server tokens", tokens_compared=len(a))
        if a == b:
            i = None  # tokens equal but the parser split the channels differently
        v = PromptVerdict(prompt_id, "diverged", index=i, tokenization="server tokens",
                          tokens_compared=min(len(a), len(b)))
        if i is not None:
            v.on_context, v.off_context = _show([repr(t)[1:-1] for t in a], i), _show([repr(t)[1:-1] for t in b], i)
            v.top2_gap_on = (on.top2_gaps or [None] * (i + 1))[i] if i < len(on.top2_gaps or []) else None
            v.top2_gap_off = (off.top2_gaps or [None] * (i + 1))[i] if i < len(off.top2_gaps or []) else None
            v.detail = _end_note(i, len(a), len(b))
        else:
            v.detail = "same tokens, different reasoning/content split"
        return v
    sa, sb = _sequence(on), _sequence(off)
    if on.reasoning == off.reasoning and on.content == off.content and on.tool_calls == off.tool_calls:
        return PromptVerdict(prompt_id, "identical", tokens_compared=len(sa))
    if sa == sb:
        # same words: the difference is whitespace; locate it by characters
        for channel, x, y in (("reasoning", on.reasoning, off.reasoning), ("content", on.content, off.content)):
            if x != y:
                k = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
                words_before = len(x[:k].split()) + (len(on.reasoning.split()) if channel == "content" else 0)
                return PromptVerdict(prompt_id, "diverged", index=words_before, channel=channel,
                                     tokens_compared=len(sa), detail=f"whitespace only, at character {k} of {channel}",
                                     on_context=repr(x[max(0, k - 40):k + 40]),
                                     off_context=repr(y[max(0, k - 40):k + 40]))
    i = next((k for k, (x, y) in enumerate(zip(sa, sb)) if x != y), min(len(sa), len(sb)))
    at_channel = (sa[i] if i < len(sa) else sb[i])[0] if (i < len(sa) or i < len(sb)) else None
    detail = _end_note(i, len(sa), len(sb))
    if on.empty != off.empty:
        detail = f"{'ON' if on.empty else 'OFF'} side captured nothing; " + detail
    return PromptVerdict(prompt_id, "diverged", index=i, channel=at_channel, tokens_compared=min(len(sa), len(sb)),
                   detail=detail, on_context=_show([t for _, t in sa], i), off_context=_show([t for _, t in sb], i))


def _end_note(i: int, la: int, lb: int) -> str:
    if i >= la and i < lb:
        return f"ON ended at token {i}, OFF went on to {lb}"
    if i >= lb and i < la:
        return f"OFF ended at token {i}, ON went on to {la}"
    return f"first differing token at index {i}"


def summarize_verdicts(verdicts: Sequence[PromptVerdict], *, between_engines: str | None = None) -> JSONObject:
    """Counts and the one-line verdict. "lossless" appears only when every prompt is identical and both arms are
    one engine: with ``between_engines`` (e.g. "vLLM 0.32.0 vs SGLang 0.5.23") the arms are two engines, whose
    greedy outputs are expected to differ, and the line says the comparison is of engines, not of losslessness."""
    n = len(verdicts)
    k = sum(v.status == "identical" for v in verdicts)
    d = sum(v.status == "diverged" for v in verdicts)
    void = sum(v.status == "void" for v in verdicts)
    if n and k == n:
        line = (f"{k}/{n} identical across engines ({between_engines}) on these {n} prompts" if between_engines
                else f"{k}/{n} identical: lossless at temperature 0 on these {n} prompts")
    else:
        line = f"{k}/{n} identical"
        if d:
            line += f", {d} diverged"
        if void:
            line += f", {void} VOID (harness captured nothing: not a pass)"
        if between_engines:
            line += (f"; two engines ({between_engines}): their greedy outputs are expected to differ at temperature "
                     "0 (kernels, reduction order, detokenisation of partial UTF-8 tokens); this compares engines and "
                     "is not a losslessness verdict on either")
        else:
            line += "; ON is NOT bit-identical to OFF on this stack" if d else "; not established"
    gaps = [g for v in verdicts for g in (v.top2_gap_on, v.top2_gap_off) if g is not None]
    out: JSONObject = {"n": n, "identical": k, "diverged": d, "void": void, "all_identical": bool(n) and k == n,
                       "summary": line, "top2_gaps_at_divergence": gaps or None}
    if between_engines:
        out["between_engines"] = between_engines
    return out


def run_g6_arm(client: SGLangClient, prompts: Sequence[Prompt], *, max_tokens: int, model: str | None,
               logprobs: bool = True, progress: Callable[[str], None] | None = None) -> list[Capture]:
    """One arm's outputs for every prompt: temperature 0, one stream at a time, reasoning AND content.

    Asks for logprobs (top 2) so the comparison can use server tokens; a server that refuses them is
    asked again without, and the comparison falls back to whitespace tokens.
    """
    out: list[Capture] = []
    use_lp = logprobs
    for p in prompts:
        extra = {"logprobs": True, "top_logprobs": 2} if use_lp else None
        try:
            try:
                res = client.chat(p.messages(), max_tokens=max_tokens, temperature=0, model=model, extra=extra)
            except SGLangAPIError as exc:
                if not use_lp or exc.status not in (400, 422):
                    raise
                log.info("server refused logprobs (%s); comparing by whitespace tokens", exc.status)
                use_lp = False
                res = client.chat(p.messages(), max_tokens=max_tokens, temperature=0, model=model)
            cap = capture_from_result(res)
        except SGLangAPIError as exc:
            cap = Capture(error=exc.message)
        out.append(cap)
        if progress:
            progress(f"G6 {p.id}: {cap.completion_tokens} tokens" + (f" (error: {cap.error})" if cap.error else ""))
    return out
