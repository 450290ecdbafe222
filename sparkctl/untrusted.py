"""Text that came from outside is data: one policy for it, applied at the boundary.

Profile, run and model names, endpoint answers, gate evidence, log lines, journal and card fields all reach a
terminal or a card in the end. `clean` is the one sanitiser they pass through there:

* every C0 control character (but newline and tab), DEL and every C1 control character is escaped as ``\\xNN``
  (so ``ESC [ 2 J`` prints as ``\\x1b[2J``: visible, inert), and the Unicode bidi overrides and isolates as
  ``\\u202e`` (they reorder what a terminal shows);
* a line longer than `LINE_LIMIT` characters becomes a short excerpt: its head and tail around a marker saying how
  much was cut (``... [98,304 characters cut] ...``);
* credentials in a URL (``scheme://user:password@host``) are masked as ``scheme://user:***@host``.

The CLI installs `GuardedStream` over stdout and stderr (sparkctl/cli/main.py), so everything printed goes
through `clean` without each caller remembering to; JSON output is written ASCII-escaped (its data intact, every
control character a JSON escape) and cards are rendered from scrubbed JSON (`sparkctl.bench.outcome.scrubbed`).

`record_name` is the other half: a name read back from a file sparkctl wrote (a tune journal's profile, a card's
run id, a replicated record's profile) is checked to be a plain name, never a path, else the file is damaged
(LedgerError, exit 6).
"""
from __future__ import annotations

import io
import re
from typing import IO, TextIO, TypeGuard

from sparkctl.errors import LedgerError

__all__ = ["LINE_LIMIT", "TEXT_LIMIT", "GuardedStream", "clean", "clean_line", "excerpt", "mask_url_credentials",
           "record_name", "is_plain_name"]

LINE_LIMIT = 4096              # characters of one printed line; longer ones become head ... tail
_EXCERPT = 1024                # characters kept at each end of an over-long line

# C0 (but \t and \n), DEL, C1; the bidi embedding/override/isolate marks.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_BIDI = re.compile(r"[\u202a-\u202e\u2066-\u2069]")
# scheme://user:password@  (also user@ alone: a token given as the user name)
_URL_CREDS = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s/@:\"']*)(?::(?P<pw>[^\s/\"']*))?@")


