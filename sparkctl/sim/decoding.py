"""What the emulated model says, and how fast: tokenizer, text generator, acceptance model, radix cache.

Documented simplifications (so tests and the bench can reason about them):

* **Tokenizer**: one token per word (``\\w+``) or per punctuation character (``[^\\w\\s]``):
  ``count_tokens("Hi, you!") == 4``.
* **Chat template**: ``<|role|>\\ncontent\\n`` per message, then ``<|assistant|>\\n``; prompt tokens are
  the tokens of that string. ``prompt_key`` = first 16 hex digits of sha256 of that string
  (``prompt_key_for_messages``), or of the raw text for ``/generate``.
* **Output**: deterministic per prompt at temperature 0 or when no temperature is given (a word
  generator seeded by sha256 of the prompt); one word or punctuation mark = one token. With
  thinking on (chat requests, unless ``chat_template_kwargs.enable_thinking`` is false) the output is
  reasoning words + ``</think>`` + answer words: ``<think>`` belongs to the prompt (as in GLM/Qwen3
  templates) and ``</think>`` is the last token of the reasoning part. Natural lengths are drawn per prompt from
  the ``reasoning_tokens`` / ``content_tokens`` knob
  ranges; reaching the natural end finishes with ``stop``, ``max_tokens`` with ``length``.
* **Divergence**: with speculative decoding on, a prompt listed in the ``divergence`` knob (key = a
  prompt-key prefix, or ``contains:TEXT``), or picked by ``divergence_rate``, produces a different
  token at that 0-based completion index and a different continuation after it.
* **Prompt class**: ``code`` when the prompt mentions a code-ish word (``CODE_WORDS``), else
  ``prose``. Speculative acceptance per verify step: each of the D-1 drafts is accepted with probability
  alpha until the first rejection, plus the bonus token (L in 1..D, E[L] = (1-alpha^D)/(1-alpha)), alpha
  fitted so that E[L] = ``accept_len_code``/``accept_len_prose`` at ``accept_ref_draft_tokens`` draft
  tokens (``sparkctl/sim/perf.py``). Draws are seeded per prompt.
"""
from __future__ import annotations

import hashlib
import os
import random
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

CODE_WORDS = frozenset("""code function def class implement implementation python rust javascript typescript
go java cpp c++ compile compiler bug debug refactor queue thread threaded mutex lock async await api regex
sql json script program algorithm struct module unittest test pytest loop recursion""".split())

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_PROSE = """the a of and to in is that it for as with on this be by are from or an which at not have
model system measure result value time because we can will should more than its these their when data
each must one two first then however also point question answer clear simple case rate number
evidence claim careful honest report reason way part whole small large fast slow true false""".split()
_REASON = """okay so the user wants me to think about this let check what first then maybe consider
wait actually need make sure that answer is right step next approach hmm good plan""".split()
_CODE = """def return self queue lock thread item put get while if else for in None True False import
class init wait notify with condition append pop len raise value timeout worker result""".split()
_PUNCT_AFTER = (",", ".", ":")          # attach to the previous token
_CODE_PUNCT = ("(", ")", ":", ",", ".", "=")


def tokenize(text: str) -> list[str]:
    return _TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    return len(_TOKEN_RE.findall(text))


def chat_prompt_text(messages: Iterable[dict]) -> str:
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<|{m.get('role', 'user')}|>\n{content or ''}\n")
    return "".join(parts) + "<|assistant|>\n"


def prompt_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def prompt_key_for_messages(messages: Iterable[dict]) -> str:
    """The key the ``divergence`` knob matches for a chat request."""
    return prompt_key(chat_prompt_text(messages))


def is_code_prompt(text: str) -> bool:
    words = {w.lower() for w in re.findall(r"[A-Za-z+]+", text)}
    return bool(words & CODE_WORDS) or "```" in text


def _seed(*parts: object) -> int:
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).hexdigest()
    return int(h[:16], 16)


def token_id(tok: str) -> int:
    return _seed("id", tok) % 151_000


def join_piece(prev: str | None, tok: str) -> str:
    """The text a token adds after ``prev`` (None = first token of a part)."""
    if prev is None:
        return tok
    if tok in _PUNCT_AFTER or tok == ")" or prev == "(" or tok == "(":
        return tok
    return " " + tok


def render(tokens: Iterable[str]) -> str:
    out, prev = [], None
    for t in tokens:
        out.append(join_piece(prev, t))
        prev = t
    return "".join(out)


