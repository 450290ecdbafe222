"""Shared test helpers: run the CLI in-process, write throwaway profiles and inventories."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run `sparkctl ARGS` in-process; returns (exit code, stdout, stderr)."""
    from sparkctl.cli.main import main

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err
    return run


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "state"
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(path))
    return path


@pytest.fixture
def profiles_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A profiles directory searched before the shipped one; shipped profiles still resolve for extends."""
    path = tmp_path / "profiles"
    path.mkdir()
    monkeypatch.setenv("SPARKCTL_PROFILES_DIR", str(path))
    return path


FAST_SIM = {"boot_s": 0.4, "decode_tps": 4000, "peer_timeout_s": 2}


@pytest.fixture
def local_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path):
    """An embedded two-rank cluster on fresh loopback addresses with a fast emulator; yields its inventory path.

    Every engine the test started is stopped at teardown through the ledger (never by name).
    """
    import os

    from testrig.embedded import stop_recorded_engines, write_embedded_inventory

    inv = write_embedded_inventory(tmp_path / "inventory.yml", FAST_SIM)
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(inv))
    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    yield inv
    stop_recorded_engines(inv)