def mask_url_credentials(text: str) -> str:
    """``http://user:pw@host`` -> ``http://user:***@host``; ``https://token@host`` -> ``https://***@host`` (an
    http(s) user name alone is a token; ``ssh://root@host`` keeps its user, which is no secret)."""
    def sub(m: re.Match[str]) -> str:
        if m.group("pw") is None:
            token = m.group("user") and m.group("scheme").lower() in ("http://", "https://")
            return f"{m.group('scheme')}***@" if token else m.group(0)
        return f"{m.group('scheme')}{m.group('user')}:***@"
    return _URL_CREDS.sub(sub, text)


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def clean_line(line: str, limit: int = LINE_LIMIT) -> str:
    """One line made safe: controls escaped, URL credentials masked, bounded to about `limit` characters."""
    line = mask_url_credentials(_BIDI.sub(_escape, _CONTROL.sub(_escape, line)))
    if len(line) > limit:
        keep = min(_EXCERPT, limit // 2)
        line = f"{line[:keep]} ... [{len(line) - 2 * keep:,} characters cut] ... {line[-keep:]}"
    return line


def clean(text: object, limit: int = LINE_LIMIT) -> str:
    """Untrusted text as it may reach a terminal or a card: every line through `clean_line` (newlines kept; a
    carriage return is escaped, so nothing overwrites what was printed). Example::

        clean("run \\x1b[2Jx")   ->  'run \\\\x1b[2Jx'
    """
    text = text if isinstance(text, str) else str(text)
    return "\n".join(clean_line(line, limit) for line in text.split("\n"))


TEXT_LIMIT = 1024              # characters of one piece of endpoint text kept in an error (head ... tail)


def excerpt(text: object, limit: int = TEXT_LIMIT, *, one_line: bool = True) -> str:
    """One piece of untrusted text bounded as a whole (not line by line): escaped as `clean_line` does (a newline
    too, so it stays one line; `one_line` False keeps newlines, for evidence shown as a block) and, past `limit`
    characters, its head and tail around a marker saying how much was cut. What an endpoint says (an error's
    reason, body or evidence) goes through this once, where the error is made, so every output of it (stderr, a
    card, the ledger, JSON) holds the same bounded text. Example::

        excerpt("x" * 100_000, 40)  ->  'xxxxxxxxxx ... [99,980 characters cut] ... xxxxxxxxxx'
    """
    text = text if isinstance(text, str) else str(text)
    text = text.replace("\n", "\\n") if one_line else text
    safe = mask_url_credentials(_BIDI.sub(_escape, _CONTROL.sub(_escape, text)))
    if len(safe) <= limit:
        return safe
    keep = max(1, limit // 4)
    return f"{safe[:keep]} ... [{len(safe) - 2 * keep:,} characters cut] ... {safe[-keep:]}"


_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")


def is_plain_name(value: object) -> TypeGuard[str]:
    """Letters, digits, '.', '-', '_' (not leading '-' or '.'), no '..', at most 255: a name, never a path."""
    return isinstance(value, str) and bool(_PLAIN.fullmatch(value)) and ".." not in value


def record_name(value: object, what: str, where: str) -> str:
    """`value` read from the file `where` as the name `what` (a profile, a run id), or LedgerError (exit 6) saying
    the file is damaged: a name from a journal or a card is a name, never a path or a terminal sequence."""
    if is_plain_name(value):
        return value
    shown = clean(repr(value), 120)
    raise LedgerError(f"damaged: {what} is not a plain name ({shown})", where=where,
                      hint="the file was changed by hand or is damaged; `sparkctl repair` moves it aside")


class GuardedStream(io.TextIOBase):
    """A text stream that passes every write through `clean` on the way to `raw` (line by line: a line split
    over several writes is still bounded). ``raw`` stays reachable for rich's live display and for JSON, which
    bring their own escaping (`write_raw`)."""

    def __init__(self, raw: TextIO) -> None:
        super().__init__()
        self.raw = raw
        self._col = 0                   # characters of the current line already written

    def write(self, s: str) -> int:
        """Text only, as the stream it stands for: bytes raise TypeError like ``sys.stderr.write(b"")`` does.
        Libraries probe a stream that way to find out whether it is binary (click's ``_is_binary_writer``, typer's
        own copy of it): a stream that took ``b""`` as text printed every usage error as ``b'...'`` reprs."""
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        out = []
        for k, part in enumerate(s.split("\n")):
            if k:
                out.append("\n")
                self._col = 0
            if not part:
                continue
            safe = mask_url_credentials(_BIDI.sub(_escape, _CONTROL.sub(_escape, part)))
            room = LINE_LIMIT - self._col
            if len(safe) > room:
                cut = len(safe) - max(room, 0)
                safe = safe[:max(room, 0)] + (f" ... [{cut:,} characters cut]" if room >= 0 else "")
                self._col = LINE_LIMIT + 1          # the rest of this line is dropped
            else:
                self._col += len(safe)
            out.append(safe)
        self.raw.write("".join(out))
        return len(s)

    def write_raw(self, s: str) -> int:
        """Bypass the guard (for text that is escaped already: ASCII JSON)."""
        self._col = 0 if s.endswith("\n") else self._col
        return self.raw.write(s)

    def flush(self) -> None:
        self.raw.flush()

    def isatty(self) -> bool:
        return bool(getattr(self.raw, "isatty", lambda: False)())

    def fileno(self) -> int:
        return self.raw.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]  # read-only here: the raw stream's encoding
        return getattr(self.raw, "encoding", "utf-8") or "utf-8"

    def writable(self) -> bool:
        return True


def raw_stream(stream: IO[str]) -> IO[str]:
    """The stream under a `GuardedStream` (or `stream` itself)."""
    return stream.raw if isinstance(stream, GuardedStream) else stream


def write_json(stream: TextIO, text: str) -> None:
    """JSON text to `stream` past the guard: the caller makes it ASCII (json.dumps' default), so every control
    character in it is a JSON escape already and the data stays intact."""
    if isinstance(stream, GuardedStream):
        stream.write_raw(text)
    else:
        stream.write(text)
