#!/usr/bin/env python3
"""Generate sparkctl/sglang/dialects/<version>.json from SGLang's real released wheels.

For each version: build (or reuse) the cached venv of sparkctl.sglang.realparser, build SGLang's
own argparse parser there (``ServerArgs.add_cli_args``), walk ``parser._actions`` and write the
flag schema, plus notes on facts measured by running the real parser on probe argvs.

    python scripts/gen_dialects.py --versions 0.5.23 0.5.11 0.5.3.post3 --out sparkctl/sglang/dialects

Re-runnable: venvs are cached under ~/.cache/sparkctl/sglang-venvs/<version>; output is
deterministic for a given wheel.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkctl.testing.realparser import (  # noqa: E402
    RealParserError,
    dump_real_parser,
    ensure_sglang_venv,
    run_real_parser,
    venv_info,
)

HELP_MAX = 300
DEFAULT_VERSIONS = ["0.5.23", "0.5.11", "0.5.3.post3"]
# Help text that marks a flag deprecated without a Deprecated* action: it *starts* with the word
# (optionally after "(" or "NOTE:"), or says "<this option> is deprecated".
_DEPRECATED_HELP = re.compile(r"^\W*(note:\s*)?\(?deprecated\b", re.IGNORECASE)
# Probe argvs whose real outcome is recorded in the notes (after --model-path /m).
PROBES: list[tuple[str, list[str]]] = [
    ("DFLASH", ["--speculative-algorithm", "DFLASH"]),
    ("kv bf16", ["--kv-cache-dtype", "bf16"]),
    ("dsa backends", ["--dsa-prefill-backend", "tilelang", "--dsa-decode-backend", "tilelang"]),
    ("nsa backends", ["--nsa-prefill-backend", "tilelang", "--nsa-decode-backend", "tilelang"]),
    ("nsa (0.5.3 spelling)", ["--nsa-prefill", "tilelang", "--nsa-decode", "tilelang"]),
    ("cuda-graph-max-bs", ["--cuda-graph-max-bs", "8"]),
    ("mamba-scheduler-strategy", ["--mamba-scheduler-strategy", "auto"]),
    ("disable-cuda-graph", ["--disable-cuda-graph"]),
    ("max-total-tokens 128k", ["--max-total-tokens", "128k"]),
]


def flag_of(action: dict[str, Any]) -> dict[str, Any]:
    """One raw argparse action (from dump_real_parser) -> one dialect flag entry."""
    nargs, cls = action["nargs"], action["action"]
    if nargs == 0:
        kind = "store_false" if action["const"] is False else "store_true"
    elif nargs in ("+", "*") or (isinstance(nargs, int) and nargs > 1):
        kind = "list"
    else:
        kind = "value"
    help_text = " ".join(action["help"].split())
    deprecated, message = False, None
    if cls.startswith("Deprecated"):
        _effect, text = action["probe"]  # the effect (warn / parser.error / raise) goes to the notes
        deprecated, message = True, text or help_text or None
    elif _DEPRECATED_HELP.search(help_text) or any(f"{o} is deprecated" in help_text for o in action["options"]):
        deprecated, message = True, help_text
    return {
        "options": action["options"],
        "dest": action["dest"],
        "kind": kind,
        "type": "bool" if kind in ("store_true", "store_false") else _type_name(action["type"]),
        "choices": action["choices"],
        "default": action["default"],
        "deprecated": deprecated,
        "deprecation_message": _trim(message) if message else None,
        "help": _trim(help_text),
    }


def _type_name(name: str | None) -> str | None:
    """argparse `type=` callable name -> int|float|str|bool|json|None (None: unknown or plain str-like)."""
    if name is None:
        return None
    lowered = name.lower()
    if lowered == "loads":  # json.loads
        return "json"
    for word in ("json", "bool", "float", "int", "str"):
        if word in lowered:
            return word
    return None


def _trim(text: str) -> str:
    return text if len(text) <= HELP_MAX else text[: HELP_MAX - 3].rstrip() + "..."


def notes_for(version: str, flags: list[dict[str, Any]], dump: dict[str, Any]) -> list[str]:
    """Facts measured on this version's real parser (schema lookups and probe argvs)."""
    by_dest = {f["dest"]: f for f in flags}
    by_option = {o: f for f in flags for o in f["options"]}
    notes = []
    spec = by_dest.get("speculative_algorithm")
    if spec is not None:
        if spec["choices"] is None:
            notes.append("--speculative-algorithm has no choices (free-form, validated at resolution); "
                         f"help: {spec['help'][:160]}")
        else:
            notes.append(f"--speculative-algorithm choices: {spec['choices']} "
                         f"(DFLASH {'in' if 'DFLASH' in spec['choices'] else 'NOT in'} choices)")
    kv = by_dest.get("kv_cache_dtype")
    if kv is not None:
        notes.append(f"--kv-cache-dtype choices: {kv['choices']}, default {kv['default']!r}")
    for option in ("--dsa-prefill-backend", "--nsa-prefill-backend", "--nsa-prefill", "--cuda-graph-max-bs",
                   "--mamba-scheduler-strategy", "--mamba-radix-cache-strategy", "--disable-cuda-graph"):
        flag = by_option.get(option)
        if flag is None:
            notes.append(f"{option}: not registered")
        else:
            extra = f", choices {flag['choices']}" if flag["choices"] else ""
            dep = f", deprecated: {flag['deprecation_message']}" if flag["deprecated"] else ""
            notes.append(f"{option}: registered (dest {flag['dest']}{extra}{dep})")
    classes = sorted({a["action"] for a in dump["actions"] if a["action"].startswith("Deprecated")})
    effects = sorted({f"{a['action']} -> {a['probe'][0]}" for a in dump["actions"] if "probe" in a})
    notes.append(f"deprecation mechanism: argparse action classes {classes or 'none'}; "
                 f"effect when used: {effects or 'n/a'}; plus help text starting 'Deprecated'/'NOTE: ... deprecated'")
    for label, argv in PROBES:
        notes.append(f"real parse of {' '.join(argv)!r} ({label}): {_probe(version, argv)}")
    return notes


