"""CLI: ``python -m testrig.realengine build`` (build if needed, print JSON) or ``path`` (never builds).

``--engine vllm`` does the same for the vLLM environment (vllm_build.py) instead of SGLang's.
``path`` exits 3, printing the command that builds it, when the environment is not built: a script
or preflight can tell "not built" from a failure (1) without parsing text.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from testrig.realengine import (
    RealEngine,
    RealEngineUnavailable,
    RealVllm,
    ensure_real_engine,
    ensure_real_vllm,
    find_real_engine,
    find_real_vllm,
    missing_message,
    vllm_missing_message,
)

EXIT_NOT_BUILT = 3


def _as_json(engine: RealEngine, **extra: object) -> str:
    info = engine.info()
    return json.dumps({"python": str(engine.python), "model": str(engine.model), "drafter": str(engine.drafter),
                       "drafter_dflash": str(engine.drafter_dflash), "key": engine.key, "root": str(engine.root),
                       "env": engine.env(), "venv_bytes": info.get("venv_bytes"),
                       "build_seconds": info.get("build_seconds"), "model_seconds": info.get("model_seconds"),
                       **extra}, indent=2)


def _vllm_as_json(engine: RealVllm, **extra: object) -> str:
    info = engine.info()
    return json.dumps({"python": str(engine.python), "vllm": str(engine.vllm), "version": engine.version,
                       "key": engine.key, "root": str(engine.root), "env": engine.env(),
                       "left_out": info.get("left_out"), "venv_bytes": info.get("venv_bytes"),
                       "build_seconds": info.get("build_seconds"), **extra}, indent=2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testrig.realengine", description=__doc__)
    parser.add_argument("command", choices=["build", "path"])
    parser.add_argument("--engine", choices=["sglang", "vllm"], default="sglang")
    args = parser.parse_args(argv)
    vllm = args.engine == "vllm"
    if args.command == "path":
        found = find_real_vllm() if vllm else find_real_engine()
        if found is None:
            print(vllm_missing_message() if vllm else missing_message(), file=sys.stderr)
            return EXIT_NOT_BUILT
        print(_vllm_as_json(found) if isinstance(found, RealVllm) else _as_json(found))
        return 0
    started = time.monotonic()
    try:
        built = ensure_real_vllm() if vllm else ensure_real_engine()
    except RealEngineUnavailable as exc:
        print(f"real-engine build failed ({args.engine}): {exc}", file=sys.stderr)
        return 1
    seconds = round(time.monotonic() - started, 1)
    print(_vllm_as_json(built, seconds_this_call=seconds) if isinstance(built, RealVllm)
          else _as_json(built, seconds_this_call=seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
