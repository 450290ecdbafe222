"""The real-parser driver: runs with a version's venv python (it never imports sparkctl).

One request is {"mode": "dump"} or {"mode": "parse", "argv": [...]}; its answer is one JSON result line prefixed
with argv[1] (SGLang may print to stdout too).

* ``driver PREFIX``: one request on stdin, its answer on stdout, exit.
* ``driver PREFIX serve``: SGLang is imported once (torch with it: most of a parse's cost), then one request per
  stdin line, each run in a child forked from the imported state, so no parse sees what another changed (a
  patched ServerArgs, the environment, argparse globals). Per request one stdout line: ``PREFIX`` + JSON
  ``{"stdout": ..., "stderr": ...}`` of that child (the answer line is in its stdout).
"""
import argparse
import dataclasses
import io
import json
import logging
import re
import sys
import traceback

PREFIX = sys.argv[1]
SERVE = sys.argv[2:] == ["serve"]
req = None if SERVE else json.load(sys.stdin)


def emit(obj):
    print(PREFIX + json.dumps(obj, default=repr))


IMPORT_ERROR = None
try:
    from sglang.srt import server_args as sa
    SA = sa.ServerArgs
except BaseException as exc:
    traceback.print_exc()
    IMPORT_ERROR = repr(exc)
    if not SERVE:
        emit({"ok": False, "kind": "import", "message": IMPORT_ERROR})
        sys.exit(0)


def field_names():
    if hasattr(SA, "__struct_fields__"):
        return list(SA.__struct_fields__)
    return [f.name for f in dataclasses.fields(SA)]


def plain(v):
    try:
        json.dumps(v)
        return v
    except (TypeError, ValueError):
        pass
    if isinstance(v, (set, frozenset)):
        return sorted((plain(x) for x in v), key=repr)  # stable output
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if hasattr(v, "value"):
        return plain(v.value)
    return repr(v)


def probe_deprecated(parser, action):
    """Invoke a Deprecated* action once and capture what it says: warning, parser error or raise."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logging.getLogger().addHandler(handler)

    class _Err(Exception):
        pass

    def error(message):
        raise _Err(message)
    real_error, parser.error = parser.error, error
    nargs = action.nargs
    value = [] if nargs == 0 else (list(action.choices)[0] if action.choices else "x")
    if nargs in ("+", "*"):
        value = [value]
    effect, text = "warn", ""
    try:
        action(parser, argparse.Namespace(), value, action.option_strings[0])
    except _Err as exc:
        effect, text = "parser.error", str(exc)
    except Exception as exc:
        effect, text = "raise " + type(exc).__name__, str(exc)
    finally:
        parser.error = real_error
        logging.getLogger().removeHandler(handler)
    text = text or buf.getvalue()
    return effect, re.sub(r"\x1b\[[0-9;]*m", "", text).strip() or None


def dump():
    parser = argparse.ArgumentParser()
    SA.add_cli_args(parser)
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        t = a.type
        rec = {"options": list(a.option_strings), "dest": a.dest, "action": type(a).__name__,
               "nargs": a.nargs, "const": plain(a.const),
               "type": None if t is None else getattr(t, "__name__", repr(t)),
               "choices": None if a.choices is None else [str(c) for c in plain(a.choices)],
               "default": plain(None if a.default is argparse.SUPPRESS else a.default),
               "help": a.help or "", "required": a.required}
        if type(a).__name__.startswith("Deprecated"):
            rec["probe"] = probe_deprecated(parser, a)
        out.append(rec)
    return {"ok": True, "actions": out, "fields": field_names(),
            "version": getattr(__import__("sglang"), "__version__", None)}


def parse(argv):
    # as `python3 -m sglang.launch_server ARGV` sees it (argparse's default prog is argv[0]'s basename)
    import importlib.util
    spec = importlib.util.find_spec("sglang.launch_server")
    assert spec is not None and spec.origin is not None, "sglang.launch_server has no source file"
    sys.argv = [spec.origin, *argv]
    method = "prepare_server_args"
    if not hasattr(SA, "resolve_once"):
        SA.__post_init__ = lambda self: None
        method += " (ServerArgs.__post_init__ skipped)"
    try:
        args = sa.prepare_server_args(argv)
    except SystemExit as exc:
        return {"ok": False, "kind": "argparse", "code": exc.code}
    except Exception as exc:
        traceback.print_exc()
        return {"ok": False, "kind": "exception", "message": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "method": method, "values": {n: plain(getattr(args, n, None)) for n in field_names()}}


def answer(request):
    if IMPORT_ERROR is not None:
        return {"ok": False, "kind": "import", "message": IMPORT_ERROR}
    return dump() if request["mode"] == "dump" else parse(request["argv"])


# The request loop (serve mode) and the one-shot run: driverloop.py, appended to this text by the runner
# (testrig.realparser._Server), shared with the other engine's driver.