def _probe(version: str, argv: list[str]) -> str:
    try:
        result = run_real_parser(version, ["--model-path", "/m", *argv])
    except RealParserError as exc:
        return f"rejected: {exc.message}"
    warnings = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip() for ln in result.stderr.splitlines()
                if "deprecated" in ln.lower()]
    dests = {a.lstrip("-").replace("-", "_") for a in argv if a.startswith("--")}
    values = {k: v for k, v in result.values.items() if k in dests or any(k.startswith(d) for d in dests)}
    return "accepted" + (f", values {values}" if values else "") + (f", warning: {warnings[-1]}" if warnings else "")


def generate(version: str, out_dir: Path) -> Path:
    """Build/reuse the venv, dump the parser, write <out_dir>/<version>.json; return its path."""
    ensure_sglang_venv(version)
    info = venv_info(version) or {}
    dump = dump_real_parser(version)
    flags = sorted((flag_of(a) for a in dump["actions"]), key=lambda f: (f["dest"], f["options"]))
    doc = {
        "version": version,
        "generated_by": "scripts/gen_dialects.py",
        "source": f"sglang=={version} wheel from PyPI (sha256 of the wheel: {info.get('sha256', 'unknown')})",
        "notes": notes_for(version, flags, dump),
        "flags": flags,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{version}.json"
    path.write_text(_dumps(doc))
    return path


def _dumps(doc: dict[str, Any]) -> str:
    """JSON with one flag per line: small, and a version bump diffs flag by flag."""
    head = {k: v for k, v in doc.items() if k != "flags"}
    lines = json.dumps(head, indent=1, ensure_ascii=False)[:-2]
    flags = ",\n".join("  " + json.dumps(f, ensure_ascii=False) for f in doc["flags"])
    return f'{lines},\n "flags": [\n{flags}\n ]\n}}\n'


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--versions", nargs="+", default=DEFAULT_VERSIONS)
    cli.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "sparkctl/sglang/dialects")
    args = cli.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    for version in args.versions:
        path = generate(version, args.out)
        doc = json.loads(path.read_text())
        info = venv_info(version) or {}
        print(f"sglang=={version}: {len(doc['flags'])} flags, "
              f"{sum(f['deprecated'] for f in doc['flags'])} deprecated -> {path} "
              f"(venv built in {info.get('build_seconds', '?')}s; import deps: {', '.join(info.get('import_deps', []))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
