"""The state directory full or read-only: a changing command refuses before any effect (exit 6, the threshold
and why), and nothing is left running. Needs root for a small tmpfs (skipped off-root, failed under CI=true)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sparkctl.statefiles import ROOM_BYTES
from testrig.testenv import need_root, small_tmpfs


@pytest.fixture
def small_state(tmp_path, local_cluster, monkeypatch):
    with small_tmpfs(tmp_path / "small", ROOM_BYTES // 2) as mnt:
        monkeypatch.setenv("SPARKCTL_STATE_DIR", str(mnt))
        yield mnt


def test_up_on_a_state_directory_without_room_refuses_before_changing_anything(cli, small_state):
    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
    assert code == 6 and "too little room" in err and "needs at least" in err, err   # seen, threshold, why
    assert "SPARKCTL_STATE_DIR" in err                     # the way out
    assert not list(small_state.rglob("deployments/*.json"))
    code, out, err = cli("status", "--json")               # read-only commands still answer
    assert code == 0 and json.loads(out)["active"] is None, err


def test_a_read_only_state_directory_is_exit_6_naming_it(cli, local_cluster, tmp_path, monkeypatch):
    with small_tmpfs(tmp_path / "ro", 64 * 2**20, read_only=True) as mnt:
        monkeypatch.setenv("SPARKCTL_STATE_DIR", str(mnt))
        code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
        assert code == 6 and "state directory" in err and str(mnt) in err, err
        assert "Traceback" not in err


def test_a_record_write_failing_mid_way_stops_the_new_engines_and_restores_without_the_ledger(
        cli, local_cluster, faulty_profile):
    """The deployment records become unwritable (a read-only bind mount over deployments/) while the new
    deployment boots: the next journal write fails, the new engines are stopped, the previous deployment comes
    back without a single ledger write, the exit is 6 with the journal's last line on stderr.

    (The engines' own logs and secret files live in the state directory too: a restore on a completely full
    file system needs the runtime to keep those elsewhere, see the report; the records are what this layer
    writes.)"""
    from sparkctl.config.inventory import load_inventory
    from sparkctl.state.ledger import Ledger
    from testrig.controller import SparkctlProcess

    need_root("a read-only bind mount over deployments/")
    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
    assert code == 0, err
    prev = json.loads(out)["deployment"]
    deployments = Ledger.for_cluster(load_inventory(local_cluster).cluster.name).root / "deployments"
    mounted = False
    try:
        with SparkctlProcess(["up", "--profile", faulty_profile({"boot_s": 1.5}, base="dflash-off"), "--yes"]) as run:
            run.wait_for(r"rank 0 started")
            subprocess.run(["mount", "--bind", str(deployments), str(deployments)], check=True)
            mounted = True
            subprocess.run(["mount", "-o", "remount,bind,ro", str(deployments)], check=True)
            code = run.wait()
        err = run.stderr
        assert code == 6, err
        assert "journal tail, kept in memory" in err and f"restored {prev}" in err and "Traceback" not in err, err
        code, out, err = cli("status", "--json")              # read-only: answers, and tells the truth
        st = json.loads(out)
        assert code in (0, 8) and st["active"] == prev and st["healthy"], out + err
        subprocess.run(["umount", str(deployments)], check=True)
        mounted = False
        code, out, err = cli("up", "--profile", "d5", "--yes", "--json")   # writable again: converges
        assert code == 0 and json.loads(out)["outcome"] == "unchanged", err
        code, out, err = cli("status")
        assert code == 0 and "healthy" in out, out
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(deployments)], check=False)


@pytest.fixture
def tmpfs_state(state_dir):
    """The test's state directory is a tmpfs with room for one deploy (`ROOM_BYTES` and 8 MiB more), mounted
    before `local_cluster` so the engines are stopped (through this ledger) before it is unmounted."""
    with small_tmpfs(state_dir, ROOM_BYTES + 8 * 2**20) as mnt:
        yield mnt


def _fill(directory: Path) -> Path:
    """Fill the file system holding `directory` to the last byte (ENOSPC); the filler's path."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (2**20, 4096, 1):
            block = b"\0" * chunk
            try:
                while True:
                    os.write(fd, block)
            except OSError as exc:
                assert exc.errno == 28, exc     # ENOSPC
    finally:
        os.close(fd)
    assert os.statvfs(directory).f_bavail == 0
    return filler


def test_the_state_directory_filling_up_mid_up_restores_the_previous_deployment_serving(
        cli, tmpfs_state, local_cluster, faulty_profile):
    """The state directory's tmpfs fills to the last byte once the new ranks started: the new engines' log lines
    are dropped (the engines live on), the journal's next write fails, the new engines are stopped and the previous
    deployment comes back serving without the disk: readiness by rank 0's /health when the log cannot grow,
    exit 6, the journal tail on stderr. Freed again, the next `up` converges."""
    from sparkctl.sglang.client import SGLangClient
    from testrig.controller import SparkctlProcess

    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
    assert code == 0, err
    first = json.loads(out)
    prev, endpoint = first["deployment"], first["endpoint"]
    with SparkctlProcess(["up", "--profile", faulty_profile({"boot_s": 3}, base="dflash-off"), "--yes",
                          "--boot-timeout", "60"]) as run:
        run.wait_for(r"rank 0 started")
        filler = _fill(tmpfs_state)
        code = run.wait()
    err = run.stderr
    assert code == 6, err
    assert "journal tail, kept in memory" in err and f"restored {prev}" in err, err
    restoring = err.index(f"restoring {prev}")
    assert "ready by /health" in err[restoring:] and "Traceback" not in err, err   # the restore, without the log
    with SGLangClient(endpoint, api_key=os.environ.get("SPARKCTL_API_KEY"), timeout=5) as client:   # serving, disk full
        assert client.health() == 200
        assert client.server_info().get("speculative_algorithm") not in (None, "", "NONE")   # d5's, not dflash-off
    code, out, err = cli("status", "--json")                       # read-only: answers, tells the truth
    st = json.loads(out)
    assert code in (0, 8) and st["active"] == prev and st["healthy"], out + err
    filler.unlink()
    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")   # room again: converges
    assert code == 0 and json.loads(out)["outcome"] == "unchanged", err
    code, out, err = cli("status")
    assert code == 0 and "healthy" in out, out
