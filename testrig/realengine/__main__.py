"""CLI: ``python -m testrig.realengine build`` (build if needed, print JSON) or ``path`` (never builds).

``path`` exits 3, printing the command that builds it, when the environment is not built: a script
or preflight can tell "not built" from a failure (1) without parsing text.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from testrig.realengine import RealEngine, RealEngineUnavailable, ensure_real_engine, find_real_engine, missing_message

EXIT_NOT_BUILT = 3


def _as_json(engine: RealEngine, **extra: object) -> str:
    info = engine.info()
    return json.dumps({"python": str(engine.python), "model": str(engine.model), "drafter": str(engine.drafter),
                       "drafter_dflash": str(engine.drafter_dflash), "key": engine.key, "root": str(engine.root),
                       "env": engine.env(), "venv_bytes": info.get("venv_bytes"),
                       "build_seconds": info.get("build_seconds"), "model_seconds": info.get("model_seconds"),
                       **extra}, indent=2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testrig.realengine", description=__doc__)
    parser.add_argument("command", choices=["build", "path"])
    args = parser.parse_args(argv)
    if args.command == "path":
        engine = find_real_engine()
        if engine is None:
            print(missing_message(), file=sys.stderr)
            return EXIT_NOT_BUILT
        print(_as_json(engine))
        return 0
    started = time.monotonic()
    try:
        engine = ensure_real_engine()
    except RealEngineUnavailable as exc:
        print(f"real-engine build failed: {exc}", file=sys.stderr)
        return 1
    print(_as_json(engine, seconds_this_call=round(time.monotonic() - started, 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
