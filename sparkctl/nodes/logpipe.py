"""Run an engine with its output redacted into a log file: ``python -m sparkctl.nodes.logpipe LOG SECRETS_DIR -- CMD``.

The process runtime's engine log lives in sparkctl's state directory, and SGLang (like the emulator) prints its
``server_args=ServerArgs(..., api_key='KEY', ...)`` at start-up. So the engine does not write the file itself:
this small parent reads its stdout+stderr line by line, passes each line through `sparkctl.sglang.launch.redact`
(the values of the rank's secret files, plus the ``api_key='...'`` pattern) and appends it to LOG (0600).

It is the process the runtime records (same session and process group as the engine): SIGTERM/SIGINT/SIGHUP
reach the engine through the group and this parent keeps draining until the engine exits, then exits the same
way (same code, or the same signal); if this parent is killed, the kernel kills the engine (PR_SET_PDEATHSIG).
Secret values are read from SECRETS_DIR (never from argv or env).
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from sparkctl.sglang.launch import redact

_PR_SET_PDEATHSIG = 1


def secret_values(directory: Path) -> set[str]:
    """Every secret value held in `directory`: YAML files' scalar values, other files' stripped content."""
    out: set[str] = set()
    if not directory.is_dir():
        return out
    for path in directory.iterdir():
        text = path.read_text(encoding="utf-8")
        if path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
            out.update(str(v) for v in (data.values() if isinstance(data, dict) else []) if v not in (None, ""))
        elif text.strip():
            out.add(text.strip())
    return out


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the engine may outlive a killed parent
        pass


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: python -m sparkctl.nodes.logpipe LOG SECRETS_DIR -- CMD...", file=sys.stderr)
        return 2
    log_path, secrets = Path(argv[0]), secret_values(Path(argv[1]))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)     # a handler (not SIG_IGN): the engine gets default dispositions
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "wb", buffering=0) as log:
        proc = subprocess.Popen(argv[3:], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent)
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, b""):
            text = line.decode("utf-8", "surrogateescape")
            log.write(redact(text, secrets).encode("utf-8", "surrogateescape"))
        code = proc.wait()
    if code < 0:                                 # killed by a signal: end the same way
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
