"""Two kinds of paths, two kinds of text (style point 17).

A path the user names (``bench history --chart``, ``bench --out``, tune's winner profile) is written as given
(sparkctl.userfiles): its directory is never chmod-ed, a directory, a symlink or an existing file is refused
with its name unless ``--force``. The state directory is sparkctl's: a root of another user and a planted
symlink are refused naming the path and the owner. Text from outside passes through one sanitiser
(sparkctl.untrusted.clean) before a terminal or a card; URL credentials are masked everywhere.
"""
from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest

from sparkctl.untrusted import LINE_LIMIT, clean, mask_url_credentials

REPO = Path(__file__).resolve().parents[2]
LOCAL = str(REPO / "inventory" / "local.yml")
CONTROL = [chr(c) for c in list(range(0x00, 0x09)) + list(range(0x0b, 0x20)) + list(range(0x7f, 0xa0))]


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def _no_control(text: str) -> None:
    bad = sorted({hex(ord(c)) for c in text if c in CONTROL})
    assert not bad, f"control characters reached the output: {bad}"


def card(run_id: str = "20250101T000000Z-bench-d5-0001", profile: str = "d5", started: str = "2025-01-01T00:00:00Z",
         **extra: object) -> dict:
    s = {"n": 3, "median": 10.0, "min": 9.0, "max": 11.0, "spread": 0.2, "samples": [9.0, 10.0, 11.0]}
    return {"schema": "sparkctl.bench/1", "run_id": run_id, "mode": "endpoint", "status": "successful",
            "started": started, "arms": [{"config": {"role": "ON", "profile": profile},
                                          "results": {"decode": {"classes": {"code": {"decode_tok_s": s}}}}}],
            **extra}


def put_card(state: Path, data: dict, run_dir: str | None = None) -> Path:
    d = state / "local" / "runs" / (run_dir or str(data.get("run_id")))
    d.mkdir(parents=True, exist_ok=True)
    (d / "report.json").write_text(json.dumps(data))
    return d / "report.json"


# ------------------------------------------------------------------------------------------ the sanitiser

def test_clean_escapes_controls_bounds_lines_and_masks_url_credentials():
    assert clean("a\x1b[2Jb\x07\x9b\r\u202e") == "a\\x1b[2Jb\\x07\\x9b\\x0d\\u202e"
    assert clean("two\nlines\tkept") == "two\nlines\tkept"
    long = clean("x" * 100_000)
    assert len(long) < 2 * 1024 + 100 and "characters cut" in long
    assert mask_url_credentials("GET http://user:pw@127.0.0.1:9/x failed") == "GET http://user:***@127.0.0.1:9/x failed"
    assert mask_url_credentials("https://tok@h/") == "https://***@h/"
    assert mask_url_credentials("ssh://root@spark-a") == "ssh://root@spark-a"       # a user name is no secret
    assert mask_url_credentials("http://h:8080/a@b") == "http://h:8080/a@b"


def test_the_cli_guards_everything_it_prints(cli, state_dir, monkeypatch):
    """Whatever prints (an error message here, from a profile name the user typed), stdout and stderr get it
    through the sanitiser: the escape sequence arrives inert, a long name as an excerpt."""
    code, out, err = cli("render", "--profile", "\x1b]0;owned\x07" + "y" * 10_000, "-i", LOCAL)
    assert code == 2
    _no_control(out + err)
    assert "\\x1b]0;owned\\x07" in err and max(len(line) for line in err.splitlines()) <= LINE_LIMIT + 40


# ------------------------------------------------------------------------------------------ user-named paths

@pytest.fixture
def one_card(state_dir: Path) -> Path:
    return put_card(state_dir, card())


def test_chart_into_a_1777_directory_leaves_its_mode(cli, one_card, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    code, out, err = cli("bench", "history", "--chart", str(shared / "x.svg"), "-i", LOCAL)
    assert code == 0, err
    assert _mode(shared) == 0o1777 and (shared / "x.svg").read_text().startswith("<svg")
    # refused (exists), and still the directory's mode untouched
    code, out, err = cli("bench", "history", "--chart", str(shared / "x.svg"), "-i", LOCAL)
    assert code == 2 and f"--chart {shared / 'x.svg'}: exists" in err and "--force" in err
    assert _mode(shared) == 0o1777
    os.chmod(shared / "x.svg", 0o644)
    code, out, err = cli("bench", "history", "--chart", str(shared / "x.svg"), "--force", "-i", LOCAL)
    assert code == 0, err
    assert _mode(shared) == 0o1777 and _mode(shared / "x.svg") == 0o644     # a replaced file keeps its mode


def test_chart_at_a_directory_or_a_symlink_is_refused_with_its_name(cli, one_card, tmp_path):
    d = tmp_path / "somedir"
    d.mkdir()
    os.chmod(d, 0o755)
    code, out, err = cli("bench", "history", "--chart", str(d), "-i", LOCAL)
    assert code == 2 and f"--chart {d}: is a directory" in err
    assert _mode(d) == 0o755 and list(d.iterdir()) == []
    target = tmp_path / "victim"
    target.write_text("keep")
    link = tmp_path / "link.svg"
    link.symlink_to(target)
    code, out, err = cli("bench", "history", "--chart", str(link), "-i", LOCAL)
    assert code == 2 and f"--chart {link}: is a symlink" in err
    assert target.read_text() == "keep"
    code, out, err = cli("bench", "history", "--chart", str(tmp_path / "missing" / "x.svg"), "-i", LOCAL)
    assert code == 2 and "does not exist" in err and not (tmp_path / "missing").exists()


def test_chart_into_an_unwritable_directory_is_refused_with_its_name(cli, one_card, tmp_path, monkeypatch):
    d = tmp_path / "ro"
    d.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, **kw: False if Path(p) == d else real(p, m, **kw))
    code, out, err = cli("bench", "history", "--chart", str(d / "x.svg"), "-i", LOCAL)
    assert code == 2 and f"--chart {d / 'x.svg'}: is not writable" in err


