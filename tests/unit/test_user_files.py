"""Every command that writes a file for the user writes it through the one writer (sparkctl.userfiles), and so
behaves the same at its target, generated over (each command) x (a symlink planted at the target, an existing file
without --force, an existing file with --force, a directory this user cannot write, a new file):

* a symlink is never written through: refused without --force (its target untouched), replaced by a regular file
  with it (its target still untouched);
* an existing file is never replaced without --force (exit 2 naming the option, the path and --force); with it,
  replaced keeping the user's mode;
* an unwritable directory is refused naming the path; a new file is created 0600 (it holds a deployment's details
  or the user's logs); the directory's mode is never changed.

Tune's winner profile goes through the same writer (tests/unit/test_outputs_and_text.py); its path carries the
run's id, so it cannot be planted before the run and is not in this matrix.
"""
from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCAL = str(REPO / "inventory" / "local.yml")


def _card(state: Path) -> None:
    s = {"n": 3, "median": 10.0, "min": 9.0, "max": 11.0, "spread": 0.2, "samples": [9.0, 10.0, 11.0]}
    run_id = "20250101T000000Z-bench-d5-0001"
    d = state / "local" / "runs" / run_id
    d.mkdir(parents=True)
    (d / "report.json").write_text(json.dumps({
        "schema": "sparkctl.bench/1", "run_id": run_id, "mode": "endpoint", "status": "successful",
        "started": "2025-01-01T00:00:00Z",
        "arms": [{"config": {"role": "ON", "profile": "d5"},
                  "results": {"decode": {"classes": {"code": {"decode_tok_s": s}}}}}]}))


# command -> (option named in its refusals, argv for a target directory D, the file it writes in D)
Command = tuple[str, Callable[[Path, Path], list[str]], str]
COMMANDS: dict[str, Command] = {
    "doctor --bundle": ("--bundle", lambda d, log: ["doctor", "--log", str(log), "--bundle", str(d / "b.json")],
                        "b.json"),
    "watch --install": ("--install", lambda d, log: ["watch", "--install", "--unit-dir", str(d), "-i", LOCAL],
                        "sparkctl-watch-local.service"),
    "bench --out": ("--out", lambda d, log: ["bench", "--log", str(log), "--log-only", "--out", str(d), "-i", LOCAL],
                    "report.json"),
    "bench history --chart": ("--chart", lambda d, log: ["bench", "history", "--chart", str(d / "c.svg"), "-i",
                                                         LOCAL], "c.svg"),
}
CASES = ["symlink", "symlink --force", "existing", "existing --force", "unwritable directory", "new file"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_user_file_goes_through_the_one_writer(cli, state_dir, tmp_path, monkeypatch, command, case):
    option, argv_of, name = COMMANDS[command]
    _card(state_dir)
    log = tmp_path / "sched.log"
    log.write_text("")
    d = tmp_path / "target"
    d.mkdir()
    os.chmod(d, 0o1777)
    target = d / name
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.chmod(victim, 0o644)
    if case.startswith("symlink"):
        target.symlink_to(victim)
    elif case.startswith("existing"):
        target.write_text("the user's own")
        os.chmod(target, 0o640)
    elif case == "unwritable directory":
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, m, **kw: False if Path(p) == d and m & os.W_OK
                            else real(p, m, **kw))          # root here: the denial a non-root user gets
    argv = argv_of(d, log) + (["--force"] if case.endswith("--force") else [])
    code, out, err = cli(*argv)
    assert _mode(d) == 0o1777                                      # the user's directory is never changed
    assert victim.read_text() == "keep" and _mode(victim) == 0o644  # nothing is written through a link
    if case == "symlink":
        assert code == 2 and f"{option} {target}: is a symlink" in err and "--force" in err, err
        assert target.is_symlink()
    elif case == "existing":
        assert code == 2 and f"{option} {target}: exists" in err and "--force" in err, err
        assert target.read_text() == "the user's own"
    elif case == "unwritable directory":
        assert code == 2 and f"{option} {target}: is not writable" in err, err
        assert not target.exists()
    else:
        assert code in (0, 8), err                                  # doctor: 8 = a signature found (none here)
        assert target.is_file() and not target.is_symlink() and target.read_text() != "the user's own"
        assert _mode(target) == (0o640 if case == "existing --force" else 0o600)


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)
