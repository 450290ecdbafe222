"""Lifecycle fixtures: `local_cluster` (tests/conftest.py) plus a profile that carries emulator faults."""
from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def faulty_profile(tmp_path: Path, profiles_dir: Path):
    """A profile 'faulty' = BASE + an emulator fault config carried in the profile's env.

    The fault travels with this deployment's engines only (SPARKCTL_SIM_CONFIG in the rank env), so the
    deployment a rollback restores boots clean, as on a real cluster.
    """
    def make(config: dict, base: str = "d5", extra: str = "") -> str:
        path = tmp_path / "sim-faults.json"
        path.write_text(json.dumps(config))
        (profiles_dir / "faulty.yml").write_text(f"extends: {base}\nenv: {{SPARKCTL_SIM_CONFIG: '{path}'}}\n{extra}")
        return "faulty"
    return make