def test_bench_out_is_written_as_given_and_a_card_there_is_not_replaced_without_force(cli, state_dir, tmp_path):
    log = tmp_path / "sched.log"
    log.write_text("")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    os.chmod(out_dir, 0o1777)
    code, out, err = cli("bench", "--log", str(log), "--log-only", "--out", str(out_dir), "-i", LOCAL)
    assert code == 0, err
    assert _mode(out_dir) == 0o1777 and (out_dir / "report.json").is_file()
    code, out, err = cli("bench", "--log", str(log), "--log-only", "--out", str(out_dir), "-i", LOCAL)
    assert code == 2 and f"--out {out_dir / 'report.json'}: exists" in err
    code, out, err = cli("bench", "--log", str(log), "--log-only", "--out", str(out_dir), "--force", "-i", LOCAL)
    assert code == 0, err
    assert _mode(out_dir) == 0o1777


def test_tuned_profile_directory_is_never_tightened(tmp_path, monkeypatch):
    from sparkctl.errors import OutputPathError
    from sparkctl.tune import space
    from sparkctl.userfiles import check_user_target, write_user_text
    prof = tmp_path / "profiles"
    prof.mkdir()
    os.chmod(prof, 0o1777)
    monkeypatch.setenv("SPARKCTL_PROFILES_DIR", str(prof))
    path = space.winner_path("d5", "20250101T000000Z-tune-d5-abcd")
    assert path == prof / "d5-tuned-20250101t000000z.yml"
    write_user_text(path, "extends: d5\n", overwrite=False, option=space.WINNER_WHERE, create_parent=True)
    assert _mode(prof) == 0o1777
    with pytest.raises(OutputPathError, match="exists"):
        check_user_target(path, overwrite=False, option=space.WINNER_WHERE, create_parent=True)
    assert _mode(prof) == 0o1777


# ------------------------------------------------------------------------------------------ the state directory

def test_a_state_root_of_another_user_is_refused_naming_path_and_owner(cli, state_dir, one_card):
    os.chown(state_dir, 65534, 65534)
    try:
        code, out, err = cli("bench", "history", "-i", LOCAL)
    finally:
        os.chown(state_dir, os.getuid(), os.getgid())
    assert code == 6 and str(state_dir) in err and "uid 65534" in err


def test_a_planted_cluster_symlink_is_refused_naming_path_and_owner(cli, state_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chmod(elsewhere, 0o755)
    state_dir.mkdir()
    (state_dir / "local").symlink_to(elsewhere)
    code, out, err = cli("bench", "history", "-i", LOCAL)
    assert code == 6 and str(state_dir / "local") in err and "symlink" in err and f"uid {os.getuid()}" in err
    assert _mode(elsewhere) == 0o755 and list(elsewhere.iterdir()) == []


def test_a_planted_router_log_symlink_is_never_read(state_dir, tmp_path):
    from sparkctl.errors import StateDirError
    from sparkctl.nodes.process import read_lines
    secret = tmp_path / "secret"
    secret.write_text("root:hash\n")
    logs = state_dir / "local" / "logs"
    logs.mkdir(parents=True)
    (logs / "router.log").symlink_to(secret)
    with pytest.raises(StateDirError) as exc:
        read_lines(logs / "router.log", 0)
    assert str(logs / "router.log") in exc.value.render() and "uid" in exc.value.render()


def test_state_dir_writes_refuse_a_foreign_subdirectory(state_dir):
    from sparkctl.errors import StateDirError
    from sparkctl.statefiles import write_json_atomic
    runs = state_dir / "local" / "runs"
    runs.mkdir(parents=True)
    os.chmod(runs, 0o777)
    os.chown(runs, 65534, 65534)
    with pytest.raises(StateDirError, match="uid 65534"):
        write_json_atomic(runs / "x" / "report.json", {})
    assert _mode(runs) == 0o777


# ------------------------------------------------------------------------------------------ URL credentials

def test_endpoint_password_never_shows_in_output_files_or_card(cli, state_dir, tmp_path):
    with socket.socket() as s:                  # a port nothing listens on: the run fails, the card is written
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out_dir = tmp_path / "out"
    url = f"http://user:hunter2pw@127.0.0.1:{port}"
    code, out, err = cli("-v", "bench", "--endpoint", url, "--gates", "decode", "--runs", "1", "--warmup", "0",
                         "--connect-timeout", "1", "--out", str(out_dir), "-i", LOCAL)
    assert code in (4, 7), err
    assert "hunter2pw" not in out + err
    written = list(out_dir.iterdir()) + [p for p in state_dir.rglob("*") if p.is_file()]
    assert written
    for p in written:
        assert b"hunter2pw" not in p.read_bytes(), p
    assert "user:***@127.0.0.1" in (out_dir / "report.json").read_text()
