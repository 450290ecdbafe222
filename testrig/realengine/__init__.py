"""The real SGLang 0.5.23 server, runnable on this CPU-only machine, with tiny generated models.

Why: sparkctl's tests mostly run against emulated engines; a differential test needs the real one.
Real SGLang boots here on the CPU (see shared/reference/real-engine.md) given a venv built by hand
around the local CPU torch wheel, two stubs (torchvision, sgl_kernel) and a model made locally.
This package makes that venv and those models reproducibly, once, and says where they are.

How: ``ensure_real_engine()`` builds ``<root>/<key>/`` on first use (root: ``SPARKCTL_REAL_ENGINE_ROOT``
or ``~/.cache/sparkctl/real-engine``). The key is a sha256 over every input (requirements.txt, the
stubs, make_model.py, build.py, the python version), so changing an input builds a new directory.
An flock on ``<root>/<key>.lock`` serialises builders across processes; ``ready.json`` is written last, so a directory
without it is an interrupted build and is rebuilt. The CLI: ``python -m testrig.realengine build|path``.

Run the server with ``RealEngine.env()`` added to the environment (CPU engine, no hub).

Measured here (2 cores, 2026-12-03): cold build 121 s with no pip cache (venv 117 s, models 2 s), 2.8 GB;
0.25 s when built. TP=1 /health 200 after 25-30 s, ~2.0 GB RSS over its 3 processes; TP=2 on two loopback
"nodes" 36-58 s, ~2.1 GB + 1.5 GB. Speculative decoding does not run on this CPU: see SPECULATIVE.md.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from testrig.flock import exclusive
from testrig.realengine import build as _build

BUILD_COMMAND = "python3 -m testrig.realengine build"
LOCK_TIMEOUT_S = 1800.0   # a cold build takes ~2 min here; a waiter gives up after this


@dataclass(frozen=True)
class RealEngine:
    """A built environment: the venv's python and the model directories (all under ``root``)."""

    python: Path
    model: Path
    drafter: Path | None     # EAGLE-format drafter (Qwen2ForCausalLMEagle, 1 layer) for --speculative-draft-model-path
    key: str
    root: Path
    # DFLASH-format drafter (DFlashDraftModel, 1 layer), laid out from reading SGLang's dflash.py: unverified,
    # since SGLang refuses DFLASH on CPU (SPECULATIVE.md)
    drafter_dflash: Path | None = None

    def env(self) -> dict[str, str]:
        """Environment the server must run with (CPU engine, no hub); add SGLANG_CPU_OMP_THREADS_BIND per rank."""
        return dict(_build.OFFLINE_ENV)

    def info(self) -> dict:
        """The marker: versions, sizes, build seconds, sha256 of every model file, pip freeze."""
        return json.loads((self.root / _build.MARKER).read_text(encoding="utf-8"))


class RealEngineUnavailable(RuntimeError):
    """The environment is not built (``path``) or could not be built (``ensure_real_engine``)."""


def engines_root() -> Path:
    env = os.environ.get("SPARKCTL_REAL_ENGINE_ROOT")
    return Path(env) if env else Path.home() / ".cache" / "sparkctl" / "real-engine"


def key() -> str:
    """sha256 (16 hex digits) over every build input and the base python's version."""
    h = hashlib.sha256()
    for path in _build.key_inputs():
        h.update(path.relative_to(_build.HERE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(_build.python_version().encode())
    return h.hexdigest()[:16]


def missing_message() -> str:
    """What to run to build it (sparkctl's preflight prints this)."""
    return (f"the real-engine environment (SGLang 0.5.23 on CPU + tiny models) is not built; build it with:\n"
            f"  cd {_repo_root()} && {BUILD_COMMAND}\n"
            f"(about 2 minutes and 3 GB under {engines_root()}; needs python3.11 and the PyPI registry)")


def find_real_engine(*, with_drafter: bool = True) -> RealEngine | None:
    """The built environment for the current inputs, or None; never builds."""
    k = key()
    root = engines_root() / k
    return _engine(root, k, with_drafter) if (root / _build.MARKER).is_file() else None


def ensure_real_engine(*, with_drafter: bool = True) -> RealEngine:
    """The environment for the current inputs, built first if needed (safe across processes).

    ``with_drafter=False`` leaves the drafter fields None (they are built either way: ~1 s).
    """
    k = key()
    root = engines_root() / k
    if not (root / _build.MARKER).is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            with exclusive(root.parent / f"{k}.lock", LOCK_TIMEOUT_S, poll_s=1.0):
                if not (root / _build.MARKER).is_file():   # another process may have built it meanwhile
                    info = _build.build(root)
                    info["key"] = k
                    _build.write_marker(root, info)
        except TimeoutError as exc:
            raise RealEngineUnavailable(f"another process has held {root}.lock for over {LOCK_TIMEOUT_S:.0f}s") from exc
        except _build.BuildError as exc:
            raise RealEngineUnavailable(str(exc)) from exc
    _point_current(root)
    return _engine(root, k, with_drafter)


def _point_current(root: Path) -> None:
    """``<engines root>/current`` -> the newest complete build (relative link, replaced atomically): what the
    shipped inventory/local-sglang.yml names, so a user's inventory need not know the key."""
    link = root.parent / "current"
    try:
        if os.readlink(link) == root.name:
            return
    except OSError:
        pass
    tmp = root.parent / f".current.{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        os.symlink(root.name, tmp)
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)


def _engine(root: Path, k: str, with_drafter: bool) -> RealEngine:
    models = root / "models"
    return RealEngine(python=root / "venv" / "bin" / "python", model=models / "target",
                      drafter=models / "drafter-eagle" if with_drafter else None, key=k, root=root,
                      drafter_dflash=models / "drafter-dflash" if with_drafter else None)


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]

