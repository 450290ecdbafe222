"""Every usage-error path of the CLI, generated from the app itself, and what a run of one must show.

`cases()` walks the typer app's click tree (whichever typer, and so whichever click, is installed) and yields, per
command: its ``--help``; an unknown option; a missing required parameter (commands that have one); each option
with a fixed set of values given one that is not in it; each number option given a non-number; and per group: an
unknown command and a near-miss of each subcommand (click's "Did you mean"). `problems(case, code, out, err)` is
what is wrong with a run's text: a Python bytes repr (``b'...'``), no usage line, no ``Error:`` line, the wrong
exit code.

`python -m testrig.usage_cases` runs every case in-process against the sparkctl it imports, over real text streams
(a TextIOWrapper over bytes, as a terminal's are), and prints one JSON line: the typer and click versions and each
case's problems. tests/install/test_typer_range.py runs it in a venv per typer release of the pinned range.
"""
from __future__ import annotations

import enum
import io
import json
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SPARKS = str(REPO / "inventory" / "sparks.example.yml")
# extra -> the commands that need it (argv after `sparkctl`); "{replicated}" is a profile of two replicas, which on
# the embedded cluster runs the router on this machine. tests/unit/test_extras.py runs it in-process,
# tests/install/test_wheel.py from an install without the extras.
NEEDS: dict[str, list[list[str]]] = {
    "nodes": [[*cmd, "--inventory", SPARKS] for cmd in (
        ["preflight", "-p", "d5"], ["up", "-p", "d5", "--yes"], ["down", "--yes"], ["status"], ["logs"],
        ["doctor"], ["repair", "--yes"], ["rollback", "--to", "d5", "--yes"], ["bench"], ["tune", "-p", "d5"],
        ["watch"], ["image", "ls"], ["image", "prune"], ["image", "build", "-p", "d5"],
        ["image", "verify", "-p", "d5"])],
    "prepare": [["prepare", "--inventory", SPARKS], ["facts", "--inventory", SPARKS]],
    "router": [["up", "-p", "{replicated}", "--yes"]],
    "watch": [["watch", "--metrics-port", "9977"]],
}


@dataclass(frozen=True)
class Case:
    kind: str             # help, unknown-option, missing, bad-choice, bad-number, unknown-command, did-you-mean
    argv: tuple[str, ...]
    usage: str            # the usage line's start: "Usage: sparkctl image plan"
    expect: str           # a phrase click's message must hold ("" for --help)

    @property
    def id(self) -> str:
        return f"{self.kind}:{' '.join(self.argv)}"


def _tree() -> Any:
    import typer

    from sparkctl.cli.main import app
    return typer.main.get_command(app)


def _leaf_cases(path: list[str], cmd: Any) -> list[Case]:
    usage = "Usage: " + " ".join(["sparkctl", *path])
    out = [Case("help", (*path, "--help"), usage, ""),
           Case("unknown-option", (*path, "--no-such-option"), usage, "No such option")]
    params = [p for p in cmd.params if p.name not in ("help",)]
    if any(p.required for p in params):
        out.append(Case("missing", tuple(path), usage, "Missing"))
    for p in params:
        if p.param_type_name != "option" or getattr(p, "is_flag", False) or not p.opts:
            continue
        opt, kind = max(p.opts, key=len), _value_kind(p)
        if kind == "choice":
            out.append(Case("bad-choice", (*path, opt, "no-such-choice"), usage, "Invalid value"))
        elif kind == "number":
            out.append(Case("bad-number", (*path, opt, "not-a-number"), usage, "Invalid value"))
    return out


def _value_kind(param: Any) -> str | None:
    """"number", "choice" or None, from typer's TypeDescriptor (0.29: the annotation) or click's ParamType (0.26)."""
    ann = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if ann is not None:
        if ann in (int, float):
            return "number"
        if isinstance(ann, type) and issubclass(ann, enum.Enum) or typing.get_origin(ann) is typing.Literal:
            return "choice"
        return None
    ptype = getattr(param, "type", None)
    if getattr(ptype, "choices", None):
        return "choice"
    if getattr(getattr(ptype, "func", None), "__module__", "") == "sparkctl.cli.bounds":   # parser=bounds.seconds()
        return "number"
    return "number" if getattr(ptype, "name", "") in ("integer", "float", "integer range", "float range") else None


def cases() -> list[Case]:
    out: list[Case] = []

    def walk(cmd: Any, path: list[str]) -> None:
        if hasattr(cmd, "commands"):
            usage = "Usage: " + " ".join(["sparkctl", *path])
            out.append(Case("help", (*path, "--help"), usage, ""))
            out.append(Case("unknown-command", (*path, "zzzz"), usage, "No such command"))
            for name, sub in sorted(cmd.commands.items()):
                out.append(Case("did-you-mean", (*path, name + "x"), usage, f"Did you mean '{name}'"))
                walk(sub, [*path, name])
        else:
            out.extend(_leaf_cases(path, cmd))
    walk(_tree(), [])
    return out


def problems(case: Case, code: int, out: str, err: str) -> list[str]:
    """What is wrong with the text a case printed (empty: nothing)."""
    text = out if case.kind == "help" else err
    found = []
    for name, stream in (("stdout", out), ("stderr", err)):
        if "b'" in stream or 'b"' in stream:
            found.append(f"a bytes repr on {name}: {stream[:200]!r}")
    want = 0 if case.kind == "help" else 2
    if code != want:
        found.append(f"exit {code}, not {want}")
    if not any(line.strip().startswith(case.usage) for line in text.splitlines()[:3]):   # help: rich's box
        found.append(f"no {case.usage!r} line at the top of {'stdout' if case.kind == 'help' else 'stderr'}: "
                     f"{text[:200]!r}")
    if case.kind != "help":
        if "\nError: " not in err:
            found.append(f"no 'Error:' line: {err[:300]!r}")
        if case.expect not in err:
            found.append(f"{case.expect!r} not in {err[:300]!r}")
        if out:
            found.append(f"stdout not empty: {out[:200]!r}")
    return found


def run(case: Case) -> tuple[int, str, str]:
    """`sparkctl ARGV` in-process with stdout and stderr on text streams over bytes (each has a .buffer, as a
    terminal's does: what click probes)."""
    from sparkctl.cli.main import main
    saved = sys.stdout, sys.stderr
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    sys.stdout, sys.stderr = out, err
    try:
        code = main(list(case.argv))
    finally:
        sys.stdout, sys.stderr = saved
    texts = []
    for stream in (out, err):
        stream.flush()
        texts.append(stream.buffer.getvalue().decode("utf-8"))
    return code, texts[0], texts[1]


def main() -> int:
    from importlib.metadata import version
    results = {}
    all_cases = cases()
    for case in all_cases:
        code, out, err = run(case)
        results[case.id] = problems(case, code, out, err)
    try:
        click_version = version("click")
    except Exception:  # noqa: BLE001 - not installed: typer carries its own
        click_version = None
    print(json.dumps({"typer": version("typer"), "click": click_version, "cases": len(all_cases),
                      "problems": {k: v for k, v in results.items() if v}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
