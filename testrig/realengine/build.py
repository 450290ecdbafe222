"""Build one real-engine directory: the venv (pinned, offline-capable), the stubs, the tiny models.

Why a separate module: its source is one of the key's inputs (a change to how the venv is built
rebuilds it); the API in __init__ is not.

Layout of ``<root>/<key>/``: ``venv/``, ``models/{target,drafter-eagle,drafter-dflash}/``, and
``ready.json`` (the marker), written last.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
REQUIREMENTS = HERE / "requirements.txt"
MAKE_MODEL = HERE / "make_model.py"
STUBS = HERE / "stubs"          # package dirs copied as-is into the venv's site-packages
SGLANG = "sglang==0.5.23"
TORCH = "torch==2.13.0"         # the machine's local CPU wheel (pip finds it on disk; PyPI's is CUDA)
PYTHON = "python3.11"           # that torch wheel is cp311
MARKER = "ready.json"
MODELS = ("target", "drafter-eagle", "drafter-dflash")
# What every process of the engine (and the model generator) runs with: no hub, CPU engine.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "SGLANG_USE_CPU_ENGINE": "1", "TOKENIZERS_PARALLELISM": "false"}


class BuildError(RuntimeError):
    """A step of the build failed; the message carries the command and the tail of its output."""


def key_inputs() -> list[Path]:
    """Every file whose bytes decide what a build produces."""
    return [REQUIREMENTS, MAKE_MODEL, Path(__file__), *sorted(p for p in STUBS.rglob("*.py"))]


def python_version(python: str = PYTHON) -> str:
    exe = shutil.which(python)
    if exe is None:
        raise BuildError(f"{python} not found on PATH (the local CPU torch wheel is cp311)")
    return run([exe, "-c", "import sys; print(sys.version.split()[0])"], what="read the python version").strip()


def build(dest: Path) -> dict:
    """Build into ``dest`` (deleted first if present) and return the marker's content (not yet written)."""
    started = time.monotonic()
    if dest.exists():
        shutil.rmtree(dest)
    venv = dest / "venv"
    run([shutil.which(PYTHON) or PYTHON, "-m", "venv", str(venv)], what="create the venv")
    py = str(venv / "bin" / "python")
    pip(py, "install", TORCH, "-r", str(REQUIREMENTS))
    pip(py, "install", "--no-deps", SGLANG)
    site = Path(run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    what="locate site-packages").strip())
    for pkg in sorted(p for p in STUBS.iterdir() if p.is_dir()):
        shutil.copytree(pkg, site / pkg.name, ignore=shutil.ignore_patterns("__pycache__"))
    run([py, "-c", "import sglang.launch_server"], what="import sglang.launch_server", env=OFFLINE_ENV)
    venv_seconds = time.monotonic() - started
    models = dest / "models"
    t0 = time.monotonic()
    run([py, str(MAKE_MODEL), str(models)], what="generate the models", env=OFFLINE_ENV)
    model_seconds = time.monotonic() - t0
    return {"sglang": SGLANG, "torch": TORCH, "python": python_version(py),
            "venv_bytes": tree_bytes(venv), "venv_seconds": round(venv_seconds, 1),
            "model_seconds": round(model_seconds, 1), "build_seconds": round(time.monotonic() - started, 1),
            "models": {m: file_hashes(models / m) for m in MODELS},
            "pip_freeze": run([py, "-m", "pip", "freeze", "--all"], what="pip freeze").split()}


def file_hashes(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


def tree_bytes(d: Path) -> int:
    return sum(p.lstat().st_size for p in d.rglob("*") if p.is_file() and not p.is_symlink())


def pip(py: str, *args: str) -> str:
    return run([py, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q", *args], what=f"pip {args[0]}")


def run(argv: list[str], *, what: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).rstrip().splitlines()[-15:])
        raise BuildError(f"could not {what}: `{' '.join(argv)}` exited {proc.returncode}\n{tail}")
    return proc.stdout


def write_marker(dest: Path, info: dict) -> None:
    """Atomically: a reader sees no marker or a whole one."""
    tmp = dest / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, dest / MARKER)


if __name__ == "__main__":  # pragma: no cover - debugging aid: build into a given dir, no lock, no key
    print(json.dumps(build(Path(sys.argv[1])), indent=2))
