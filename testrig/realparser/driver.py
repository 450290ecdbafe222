"""The real-parser driver: runs with a version's venv python (it never imports sparkctl).

Reads one JSON request on stdin ({"mode": "dump"} or {"mode": "parse", "argv": [...]}) and prints one JSON
result line prefixed with argv[1] (SGLang may print to stdout too).
"""
import argparse, dataclasses, io, json, logging, re, sys, traceback
PREFIX = sys.argv[1]
req = json.load(sys.stdin)
def emit(obj):
    print(PREFIX + json.dumps(obj, default=repr))
try:
    from sglang.srt import server_args as sa
except BaseException as exc:
    traceback.print_exc(); emit({"ok": False, "kind": "import", "message": repr(exc)}); sys.exit(0)
SA = sa.ServerArgs
def field_names():
    if hasattr(SA, "__struct_fields__"): return list(SA.__struct_fields__)
    return [f.name for f in dataclasses.fields(SA)]
def plain(v):
    try: json.dumps(v); return v
    except (TypeError, ValueError): pass
    if isinstance(v, (set, frozenset)): return sorted((plain(x) for x in v), key=repr)  # stable output
    if isinstance(v, (list, tuple)): return [plain(x) for x in v]
    if isinstance(v, dict): return {str(k): plain(x) for k, x in v.items()}
    if hasattr(v, "value"): return plain(v.value)
    return repr(v)

def probe_deprecated(parser, action):
    """Invoke a Deprecated* action once and capture what it says: warning, parser error or raise."""
    buf = io.StringIO(); handler = logging.StreamHandler(buf); logging.getLogger().addHandler(handler)
    class _Err(Exception): pass
    def error(message): raise _Err(message)
    real_error, parser.error = parser.error, error
    nargs = action.nargs
    value = [] if nargs == 0 else (list(action.choices)[0] if action.choices else "x")
    if nargs in ("+", "*") : value = [value]
    effect, text = "warn", ""
    try:
        action(parser, argparse.Namespace(), value, action.option_strings[0])
    except _Err as exc: effect, text = "parser.error", str(exc)
    except Exception as exc: effect, text = "raise " + type(exc).__name__, str(exc)
    finally:
        parser.error = real_error; logging.getLogger().removeHandler(handler)
    text = text or buf.getvalue()
    return effect, re.sub(r"\x1b\[[0-9;]*m", "", text).strip() or None

def dump():
    parser = argparse.ArgumentParser()
    SA.add_cli_args(parser)
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction): continue
        t = a.type
        rec = {"options": list(a.option_strings), "dest": a.dest, "action": type(a).__name__,
               "nargs": a.nargs, "const": plain(a.const), "type": None if t is None else getattr(t, "__name__", repr(t)),
               "choices": None if a.choices is None else [str(c) for c in plain(a.choices)],
               "default": plain(None if a.default is argparse.SUPPRESS else a.default),
               "help": a.help or "", "required": a.required}
        if type(a).__name__.startswith("Deprecated"):
            rec["probe"] = probe_deprecated(parser, a)
        out.append(rec)
    return {"ok": True, "actions": out, "fields": field_names(), "version": getattr(__import__("sglang"), "__version__", None)}

def parse(argv):
    # as `python3 -m sglang.launch_server ARGV` sees it (argparse's default prog is argv[0]'s basename)
    import importlib.util
    sys.argv = [importlib.util.find_spec("sglang.launch_server").origin] + list(argv)
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
        return {"ok": False, "kind": "exception", "message": "%s: %s" % (type(exc).__name__, exc)}
    return {"ok": True, "method": method, "values": {n: plain(getattr(args, n, None)) for n in field_names()}}

emit(dump() if req["mode"] == "dump" else parse(req["argv"]))
