"""Secrets on the embedded cluster: the API key and HF token reach the engine from 0400 files on tmpfs and appear
in no process argv or environment, no log sparkctl saves or prints, and no ledger file; the files go with their
engine; state modes are private."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.nodes import procfs
from sparkctl.nodes.process import secrets_root_for
from sparkctl.state.ledger import Ledger
from testrig.handles import process_handle, process_handles

API_KEY = "sk-test-9f8e7d6c5b4a"
HF_TOKEN = "hf_TESTtoken0123456789"


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKCTL_API_KEY", API_KEY)
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)


def _pids_of(handles) -> list[int]:
    """The recorded processes and their children (the engine under sparkctl.nodes.logpipe)."""
    out = []
    for h in handles:
        out.append(h.pid)
        children = Path(f"/proc/{h.pid}/task/{h.pid}/children")
        if children.exists():
            out += [int(p) for p in children.read_text().split()]
    return out


def _files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_api_key_and_hf_token_stay_out_of_argv_env_logs_and_ledger(cli, local_cluster, state_dir, secret_env):
    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
    assert code == 0, err
    dep = json.loads(out)["deployment"]
    ledger = Ledger.for_cluster(load_inventory(local_cluster).cluster.name)
    rec = ledger.load(dep)
    pids = _pids_of(rec.handles)
    assert len(pids) == 4                                   # logpipe + engine per rank
    for pid in pids:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode()
        assert API_KEY not in cmdline and HF_TOKEN not in cmdline
        assert HF_TOKEN not in environ and f"HF_TOKEN={HF_TOKEN}" not in environ
    engine0 = _pids_of([rec.handle_of(0)])[1]
    engine_cmd = Path(f"/proc/{engine0}/cmdline").read_bytes().split(b"\0")
    assert b"--config" in engine_cmd and b"--api-key" not in engine_cmd
    # The engine enforces the key it read from the file (401 without it); sparkctl's gates passed with it.
    import httpx
    endpoint = json.loads(cli("status", "--json")[1])["endpoint"]
    assert httpx.get(f"{endpoint}/v1/models", timeout=5).status_code == 401
    assert httpx.get(f"{endpoint}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"},
                     timeout=5).status_code == 200
    # The secret files: on tmpfs, 0400 in a 0700 directory, none under the state directory; HF_TOKEN_PATH names
    # the token file.
    sdir = secrets_root_for(ledger.root / "secrets") / dep / "rank0"
    assert procfs.fs_type(sdir) == "tmpfs" and not (ledger.root / "secrets").exists()
    assert stat.S_IMODE(sdir.stat().st_mode) == 0o700
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in sdir.iterdir()} == \
        {"engine-secrets.yaml": 0o400, "hf-token": 0o400}
    assert (sdir / "hf-token").read_text() == HF_TOKEN
    engine0_environ = Path(f"/proc/{engine0}/environ").read_bytes().decode().split("\0")
    assert f"HF_TOKEN_PATH={sdir / 'hf-token'}" in engine0_environ
    # The engine printed its server_args (api_key='...') into the log: redacted there and in `sparkctl logs`.
    log_text = Path(process_handle(rec, 0).log).read_text()
    assert "server_args={" in log_text and "'api_key': '***'" in log_text    # 0.5.23's dict form
    code, logs_out, err = cli("logs", "--rank", "0", "--tail", "0")
    assert code == 0 and "'api_key': '***'" in logs_out
    code, status_out, _ = cli("status", "--json")
    code, render_out, _ = cli("render", "--profile", "d5", "--json")
    for text in (out, logs_out, status_out, render_out, *(p.read_text(errors="replace")
                                                          for p in _files_under(state_dir))):
        assert API_KEY not in text and HF_TOKEN not in text
    assert cli("down", "--yes")[0] == 0
    assert not sdir.exists() and not sdir.parent.exists()


def test_state_directories_are_0700_and_files_0600(cli, local_cluster, state_dir):
    state_dir.mkdir(mode=0o755)
    os.chmod(state_dir, 0o755)
    code, _, err = cli("up", "--profile", "d5", "--yes")
    assert code == 0, err
    assert "warning" in err and str(state_dir) in err and "0755" in err     # the root: warned, not changed
    cluster_root = Ledger.for_cluster(load_inventory(local_cluster).cluster.name).root
    for path in [cluster_root, *cluster_root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_dir():
            assert mode == 0o700, path
        else:
            assert mode & 0o077 == 0, (path, oct(mode))
    assert cli("down", "--yes")[0] == 0


def test_secret_files_of_engines_killed_with_kill_9_are_gone_after_down(cli, local_cluster, state_dir, secret_env):
    import signal
    import time

    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
    assert code == 0, err
    dep = json.loads(out)["deployment"]
    ledger = Ledger.for_cluster(load_inventory(local_cluster).cluster.name)
    rec = ledger.load(dep)
    sroot = secrets_root_for(ledger.root / "secrets")
    pids = _pids_of(rec.handles)
    for h in process_handles(rec):
        os.kill(h.pid, signal.SIGKILL)          # the pipes; their engines follow (PR_SET_PDEATHSIG)
    deadline = time.monotonic() + 20
    while any(procfs.running(p, None) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(procfs.running(p, None) for p in pids)
    assert (sroot / dep / "rank0" / "hf-token").exists()        # nobody was left to remove them
    assert cli("down", "--yes")[0] == 0
    assert not (sroot / dep).exists()
