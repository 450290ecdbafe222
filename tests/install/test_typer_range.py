"""Issue 31 item 8: usage errors and help are text under every typer (and so every click: typer carries its own
from 0.26) that pyproject.toml allows, tested at both ends of the range.

Per end, a venv with sparkctl's base dependencies (no extras) and that typer, built once and cached under
``~/.cache/sparkctl/cli-venvs/typer-<version>-<hash of the requirements>`` by the sglang venvs' builder
(`testrig.realparser.cached_venv`: a lock, the marker written last). sparkctl runs from the checkout (PYTHONPATH);
`python -m testrig.usage_cases` runs every generated usage case there and reports what is wrong with its text.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from hashlib import sha256
from pathlib import Path

import pytest

from testrig.realparser import cached_venv

REPO = Path(__file__).resolve().parents[2]
# both ends of pyproject.toml's typer range (test_the_ends_are_the_pinned_range holds them to it)
TYPERS = ("0.26.0", "0.29.2")


def _base_requirements(typer: str) -> list[str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    return [f"typer=={typer}" if re.match(r"typer\b", d) else d for d in deps]


def _typer_spec() -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    return next(d for d in deps if re.match(r"typer\b", d))


def cli_venv(typer: str) -> Path:
    reqs = _base_requirements(typer)
    key = sha256("\n".join(reqs).encode()).hexdigest()[:12]
    root = Path.home() / ".cache" / "sparkctl" / "cli-venvs"
    return cached_venv(root / f"typer-{typer}-{key}", f"the typer=={typer} venv", reqs)


def test_the_ends_are_the_pinned_range():
    spec = _typer_spec()
    low = re.search(r">=\s*([\d.]+)", spec)
    high = re.search(r"<\s*([\d.]+)", spec)
    assert low and high, f"pyproject.toml's {spec!r}: pin a range (>=LOW,<HIGH) and test both ends"
    lowest, newest = TYPERS

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split("."))
    assert key(lowest)[:len(key(low.group(1)))] == key(low.group(1)), (lowest, spec)
    assert key(newest) < key(high.group(1)), (newest, spec)


@pytest.mark.parametrize("typer", TYPERS)
def test_usage_errors_are_text_under_each_typer_of_the_range(typer, tmp_path):
    venv = cli_venv(typer)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKCTL_", "PYTHON", "VIRTUAL_ENV"))}
    env |= {"PYTHONPATH": str(REPO), "HOME": str(tmp_path), "SPARKCTL_STATE_DIR": str(tmp_path / "state")}
    res = subprocess.run([str(venv / "bin" / "python"), "-m", "testrig.usage_cases"], capture_output=True,
                         text=True, timeout=300, env=env, cwd=REPO, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["typer"] == typer
    assert report["cases"] >= 100, report["cases"]
    assert report["problems"] == {}, json.dumps(report["problems"], indent=1)[:6000]
