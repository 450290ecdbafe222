"""sparkctl command line: parse, call one library function, render the result.

Known errors (SparkctlError) print one clear message and exit with their code;
anything else writes its traceback to a debug log and says where.
"""
from __future__ import annotations

import logging
import os
import sys
import traceback
from pathlib import Path

import typer
from typer._click.exceptions import ClickException  # typer >= 0.26 carries its own click

from sparkctl.cli import (
    bench_cmds,
    deploy_cmds,
    doctor_cmds,
    image_cmds,
    prepare_cmds,
    render_cmds,
    signals,
    tune_cmds,
    watch_cmds,
)
from sparkctl.cli.options import EXIT_CODES, PlainFlagsGroup, flag, plain_flags
from sparkctl.errors import SparkctlError
from sparkctl.resources import version

app = typer.Typer(cls=PlainFlagsGroup, add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES,
                  help="Deploy SGLang across two DGX Sparks (TP=2), verify it, roll back, measure it.")


VERBOSE = ("-v", "--verbose")
QUIET = ("-q", "--quiet")


def _hoist_verbose(argv: list[str]) -> list[str]:
    """`-v` / `--verbose` and `-q` / `--quiet` anywhere before a `--` (e.g. `sparkctl up -v --profile d5`) moved
    in front of the subcommand, where the root options are parsed: no subcommand has a `-v` or `-q` of its own."""
    end = argv.index("--") if "--" in argv else len(argv)
    head = argv[:end]
    rest = [a for a in head if a not in VERBOSE + QUIET]
    lead = (["--verbose"] if any(a in VERBOSE for a in head) else []) + (["--quiet"] if any(a in QUIET for a in head)
                                                                         else [])
    return lead + rest + argv[end:]


def _version(value: bool) -> None:
    if value:
        print(f"sparkctl {version()}")
        raise typer.Exit(0)


@app.callback()
def _root(verbose: bool = flag(*VERBOSE[::-1], help="Log progress details to stderr (before or after the "
                                                      "subcommand)."),
          quiet: bool = flag(*QUIET[::-1], help="No progress lines or live display on stderr (errors and warnings "
                                                "still print; stdout is unchanged)."),
          _show_version: bool = typer.Option(False, "--version", help="Print sparkctl's version and exit.",
                                             is_eager=True, callback=_version, metavar="")) -> None:
    from sparkctl.deploy import progress
    progress.set_quiet(quiet)
    level = logging.INFO if verbose else (logging.ERROR if quiet else logging.WARNING)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


render_cmds.register(app)
deploy_cmds.register(app)
bench_cmds.register(app)
image_cmds.register(app)
prepare_cmds.register(app)
tune_cmds.register(app)
doctor_cmds.register(app)
watch_cmds.register(app)
plain_flags(app)


def _debug_log_path() -> Path:
    """Tracebacks of internal errors go to the state directory (private: 0700), never a shared /tmp file."""
    from sparkctl.statefiles import default_state_root
    return default_state_root() / "debug.log"


