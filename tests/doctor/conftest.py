"""Doctor fixtures: a profile carrying emulator faults, as tests/lifecycle/conftest.py makes it (the fault travels
in the profile's env, so only that deployment's engines fail)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def faulty_profile(tmp_path: Path, profiles_dir: Path):
    def make(config: dict, base: str = "d5") -> str:
        path = tmp_path / "sim-faults.json"
        path.write_text(json.dumps(config))
        (profiles_dir / "faulty.yml").write_text(f"extends: {base}\nenv: {{SPARKCTL_SIM_CONFIG: '{path}'}}\n")
        return "faulty"
    return make
