"""The bench's workloads: fixed prompt sets shipped with the package, and long TTFT prompts made on demand.

* ``decode_prompts()``: one prompt per class (``code``, ``prose``), the seed card's "threaded queue impl"
  and "measurement essay" (``prompts/decode.json``).
* ``g6_prompts()``: the 20 fixed greedy-comparison prompts (``prompts/g6.json``): math with steps, code,
  short facts, formatting-sensitive answers.
* ``long_prompt(n_words, tag)``: a deterministic filler passage behind a unique prefix, so the radix
  cache can match nothing of it (SGLang matches prefixes: a different first sentence shares nothing).
  ``words_for_tokens`` turns a target token count into a word count from a calibration
  (``TokenCalibration``, measured against the server's own ``usage.prompt_tokens``); ``fit_prompt`` then
  corrects each prompt against the server's own count (``probe_text``) until it is within 2 % of its label.

Example::

    code = decode_prompts()["code"]
    text = long_prompt(words_for_tokens(4096, cal), tag="run-1/ttft-4096/0")
"""
from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources

from sparkctl.jsontypes import JSONObject

__all__ = ["Prompt", "decode_prompts", "g6_prompts", "long_prompt", "TokenCalibration", "words_for_tokens",
           "prompt_set_digest", "LONG_PROMPT_QUESTION", "PROBE_MARKER", "probe_text", "PromptFit", "fit_prompt",
           "FIT_TOLERANCE", "FIT_MAX_PROBES"]


@dataclass(frozen=True)
class Prompt:
    id: str
    kind: str          # code | prose (decode); math | code | fact | format | reasoning (G6)
    text: str
    title: str = ""

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.text}]


@cache
def _load(name: str) -> JSONObject:
    return json.loads(resources.files("sparkctl.bench.prompts").joinpath(name).read_text(encoding="utf-8"))


def decode_prompts() -> dict[str, Prompt]:
    """{class: Prompt} for the decode-throughput classes, in file order (code, prose)."""
    return {p["class"]: Prompt(p["id"], p["class"], p["text"], p.get("title", ""))
            for p in _load("decode.json")["prompts"]}


def g6_prompts() -> list[Prompt]:
    """The fixed G6 prompts (20), in file order."""
    return [Prompt(p["id"], p["kind"], p["text"]) for p in _load("g6.json")["prompts"]]


def prompt_set_digest() -> str:
    """Short hash of the shipped prompt sets: recorded with every result so cards compare like with like."""
    h = hashlib.sha256()
    for name in ("decode.json", "g6.json"):
        h.update(json.dumps(_load(name), sort_keys=True).encode())
    h.update(_FILLER_VERSION.encode())
    return h.hexdigest()[:12]


# --------------------------------------------------------------------------- long prompts (TTFT)

_FILLER_VERSION = "filler-v1"
# Short, common English words: about one token each in the usual BPE vocabularies.
_WORDS = (
    "the of and to in is was for on that with as by at from his her are be this which or an had not but "
    "they have were one all their there been has more when who will no if out so can said what up its about "
    "into than them only other new some could time these two may then do first any my now such like our over "
    "man me even most made after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still own see men work "
    "long get here between both life being under never day same another know while last might us great old "
    "year off come since against go came right used take three"
).split()
LONG_PROMPT_QUESTION = "Summarise the passage above in one sentence."


_PAD = " the"      # the fine step of a fitted prompt: one token in every BPE vocabulary seen (and the emulator's)


def long_prompt(n_words: int, tag: str, pad: int = 0) -> str:
    """A deterministic passage of ``n_words`` filler words (then ``pad`` times " the") behind a prefix unique to
    ``tag``.

    The same (n_words, tag, pad) always gives the same text; two tags share no leading text, so a radix
    cache holding one cannot serve the other. Repeating the same tag is how the bench asks for the
    radix-cached repeat.
    """
    nonce = hashlib.sha256(tag.encode()).hexdigest()[:16]
    rng = random.Random(nonce)
    words = [rng.choice(_WORDS) for _ in range(max(0, n_words))]
    lines = [" ".join(words[i:i + 16]) + "." for i in range(0, len(words), 16)]
    tail = _PAD * max(0, pad)
    return (f"Reference {nonce}. Read the passage below.\n\n" + "\n".join(lines) + tail
            + f"\n\n{LONG_PROMPT_QUESTION}")


# A probe of a prompt's size is the prompt behind this line: the server counts its tokens, and since the probe starts
# with text the prompt does not, a radix cache that kept the probe shares nothing of the prompt with it (it matches
# prefixes). The line's own tokens are measured once per calibration (``TokenCalibration.marker_tokens``).
PROBE_MARKER = "Prompt size probe.\n"