def _write_debug_log(text: str) -> Path:
    from sparkctl.statefiles import open_state_file, private_dir
    path = _debug_log_path()
    private_dir(path.parent)
    fd = open_state_file(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(path, 0o600)
    return path


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `sparkctl` console script (SIGTERM and SIGHUP handled like Ctrl-C: cli/signals.py). A
    signal outside the command's own handling (while the streams are set up or put back) ends it the same way."""
    try:
        with signals.installed():
            return _run(argv)
    except KeyboardInterrupt:
        print(f"sparkctl: interrupted ({signals.name()})", file=sys.stderr)
        return signals.exit_code()


def _run(argv: list[str] | None) -> int:
    """Run one command with stdout and stderr guarded: everything printed passes through the one sanitiser of
    untrusted text (sparkctl.untrusted.clean: control characters escaped, long lines cut, URL credentials masked),
    whoever prints it (the renderers, error messages, logging, progress lines)."""
    from sparkctl.deploy import progress
    from sparkctl.untrusted import GuardedStream
    saved = sys.stdout, sys.stderr
    # a stream the caller closed (`2>&-`) is None in Python, and print(file=None) writes to stdout: it becomes
    # /dev/null, so an error never lands in stdout (a script's JSON) and nothing fails writing to None
    sinks = [open(os.devnull, "w", encoding="utf-8") for s in saved if s is None]  # noqa: SIM115 - closed below
    spare = iter(sinks)
    sys.stdout, sys.stderr = (GuardedStream(s if s is not None else next(spare)) for s in saved)
    try:
        return _dispatch(argv)
    finally:
        progress.close_live()   # a live display on the terminal ends before the shell prompt comes back
        progress.set_quiet(False)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        sys.stdout, sys.stderr = saved
        for sink in sinks:
            sink.close()


# click's usage errors as typer carries them: ClickException in typer 0.26-0.28, a TyperException (its base) from
# 0.29; typer.TyperException does not exist before 0.29 (tests/install/test_typer_range.py runs both ends).
_USAGE_ERRORS: tuple[type[Exception], ...] = (ClickException, getattr(typer, "TyperException", ClickException))


def _dispatch(argv: list[str] | None) -> int:
    try:
        argv = _hoist_verbose(list(sys.argv[1:] if argv is None else argv))
        rv = app(args=argv, prog_name="sparkctl", standalone_mode=False)
        if rv == 130:  # typer turns Ctrl-C (any KeyboardInterrupt) into Exit(130) and, non-standalone, returns it
            print(f"sparkctl: interrupted ({signals.name()})", file=sys.stderr)
            return signals.exit_code()
        return rv if isinstance(rv, int) else 0
    except SparkctlError as exc:
        print(f"sparkctl: {exc.render()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"sparkctl: interrupted ({signals.name()})", file=sys.stderr)
        return signals.exit_code()
    except SystemExit as exc:  # typer/click exits (--help, usage errors) and explicit exits
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except Exception as exc:  # noqa: BLE001 - the one boundary that sorts unknown errors
        if _interrupt_in(exc):    # a signal the interpreter wrapped (during an import: "Error calling __set_name__")
            print(f"sparkctl: interrupted ({signals.name()})", file=sys.stderr)
            return signals.exit_code()
        if isinstance(exc, typer.Exit):
            return int(getattr(exc, "exit_code", 0) or 0)
        if isinstance(exc, typer.Abort):
            print("sparkctl: aborted", file=sys.stderr)
            return 1
        if isinstance(exc, _USAGE_ERRORS):          # usage errors: bad option, missing argument
            show = getattr(exc, "show", None)       # typer's click exceptions print the usage and "Error: ..."
            if callable(show):
                show()
            else:                                   # a bare TyperException has only its message
                print(f"Error: {getattr(exc, 'message', exc)}", file=sys.stderr)
            return int(getattr(exc, "exit_code", 2) or 2)
        if isinstance(exc, ModuleNotFoundError):   # an optional extra not installed, imported outside sparkctl/
            from sparkctl.extras import missing_extra
            known = missing_extra(exc, "this command")
            if known is not None:
                print(f"sparkctl: {known.render()}", file=sys.stderr)
                return known.exit_code
        try:
            where = f"traceback written to {_write_debug_log(traceback.format_exc())}"
        except (OSError, SparkctlError):
            where = "traceback could not be written"
        print(f"sparkctl: internal error: {type(exc).__name__}: {exc} ({where}); please report it", file=sys.stderr)
        return 70


def _interrupt_in(exc: BaseException) -> bool:
    """A KeyboardInterrupt (the CLI's `Interrupted`: Ctrl-C, SIGTERM, SIGHUP) anywhere in the exception's chain: the
    interpreter wraps one raised inside a class body's `__set_name__` (a dataclass field while a module imports) in
    a RuntimeError, and other wrappers may do the same. Such a run was interrupted, not an internal error."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
