"""A systemd unit read back as systemd reads it (systemd.syntax(7), systemd.service(5) "Command lines",
systemd.exec(5) Environment=), for the tests of `sparkctl watch --install`: the unit's ExecStart argv, its
Environment= variables and its WorkingDirectory, so a test can run what systemd would run.

It follows systemd's load-fragment.c for what sparkctl writes: a word is split on whitespace, double or single
quotes group, a backslash escapes (C escapes: ``\\\\``, ``\\"``, ``\\n``, ``\\xNN`` ...); ``%%`` is a literal ``%``
(any other specifier is refused here: sparkctl never writes one); in ExecStart's arguments (not its program path,
which systemd never expands) ``$$`` is a literal ``$`` and a ``$NAME`` / ``${NAME}`` would be expanded (refused here
for the same reason).
"""
from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, field
from pathlib import Path

_WS = " \t\n\r"


class UnitSyntaxError(ValueError):
    pass


def words(value: str) -> list[str]:
    """systemd's extract_first_word(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE), word after word."""
    out: list[str] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in _WS:
            i += 1
        if i >= n:
            return out
        word, quote = [], None
        while i < n:
            c = value[i]
            if quote is None and c in _WS:
                break
            if c == "\\":
                if i + 1 >= n:
                    raise UnitSyntaxError(f"a trailing backslash in {value!r}")
                m = re.match(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|.)", value[i:], re.S)
                assert m
                esc = m.group(0)
                word.append(esc[1] if esc[1] in "\\\"' ;" else codecs.decode(esc, "unicode_escape"))
                i += len(esc)
                continue
            if quote is None and c in "\"'":
                quote = c
            elif c == quote:
                quote = None
            else:
                word.append(c)
            i += 1
        if quote is not None:
            raise UnitSyntaxError(f"unbalanced quoting in {value!r}")
        out.append("".join(word))


def specifiers(text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group(0) != "%%":
            raise UnitSyntaxError(f"specifier {m.group(0)} in {text!r}")
        return "%"
    return re.sub(r"%.", sub, text, flags=re.S)


def dollars(text: str) -> str:
    if re.search(r"\$(?!\$)[{A-Za-z_]", text.replace("$$", "")):
        raise UnitSyntaxError(f"a variable would be expanded in {text!r}")
    return text.replace("$$", "$")


@dataclass
class ParsedUnit:
    argv: list[str]
    environment: dict[str, str] = field(default_factory=dict)
    working_directory: str | None = None
    environment_files: list[str] = field(default_factory=list)
    keys: dict[str, list[str]] = field(default_factory=dict)


def parse_unit(text: str) -> ParsedUnit:
    keys: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;[":
            continue
        if line.endswith("\\"):
            raise UnitSyntaxError(f"a continued line: {line!r}")
        key, _, value = line.partition("=")
        keys.setdefault(key.strip(), []).append(value.strip())
    (exec_start,) = keys["ExecStart"]
    found = [specifiers(w) for w in words(exec_start)]
    argv = found[:1] + [dollars(w) for w in found[1:]]      # the program's path is never expanded
    env: dict[str, str] = {}
    for assignment in keys.get("Environment", []):
        for w in words(assignment):
            name, eq, val = specifiers(w).partition("=")
            if not eq:
                raise UnitSyntaxError(f"not an assignment: {w!r}")
            env[name] = val
    wd = keys.get("WorkingDirectory", [None])[-1]
    files = [specifiers(f) for f in keys.get("EnvironmentFile", [])]
    return ParsedUnit(argv=argv, environment=env, working_directory=specifiers(wd) if wd else None,
                      environment_files=files, keys=keys)


def read_unit(path: Path) -> ParsedUnit:
    return parse_unit(path.read_text())