def probe_text(text: str) -> str:
    return PROBE_MARKER + text


@dataclass(frozen=True)
class TokenCalibration:
    """Server tokens for a long prompt = ``overhead + tokens_per_word * n_words`` (measured, or assumed)."""

    tokens_per_word: float
    overhead_tokens: int
    measured: bool        # False: the 1.0/0 assumption, no probe was run
    marker_tokens: int | None = None    # server tokens PROBE_MARKER adds; None: not measured (no fitting)

    def as_dict(self) -> JSONObject:
        return {"tokens_per_word": round(self.tokens_per_word, 4), "overhead_tokens": self.overhead_tokens,
                "measured": self.measured, "marker_tokens": self.marker_tokens}


ASSUMED_CALIBRATION = TokenCalibration(1.0, 0, measured=False)


def calibration_from_probes(small_tokens: int, big_tokens: int, big_words: int) -> TokenCalibration:
    """From two probes: ``long_prompt(0, ...)`` gave ``small_tokens``, ``long_prompt(big_words, ...)`` gave
    ``big_tokens``."""
    if big_words <= 0 or big_tokens <= small_tokens:
        return ASSUMED_CALIBRATION
    return TokenCalibration((big_tokens - small_tokens) / big_words, small_tokens, measured=True)


def words_for_tokens(target_tokens: int, cal: TokenCalibration) -> int:
    """Words of filler so the prompt comes to about ``target_tokens`` server tokens."""
    return max(0, round((target_tokens - cal.overhead_tokens) / cal.tokens_per_word))


FIT_TOLERANCE = 0.02      # a fitted prompt's server tokens are within 2 % of its label
FIT_MAX_PROBES = 8        # size probes per prompt, at most


@dataclass(frozen=True)
class PromptFit:
    """The (words, pad) a prompt was fitted to, the server tokens its last-best probe counted, probes spent."""

    words: int
    pad: int
    tokens: int | None    # None: no probe answered (the calibration's estimate is used as is)
    probes: int
    within: bool          # |tokens - target| <= FIT_TOLERANCE * target

    def as_dict(self) -> JSONObject:
        return {"words": self.words, "pad": self.pad, "tokens": self.tokens, "probes": self.probes,
                "within": self.within}


def _next_shape(words: int, pad: int, diff: int, tpw: float, over: int | None) -> tuple[int, int]:
    """The next (words, pad) to try when the last one counted ``diff`` tokens too few (negative: too many). Whole
    words close a gap of more than two words' worth, undershooting, unless they would reach ``over`` (the fewest
    words already counted over the target); " the" pads (one token each) close the rest; too many tokens take pads
    off first, then whole words."""
    if diff > 0:
        step = max(1, int(diff / tpw) - 1)
        if diff > 2 * tpw and (over is None or words + step < over):
            return words + step, pad
        return words, pad + diff
    if pad >= -diff:
        return words, pad + diff
    return max(0, words - max(1, math.ceil((-diff - pad) / tpw))), 0


def fit_prompt(count: Callable[[int, int], int | None], target: int, cal: TokenCalibration, *,
               tolerance: float = FIT_TOLERANCE, max_probes: int = FIT_MAX_PROBES) -> PromptFit:
    """The prompt shape (words, pad) whose server token count lands within ``tolerance`` of ``target``.

    ``count(words, pad)`` is the server's count for that shape (a probe), or None when the server would not count
    it. Starts from the calibration's estimate; a shape counted once is never probed again; stops when within
    tolerance, after ``max_probes`` probes (or three times as many steps), or at the first None; returns the closest
    shape counted (the estimate, if none was). Words stay under 4 x target + 64 and pads under target, whatever the
    server counted."""
    tpw = max(cal.tokens_per_word, 0.25)
    words, pad = words_for_tokens(target, cal), 0
    best: PromptFit | None = None
    known: dict[tuple[int, int], int] = {}
    over: int | None = None
    probes = 0
    for _ in range(3 * max_probes):
        got = known.get((words, pad))
        if got is None:
            if probes == max_probes:
                break
            probes += 1
            got = count(words, pad)
            if got is None:
                break
            known[(words, pad)] = got
        if best is None or abs(got - target) < abs((best.tokens or 0) - target):
            best = PromptFit(words, pad, got, probes, abs(got - target) <= tolerance * target)
        if best.within:
            break
        if got > target:
            over = words if over is None else min(over, words)
        words, pad = _next_shape(words, pad, target - got, tpw, over)
        words, pad = min(words, 4 * target + 64), min(pad, target)   # a hostile count never sizes a huge prompt
    if best is None:
        return PromptFit(words_for_tokens(target, cal), 0, None, probes, False)
    return PromptFit(best.words, best.pad, best.tokens, probes, best.within)
