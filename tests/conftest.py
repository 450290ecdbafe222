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
