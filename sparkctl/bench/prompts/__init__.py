"""The bench's workloads: fixed prompt sets shipped with the package, and long TTFT prompts made on demand.

* ``decode_prompts()``: one prompt per class (``code``, ``prose``), the seed card's "threaded queue impl"
  and "measurement essay" (``prompts/decode.json``).
* ``g6_prompts()``: the 20 fixed greedy-comparison prompts (``prompts/g6.json``): math with steps, code,
  short facts, formatting-sensitive answers.
* ``long_prompt(n_words, tag)``: a deterministic filler passage behind a unique prefix, so the radix
  cache can match nothing of it (SGLang matches prefixes: a different first sentence shares nothing).
  ``words_for_tokens`` turns a target token count into a word count from a calibration
  (``TokenCalibration``, measured against the server's own ``usage.prompt_tokens``).

Example::

    code = decode_prompts()["code"]
    text = long_prompt(words_for_tokens(4096, cal), tag="run-1/ttft-4096/0")
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from functools import cache
from importlib import resources

from sparkctl.jsontypes import JSONObject

__all__ = ["Prompt", "decode_prompts", "g6_prompts", "long_prompt", "TokenCalibration", "words_for_tokens",
           "prompt_set_digest", "LONG_PROMPT_QUESTION"]


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


def long_prompt(n_words: int, tag: str) -> str:
    """A deterministic passage of ``n_words`` filler words behind a prefix unique to ``tag``.

    The same (n_words, tag) always gives the same text; two tags share no leading text, so a radix
    cache holding one cannot serve the other. Repeating the same tag is how the bench asks for the
    radix-cached repeat.
    """
    nonce = hashlib.sha256(tag.encode()).hexdigest()[:16]
    rng = random.Random(nonce)
    words = [rng.choice(_WORDS) for _ in range(max(0, n_words))]
    lines = [" ".join(words[i:i + 16]) + "." for i in range(0, len(words), 16)]
    return f"Reference {nonce}. Read the passage below.\n\n" + "\n".join(lines) + f"\n\n{LONG_PROMPT_QUESTION}"


@dataclass(frozen=True)
class TokenCalibration:
    """Server tokens for a long prompt = ``overhead + tokens_per_word * n_words`` (measured, or assumed)."""

    tokens_per_word: float
    overhead_tokens: int
    measured: bool        # False: the 1.0/0 assumption, no probe was run

    def as_dict(self) -> JSONObject:
        return {"tokens_per_word": round(self.tokens_per_word, 4), "overhead_tokens": self.overhead_tokens,
                "measured": self.measured}


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
