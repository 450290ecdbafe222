"""sparkctl.nodes.logpipe: the process runtime's engine output reaches its log redacted; exit status passes
through; a killed logpipe takes its engine with it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = ("import sys, time; print(\"server_args=ServerArgs(api_key='unknown-k', port=1)\"); "
          "print('token hf_tok-123 and key sk-abc', flush=True); sys.stderr.write('err line\\n'); ")


def _pipe(tmp_path: Path, code: str) -> subprocess.Popen:
    sdir = tmp_path / "secrets"
    sdir.mkdir(mode=0o700)
    (sdir / "hf-token").write_text("hf_tok-123")
    (sdir / "engine-secrets.yaml").write_text("api-key: sk-abc\n")
    return subprocess.Popen([sys.executable, "-m", "sparkctl.nodes.logpipe", str(tmp_path / "rank0.log"), str(sdir),
                             "--", sys.executable, "-c", code], start_new_session=True)


def test_output_is_redacted_and_the_exit_code_passes_through(tmp_path):
    proc = _pipe(tmp_path, SCRIPT + "sys.exit(3)")
    assert proc.wait(timeout=30) == 3
    log = tmp_path / "rank0.log"
    assert log.read_text().splitlines() == ["server_args=ServerArgs(api_key='***', port=1)",
                                            "token *** and key ***", "err line"]
    assert oct(log.stat().st_mode & 0o777) == oct(0o600)


def test_sigterm_to_the_group_ends_the_engine_and_the_pipe_the_same_way(tmp_path):
    proc = _pipe(tmp_path, SCRIPT + "time.sleep(60)")
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM


def test_a_killed_logpipe_takes_its_engine_along(tmp_path):
    marker = tmp_path / "child.pid"
    proc = _pipe(tmp_path, f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)")
    deadline = time.monotonic() + 20
    while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(marker.read_text())
    proc.kill()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or \
        Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