class TokenPlan:
    """The completion a prompt gets: tokens by index, plus where reasoning ends.

    ``reasoning_len`` tokens (tags included) come first when thinking is on; the natural end is
    ``natural_len``. ``diverge_at`` (spec on only) makes token i >= diverge_at come from another stream.
    """

    def __init__(self, text: str, *, thinking: bool, reasoning_range: tuple[int, int],
                 content_range: tuple[int, int], diverge_at: int | None = None, nonce: int = 0) -> None:
        self.key = prompt_key(text)
        self.code = is_code_prompt(text)
        base = _seed("gen", text, nonce)
        lr = random.Random(_seed("len", text, nonce))
        r = lr.randint(*reasoning_range) if thinking else 0
        c = lr.randint(*content_range)
        self.reasoning_len = r + 1 if thinking else 0
        self.natural_len = self.reasoning_len + c
        self.diverge_at = diverge_at
        self._streams = [random.Random(base), random.Random(base ^ 0x5EED_D1F)]
        self._tokens: list[str] = []
        self._base: list[str] = []
        self._lock = threading.Lock()

    def _word(self, rng: random.Random, i: int, prev: str | None) -> str:
        if self.reasoning_len and i == self.reasoning_len - 1:
            return THINK_CLOSE
        in_reasoning = i < self.reasoning_len
        if prev not in (None, THINK_CLOSE) and rng.random() < 0.12:
            if self.code and not in_reasoning:
                return rng.choice(_CODE_PUNCT)
            if prev not in _PUNCT_AFTER:
                return rng.choice(_PUNCT_AFTER)
        vocab = _REASON if in_reasoning else (_CODE if self.code else _PROSE)
        return rng.choice(vocab)

    def token(self, i: int) -> str:
        with self._lock:
            while len(self._tokens) <= i:
                j = len(self._tokens)
                base_prev = self._base[-1] if self._base else None
                base_tok = self._word(self._streams[0], j, base_prev)
                self._base.append(base_tok)
                if self.diverge_at is None or j < self.diverge_at:
                    self._tokens.append(base_tok)
                    continue
                prev = self._tokens[-1] if self._tokens else None
                tok = self._word(self._streams[1], j, prev)
                tries = 0
                while j == self.diverge_at and tok == base_tok and tries < 32:
                    tok = self._word(self._streams[1], j, prev)
                    tries += 1
                self._tokens.append(tok)
            return self._tokens[i]

    def tokens(self, start: int, end: int) -> list[str]:
        return [self.token(i) for i in range(start, end)]

    def is_reasoning(self, i: int) -> bool:
        return i < self.reasoning_len


def make_plan(text: str, *, thinking: bool, knobs, spec_on: bool, temperature: float) -> TokenPlan:
    nonce = 0 if not temperature or temperature <= 0 else int.from_bytes(os.urandom(6), "big")
    key = prompt_key(text)
    diverge = divergence_index(text, key, knobs) if spec_on else None
    plan = TokenPlan(text, thinking=thinking, reasoning_range=tuple(knobs.reasoning_tokens),
                     content_range=tuple(knobs.content_tokens), diverge_at=diverge, nonce=nonce)
    return plan


def divergence_index(text: str, key: str, knobs) -> int | None:
    for k, pos in (knobs.divergence or {}).items():
        if k.startswith("contains:"):
            if k[len("contains:"):] in text:
                return int(pos)
        elif k == "*" or (len(k) >= 4 and key.startswith(k.lower())):
            return int(pos)
    if knobs.divergence_rate > 0:
        u = (_seed("div", key) % 1_000_000) / 1_000_000
        if u < knobs.divergence_rate:
            lo, hi = knobs.divergence_positions
            return lo + _seed("divpos", key) % max(1, hi - lo + 1)
    return None


class AcceptanceModel:
    """Deterministic per-prompt accept lengths: drafts are accepted one by one with probability alpha until
    the first rejection, at most D-1, plus the bonus token: L in 1..D, E[L] = (1 - alpha^D) / (1 - alpha).
    alpha is fitted per class so that E[L] at accept_ref_draft_tokens is the class knob (sim/perf.py)."""

    def __init__(self, key: str, code: bool, draft_tokens: int, knobs) -> None:
        from sparkctl.sim.perf import class_alpha, expected_accept_len
        self.draft = max(1, int(draft_tokens))
        self.alpha = class_alpha(knobs, code)
        self.mean = expected_accept_len(self.alpha, self.draft)
        self._rng = random.Random(_seed("accept", key))

    def next(self) -> int:
        n = 1
        while n < self.draft and self._rng.random() < self.alpha:
            n += 1
        return n


class RadixCache:
    """Prefix cache over token sequences (LRU, bounded in tokens). ``match`` never covers the whole
    prompt: SGLang always computes at least one token (``#new-token: 1``)."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity = max(1, capacity_tokens)
        self._entries: OrderedDict[tuple[str, ...], None] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def match(self, tokens: list[str]) -> int:
        best = 0
        with self._lock:
            for seq in self._entries:
                n = len(os.path.commonprefix([seq, tuple(tokens)]))
                if n > best:
                    best, hit = n, seq
            if best:
                self._entries.move_to_end(hit)
        return min(best, max(0, len(tokens) - 1))

    def insert(self, tokens: list[str]) -> None:
        seq = tuple(tokens)
        if not seq:
            return
        with self._lock:
            if seq in self._entries:
                self._entries.move_to_end(seq)
                return
            self._entries[seq] = None
            self._size += len(seq)
            while self._size > self.capacity and len(self._entries) > 1:
                old, _ = self._entries.popitem(last=False)
                self._size -= len(old)

    def flush(self) -> None:
        with self._lock:
            self._entries.clear()
            self._size = 0

    @property
    def size(self) -> int:
        return self._size
