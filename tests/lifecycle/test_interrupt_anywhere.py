"""Ctrl-C at any line of a command: the CLI says "interrupted" and exits 130, never an internal error.

A signal can land anywhere once the CLI's handlers are in place, including inside a module the command imports
lazily; there the interpreter may wrap it (a dataclass field's `__set_name__` raising it becomes "RuntimeError:
Error calling __set_name__", which once made a Ctrl-C 0.4 s into `sparkctl up` an internal error, exit 70).
Generated with `testrig.linetrap` in a fresh interpreter per point (so the lazy imports happen each time): the
command's line events inside sparkctl/ are counted once, then `Interrupted` (what the handler raises for SIGINT) is
raised right before each of N points spread evenly over them. Every point must end with exit 130 and the one
"sparkctl: interrupted (SIGINT)" line, no traceback, nothing swallowed (a command that finished anyway would
exit 0: the interrupt was lost).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from testrig.embedded import write_embedded_inventory

ROOT = Path(__file__).resolve().parents[2]
DRIVER = """
import dataclasses
import sys
from sparkctl.cli.main import main
from testrig.linetrap import LineTrap, Target
at = None if sys.argv[1] == "none" else int(sys.argv[1])
ours = Target(lambda c: "/sparkctl/" in c.co_filename and not c.co_filename.endswith("/cli/signals.py"))
if sys.argv[2] == "set_name":       # inside a dataclass field's __set_name__, while a sparkctl module imports
    ours = Target.code(dataclasses.Field.__set_name__.__code__)
trap = LineTrap([ours], at=at, anchor=Target.named("_run", "/sparkctl/cli/main.py"))
with trap.armed():
    code = main(sys.argv[3:])
print(f"TRAP seen={trap.seen} where={trap.where}", file=sys.stderr)
sys.exit(code)
"""
COMMANDS = {"up --dry-run": (["up", "--profile", "d5", "--dry-run"], 20), "status": (["status"], 8)}


def _run(env: dict[str, str], at: int | None, argv: list[str], where: str = "sparkctl"
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", DRIVER, "none" if at is None else str(at), where, *argv],
                          env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)


def _failed(res: subprocess.CompletedProcess[str]) -> bool:
    said = "sparkctl: interrupted (SIGINT)" in res.stderr
    return res.returncode != 130 or not said or "Traceback" in res.stderr or "internal error" in res.stderr


def _env(tmp_path: Path) -> dict[str, str]:
    inv = write_embedded_inventory(tmp_path / "inventory.yml", {"boot_s": 0.3})
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCTL_")}
    env.update(SPARKCTL_STATE_DIR=str(tmp_path / "state"), SPARKCTL_INVENTORY=str(inv), PYTHONPATH=str(ROOT))
    return env


@pytest.mark.parametrize("command", list(COMMANDS))
def test_ctrl_c_at_any_line_of_a_command_is_an_interrupt(command, tmp_path):
    argv, points = COMMANDS[command]
    env = _env(tmp_path)
    clean = _run(env, None, argv)
    assert clean.returncode == 0, clean.stderr[-3000:]
    total = int(re.search(r"TRAP seen=(\d+)", clean.stderr).group(1))      # type: ignore[union-attr]
    assert total > 1000, clean.stderr[-2000:]              # the command's lazy imports are traced too
    bad = []
    for at in (total * i // points for i in range(points)):
        res = _run(env, at, argv)
        where = re.search(r"TRAP seen=\d+ where=(\S*)", res.stderr)
        if _failed(res):
            bad.append((at, where.group(1) if where else "?", res.returncode, res.stderr[-600:]))
    assert not bad, "\n".join(f"event {at} ({w}): exit {code}\n{err}" for at, w, code, err in bad)


def test_ctrl_c_inside_a_dataclass_field_of_a_lazily_imported_module_is_an_interrupt(tmp_path):
    """The case the sampling above may miss: the interpreter wraps the interrupt in a RuntimeError."""
    env = _env(tmp_path)
    clean = _run(env, None, COMMANDS["up --dry-run"][0], "set_name")
    seen = re.search(r"TRAP seen=(\d+)", clean.stderr)
    assert clean.returncode == 0 and seen and int(seen.group(1)) > 0, clean.stderr[-2000:]
    res = _run(env, 0, COMMANDS["up --dry-run"][0], "set_name")
    assert not _failed(res), f"exit {res.returncode}\n{res.stderr[-2000:]}"
