"""`python3 -m sglang.launch_server ARGV` -> `sparkctl.sim.engine.main(ARGV)` (test image only).

The emulator is imported lazily so a missing emulator gives one clear line and exit status 2,
while an import error *inside* the emulator still shows its traceback.
"""
from __future__ import annotations

import sys

_EMULATOR = "sparkctl.sim.engine"


def main(argv: list[str] | None = None) -> int:
    """Run the sparkctl SGLang emulator with SGLang's own argv; return its exit status."""
    args = sys.argv[1:] if argv is None else argv
    try:
        from sparkctl.sim.engine import main as engine_main
    except ModuleNotFoundError as exc:
        if exc.name not in (_EMULATOR, "sparkctl.sim", "sparkctl"):
            raise
        print(f"sglang shim: the sparkctl emulator ({_EMULATOR}) is not installed in this image; "
              "this is the sparkctl test engine image, not real SGLang", file=sys.stderr)
        return 2
    result = engine_main(args)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
