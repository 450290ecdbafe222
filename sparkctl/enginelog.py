"""Reading an engine's log, whichever engine: the entry points that know both SGLang and vLLM.

`follower_for(engine)` is the boot state machine (`sparkctl.sglang.bootwatch.LogFollower`) reading that engine's
lines through its `LogDialect` (SGLang's `sparkctl.sglang.logparse`, vLLM's `sparkctl.vllm.logparse`);
`ALL_SIGNATURES` is the doctor's catalogue of known failures of both engines (and the engine-neutral NCCL / GB10
ones), for `sparkctl.sglang.findings.match_sources(sources, ALL_SIGNATURES)`.

Its own module because sparkctl.sglang and sparkctl.vllm must not import each other back (tests/unit/
test_import_graph.py): vLLM's parser builds on SGLang's types, and only this module sees both.
"""
from __future__ import annotations

from sparkctl.sglang.bootwatch import LogFollower
from sparkctl.sglang.logparse import SGLANG_LOG, LogDialect
from sparkctl.sglang.signatures import CATALOGUE, Signature
from sparkctl.vllm.logparse import VLLM_LOG
from sparkctl.vllm.signatures import VLLM_CATALOGUE

__all__ = ["LOG_DIALECTS", "ALL_SIGNATURES", "SIGNATURES_OF", "follower_for"]

LOG_DIALECTS: dict[str, LogDialect] = {"sglang": SGLANG_LOG, "vllm": VLLM_LOG}

# SGLang's catalogue first (its findings come out as before), then vLLM's: no vLLM signature matches an SGLang
# capture (tests/vllm/test_vllm_signatures.py).
ALL_SIGNATURES: tuple[Signature, ...] = CATALOGUE + VLLM_CATALOGUE
# What one engine's log is matched against: its own findings and the engine-neutral ones (SGLang's catalogue holds
# the NCCL / GB10 ones); a failed boot names only findings of the engine that printed the log.
SIGNATURES_OF: dict[str, tuple[Signature, ...]] = {"sglang": CATALOGUE, "vllm": ALL_SIGNATURES}


def follower_for(engine: str, **kwargs: int) -> LogFollower:
    """A `LogFollower` reading `engine`'s log ("sglang" | "vllm"); `kwargs` are LogFollower's sizes (context_before,
    context_after, tail, refine_window). ValueError for an engine with no log dialect."""
    try:
        dialect = LOG_DIALECTS[engine]
    except KeyError:
        raise ValueError(f"no log dialect for engine {engine!r} (known: {', '.join(sorted(LOG_DIALECTS))})") from None
    return LogFollower(dialect=dialect, **kwargs)
