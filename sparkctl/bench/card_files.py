"""Where a bench run's card goes and how it is written: ``report.json`` (the run record, secrets masked),
``report.md`` (the card rendered from that same JSON, escaped and bounded) and ``decode.svg``, in the ledger's run
directory (sparkctl's: private, atomic) or in the directory the user named with ``--out`` (theirs: written as
given, `sparkctl.userfiles`; an existing card replaced only with ``--force``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparkctl.bench.chart import decode_svg
from sparkctl.bench.outcome import scrubbed
from sparkctl.bench.report import render_card
from sparkctl.errors import ConfigError, OutputPathError
from sparkctl.state.runs import RunRecord
from sparkctl.statefiles import write_text_atomic
from sparkctl.untrusted import clean
from sparkctl.userfiles import check_user_target, write_user_text

if TYPE_CHECKING:
    from sparkctl.bench.arms import BenchOptions
    from sparkctl.state.ledger import Ledger

REPORT_FILES = ("report.json", "report.md", "decode.svg")
CARD_LINE_LIMIT = 16384        # characters of one line of report.md (a wide table row fits; a 100 kB line does not)


@dataclass(frozen=True)
class ReportDir:
    """Where the card goes: the run's directory in the ledger (sparkctl's: private, `user` False) or the
    directory the user named with ``--out`` (theirs: written as given, `sparkctl.userfiles`; an existing card
    there is replaced only with `overwrite`, ``--force``)."""

    path: Path
    user: bool = False
    overwrite: bool = False


def card_dir(opts: BenchOptions, ledger: Ledger | None, run_id: str) -> ReportDir:
    """The card's directory; a user-named ``--out`` is checked before anything is measured (a directory that
    cannot take the card, or a card already there without --force, is refused now, not after the run)."""
    if opts.out_dir:
        out = Path(opts.out_dir)
        if not out.is_dir():
            if out.exists() or out.is_symlink():
                raise OutputPathError("is not a directory", where=f"--out {out}",
                                      hint="--out names the directory for report.md, report.json and decode.svg")
            try:
                out.mkdir(parents=True)              # the user's umask: a directory sparkctl creates for them
            except OSError as exc:
                raise OutputPathError(f"cannot be created: {exc.strerror or exc}", where=f"--out {out}",
                                      hint="create it first, or choose a directory you can write to") from None
        for name in REPORT_FILES:
            check_user_target(out / name, overwrite=opts.overwrite, option="--out")
        return ReportDir(out, user=True, overwrite=opts.overwrite)
    if ledger is None:
        raise ConfigError("no place to write the report", hint="pass --out DIR")
    return ReportDir(ledger.run_dir(run_id))


def write_report(result: RunRecord, out_dir: ReportDir | Path, secrets: set[str] | None = None) -> RunRecord:
    """``report.json``, ``report.md`` (rendered from the same JSON) and ``decode.svg``, atomically: mode 0600 in
    the ledger's run directory, as given (`sparkctl.userfiles`) in a directory the user named.

    Returns the record as written (what ``report.json`` holds), with ``files`` naming the files written; every
    string in it has the run's ``secrets`` and any URL's credentials masked.
    """
    target = out_dir if isinstance(out_dir, ReportDir) else ReportDir(Path(out_dir))
    if target.user:

        def write(path: Path, text: str) -> None:
            write_user_text(path, text, overwrite=target.overwrite, option="--out")
    else:
        target.path.mkdir(parents=True, exist_ok=True)

        def write(path: Path, text: str) -> None:
            write_text_atomic(path, text)
    json_path, md_path = target.path / "report.json", target.path / "report.md"
    files = {"json": str(json_path), "markdown": str(md_path)}
    svg = decode_svg(scrubbed(result.as_json(), set(secrets or ())))
    if svg is not None:
        svg_path = target.path / "decode.svg"
        write(svg_path, svg)
        files["chart"] = str(svg_path)
    result.files = files
    data = scrubbed(result.as_json(), set(secrets or ()))
    write(json_path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    write(md_path, clean(render_card(data), CARD_LINE_LIMIT))     # names and evidence from outside: escaped, bounded
    return RunRecord.model_validate(data)
