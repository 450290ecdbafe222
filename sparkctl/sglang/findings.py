"""Match log text against the catalogue: typed findings with bounded, escaped evidence.

Pure functions over text (no I/O). Untrusted input stays data: each physical line is cut at ``\\r`` (progress bars),
stripped of ANSI colour codes (sparkctl.sglang.logparse.clean_line), searched only in its first `SCAN_CHARS`
characters (a 1 MB line costs no more than a 32 KB one), and what is kept as evidence is escaped (control and other
non-printable characters as ``\\x1b``, ``\\u202e``) and cut at `EVIDENCE_CHARS`, at most `EVIDENCE_LINES` per finding.

Example::

    findings = match_sources([LogText("rank 0", text)])
    findings[0].signature, findings[0].fix
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from sparkctl.sglang.logparse import clean_line
from sparkctl.sglang.signatures import CATALOGUE, Signature

SCAN_CHARS = 32 * 1024      # a server_args line runs to 14 KB; nothing in the catalogue sits further in
EVIDENCE_LINES = 5
EVIDENCE_CHARS = 300


def printable(text: str, limit: int = EVIDENCE_CHARS) -> str:
    """`text` safe for a terminal: every non-printable character escaped (``\\x1b``, ``\\t``, ``\\u202e``), cut at
    `limit` characters with the cut said."""
    cut = len(text) > limit
    head = text[:limit]
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in head)
    return out + (f"... [{len(text) - limit} more characters]" if cut else "")


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Evidence(_Out):
    source: str = Field(description="Where the line was read: 'rank 0 [spark-a]', 'journal', a file path.")
    line: int = Field(description="Line number in that source (1-based, physical lines).")
    text: str = Field(description="The line, escaped and cut at 300 characters.")


class Finding(_Out):
    """One catalogue signature seen in what was read."""

    signature: str
    title: str
    cause: str
    fix: str
    source: str = Field(description="Where the cause and fix come from (operations.md, a capture, SGLang's source).")
    matches: int = Field(description="Distinct matching lines (evidence shows the first few).")
    evidence: list[Evidence]


@dataclass
class LogText:
    """One text to match: `name` says where it came from (shown with each evidence line)."""

    name: str
    text: str
    secondary: bool = False     # a summary of other sources (the failure record, the journal): its lines count
                                # only for signatures no primary source showed (they quote the rank logs' lines)


@dataclass
class _Hits:
    sig: Signature
    seen: dict[str, Evidence] = field(default_factory=dict)     # escaped text -> first evidence
    order: tuple[int, int] = (0, 0)                             # (source index, line) of the first match
    secondary_only: bool = False                                # seen so far only in summaries


def segments(text: str) -> Iterable[tuple[int, str]]:
    """(physical line number, cleaned segment) of `text`: lines cut at ``\\r``, ANSI codes dropped, each segment
    clipped to SCAN_CHARS before any pattern sees it."""
    for no, physical in enumerate(text.split("\n"), 1):
        for part in physical.split("\r"):
            seg = clean_line(part[:SCAN_CHARS + 64])[:SCAN_CHARS]
            if seg.strip():
                yield no, seg


def match_sources(sources: Iterable[LogText], catalogue: tuple[Signature, ...] = CATALOGUE) -> list[Finding]:
    """Every signature seen in `sources`, in the order first seen; evidence de-duplicated across sources, and a
    secondary source (the failure record, the journal: they quote the rank logs) adds evidence only to signatures no
    primary source showed; at most EVIDENCE_LINES lines per finding. Primary sources come first in `sources`."""
    hits: dict[str, _Hits] = {}
    for si, src in enumerate(sources):
        live: dict[str, list[tuple[int, str]]] = {}      # this source's matches, until a later line cancels them
        for no, seg in segments(src.text):
            for sig in catalogue:
                if sig.cancelled_by is not None and sig.id in live and sig.cancelled_by.search(seg):
                    del live[sig.id]
                if sig.pattern.search(seg):
                    live.setdefault(sig.id, []).append((no, seg))
        for sig in catalogue:
            if src.secondary and sig.id in hits and not hits[sig.id].secondary_only:
                continue
            for no, seg in live.get(sig.id, []):
                h = hits.setdefault(sig.id, _Hits(sig, order=(si, no), secondary_only=src.secondary))
                text = printable(seg.strip())
                h.seen.setdefault(text, Evidence(source=printable(src.name, 120), line=no, text=text))
    ordered = sorted(hits.values(), key=lambda h: (h.order, h.sig.id))
    return [Finding(signature=h.sig.id, title=h.sig.title, cause=h.sig.cause, fix=h.sig.fix, source=h.sig.source,
                    matches=len(h.seen), evidence=list(h.seen.values())[:EVIDENCE_LINES]) for h in ordered]


def match_text(text: str, name: str = "log") -> list[Finding]:
    """`match_sources` of one text."""
    return match_sources([LogText(name, text)])


def finding_lines(findings: list[Finding], *, evidence: int = 1) -> list[str]:
    """Findings as the lines `up` appends to a failure's evidence: what the doctor recognised, its fix and source."""
    out: list[str] = []
    for f in findings:
        out.append(f"doctor: {f.signature}: {f.title}")
        out.append(f"  cause: {f.cause}")
        out.append(f"  fix: {f.fix}")
        out.append(f"  source: {f.source}")
        out += [f"  seen ({e.source}, line {e.line}): {e.text}" for e in f.evidence[:evidence]]
    return out
