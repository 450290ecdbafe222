"""Run SGLang's *real* argument parser, from the released wheel, in a cached virtualenv.

Why: sparkctl renders `python3 -m sglang.launch_server ...` argv per SGLang version. The only
authority on whether an argv is valid for a version is that version's own parser, so contract
tests (and `scripts/gen_dialects.py`, which dumps the flag schema) run it for real, on a CPU-only
machine, without a GPU and without SGLang's heavy runtime dependencies.

How: one venv per version under ``~/.cache/sparkctl/sglang-venvs/<version>`` (override the root
with ``SPARKCTL_SGLANG_VENVS``) holding ``torch==2.13.0`` (CPU), ``sglang==X --no-deps`` and exactly
the packages that ``from sglang.srt.server_args import ServerArgs, prepare_server_args`` needs,
found by trial: import, read the ``ModuleNotFoundError``, install that package (pinned as the
wheel's METADATA pins it), repeat (IMPORT_DEPS seeds what the trials found, to save rounds).
``triton`` is a stub (nothing is compiled) unless torch itself needs the real one (0.5.11 and
0.5.3.post3 import transformers -> torch._dynamo -> triton.backends); ``torchvision`` is an inert
stub (PyPI's is a CUDA build that does not load against CPU torch). An flock (testrig.flock) serialises
builders; a marker file written last says the venv is complete. Measured here (2 cores): 65-105 s
per version with the seeds, 165-280 s by trial alone; 1.3 GB (0.5.23) to 2.3 GB (real triton).

Parsing calls ``prepare_server_args(argv)``: SGLang's own parser, ``--config`` merging and
``ServerArgs.from_cli_args``, with ``sys.argv[0]`` set as ``python3 -m sglang.launch_server`` sets
it. In 0.5.23 construction is unresolved (resolution is ``ServerArgs.resolve_once``), so it runs
unmodified. Before that (no ``resolve_once``) the dataclass ``__post_init__`` resolves defaults and
fails here with "RuntimeError: No accelerator (CUDA, XPU, HPU...) is available." (measured on
0.5.11 and 0.5.3.post3), so it is replaced by a no-op: the values returned are the parsed input.

Example::

    >>> parse_with_real_sglang("0.5.23", ["--model-path", "/m", "--tp-size", "2"])["tp_size"]
    2
"""
from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import queue
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.parser import Parser as _EmailParser
from pathlib import Path
from typing import Any
from zipfile import ZipFile

from sparkctl.errors import ConfigError, SparkctlError
from sparkctl.statefiles import write_json_atomic
from testrig.flock import exclusive

log = logging.getLogger("sparkctl")

TORCH_REQUIREMENT = "torch==2.13.0"  # a CPU wheel the machine's pip finds on local disk (/opt/wheels)
PYTHON = "python3.11"                # the sglang wheels are cp311
MARKER = ".sparkctl-ready.json"
LOCK_TIMEOUT_S = 1800.0
_MAX_TRIALS = 40
_RESULT_PREFIX = "@@SPARKCTL-REALPARSER@@"

# Packages found by trial to be needed by the import (installed up front to save trial rounds;
# the trial loop still covers anything a version needs beyond these).
IMPORT_DEPS: dict[str, tuple[str, ...]] = {
    # PyYAML: `--config FILE.yaml` imports it inside prepare_server_args (transformers requires it in a real
    # install; the import probe does not reach it)
    "0.5.23": ("numpy", "orjson", "psutil", "pybase64", "requests", "packaging", "pillow",
               "starlette", "msgspec", "pyzmq", "tqdm", "ipython", "pydantic", "aiohttp", "PyYAML"),
    "0.5.11": ("numpy", "orjson", "psutil", "pybase64", "requests", "packaging", "pillow", "starlette",
               "tqdm", "ipython", "pydantic", "aiohttp", "transformers", "pyzmq", "triton", "openai",
               "partial_json_parser", "dill", "sentencepiece"),
    # transformers 4.57.1 imports torch._dynamo, which needs the real triton (see REPLACEABLE_STUBS)
    "0.5.3.post3": ("numpy", "tqdm", "pybase64", "requests", "ipython", "pydantic", "aiohttp", "orjson",
                    "safetensors", "pyzmq", "fastapi", "packaging", "pillow", "openai", "partial_json_parser",
                    "huggingface_hub", "transformers", "triton", "sentencepiece"),
}
# import name -> distribution name, where they differ
_DIST_OF_MODULE = {"zmq": "pyzmq", "PIL": "pillow", "yaml": "PyYAML", "IPython": "ipython",
                   "google": "protobuf", "cv2": "opencv-python-headless", "pynvml": "nvidia-ml-py",
                   "sklearn": "scikit-learn", "dateutil": "python-dateutil", "jwt": "PyJWT",
                   "multipart": "python-multipart", "huggingface_hub": "huggingface-hub"}



# Stub packages: minimal modules that satisfy import-time use only, written into a venv's site-packages (path
# there -> file here). torchvision is the real-engine venv's inert package (testrig/realengine/stubs/: every
# attribute and submodule a placeholder class), one file for both venvs: 0.5.11 imports
# `torchvision.io.decode_jpeg` and transformers 5.x imports torchvision.transforms when it finds torchvision;
# PyPI's torchvision is a CUDA build whose C ops fail to load against the CPU torch ("operator torchvision::nms
# does not exist").
STUB_DIR = Path(__file__).parent / "stubs"
ENGINE_STUB_DIR = Path(__file__).resolve().parent.parent / "realengine" / "stubs"
STUBS: dict[str, dict[str, Path]] = {
    "triton": {"triton/__init__.py": STUB_DIR / "triton/__init__.py",
               "triton/language/__init__.py": STUB_DIR / "triton/language/__init__.py"},
    "torchvision": {"torchvision/__init__.py": ENGINE_STUB_DIR / "torchvision/__init__.py"},
}
# Stubs that give way to the real package when torch itself goes deeper into it: 0.5.11 and
# 0.5.3.post3 import transformers, which imports torch._dynamo, which imports triton.backends.compiler.
REPLACEABLE_STUBS = frozenset({"triton"})
# Releases that are not pinned by the sglang wheel (or must differ from its pin) and were found to
# import with the CPU torch 2.13.0.
KNOWN_GOOD = {"triton": "triton==3.9.0"}

_IMPORT_PROBE = "from sglang.srt.server_args import ServerArgs, prepare_server_args"


class RealParserUnavailable(SparkctlError):
    """The real-parser venv for a version cannot be built or used here (no network, no python3.11...)."""


class RealParserError(ConfigError):
    """SGLang's own parser rejected an argv. `stderr` is SGLang's full output, `message` its error line.

    `kind` is "argparse" (usage error, exit 2: unknown flag, bad choice, ambiguous option) or
    "exception" (SGLang raised while parsing, e.g. 0.5.3.post3's DeprecatedAction -> ValueError).
    """

    def __init__(self, message: str, *, version: str, argv: list[str], stderr: str, kind: str) -> None:
        super().__init__(message, where=f"sglang=={version}", evidence=_tail(stderr, 8))
        self.version, self.argv, self.stderr, self.kind = version, argv, stderr, kind


@dataclass(frozen=True)
class RealParse:
    """What SGLang's parser made of an argv: field values, the text it logged, and how it was run."""

    values: dict[str, Any]
    stderr: str
    method: str


def venvs_root() -> Path:
    """Where the per-version venvs live (``SPARKCTL_SGLANG_VENVS`` or ``~/.cache/sparkctl/sglang-venvs``)."""
    env = os.environ.get("SPARKCTL_SGLANG_VENVS")
    return Path(env) if env else Path.home() / ".cache" / "sparkctl" / "sglang-venvs"


def venv_info(version: str) -> dict[str, Any] | None:
    """The completion marker of a built venv (wheel sha256, packages, build time), or None."""
    marker = venvs_root() / version / MARKER
    return json.loads(marker.read_text()) if marker.is_file() else None


def ensure_sglang_venv(version: str) -> Path:
    """Build (once) or reuse the venv holding sglang==`version` and return its path.

    Idempotent and safe across processes: builders take ``<root>/<version>.lock``; a venv
    without its marker (an interrupted build) is deleted and rebuilt.
    Raises RealParserUnavailable with the reason when it cannot be built.
    """
    venv = venvs_root() / version
    if (venv / MARKER).is_file() and not _missing_seeds(version):
        return venv
    with build_lock(venv, f"the sglang=={version} venv"):
        if not (venv / MARKER).is_file():
            _build_venv(version, venv)
        elif _missing_seeds(version):
            _top_up(version, venv)
    return venv


@contextmanager
def build_lock(venv: Path, what: str) -> Iterator[None]:
    """Held while `venv` is built: ``<parent>/<name>.lock``, waited for up to LOCK_TIMEOUT_S."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    try:
        with exclusive(venv.parent / f"{venv.name}.lock", LOCK_TIMEOUT_S):
            yield
    except TimeoutError as exc:
        raise RealParserUnavailable(f"another process has been building {what} for over {LOCK_TIMEOUT_S:.0f}s",
                                    where=str(venv)) from exc


def cached_venv(venv: Path, what: str, requirements: list[str]) -> Path:
    """A plain venv at `venv` holding `requirements` (pip resolves the rest), built once as the sglang venvs are:
    under `build_lock`, an incomplete one (no marker) removed first, the marker (pip freeze, build seconds)
    written last. The caller keys `venv`'s name by everything that goes in (e.g. a version and a hash)."""
    if (venv / MARKER).is_file():
        return venv
    with build_lock(venv, what):
        if not (venv / MARKER).is_file():
            started = time.monotonic()
            if venv.exists():
                shutil.rmtree(venv)
            _run([shutil.which(PYTHON) or "python3", "-m", "venv", str(venv)], what="create the venv")
            vpy = str(venv / "bin" / "python")
            _pip(vpy, "install", *requirements)
            write_json_atomic(venv / MARKER, {"requirements": requirements, "build_seconds":
                                              round(time.monotonic() - started, 1), "pip_freeze":
                                              _run([vpy, "-m", "pip", "freeze", "--all"], what="pip freeze").split()})
    return venv


def _missing_seeds(version: str) -> list[str]:
    """IMPORT_DEPS of `version` a venv built before they were listed does not have (by its marker)."""
    have = {_norm(re.split(r"[=<>!~ ]", d, maxsplit=1)[0]) for d in (venv_info(version) or {}).get("import_deps", [])}
    return [d for d in IMPORT_DEPS.get(version, ()) if _norm(d) not in have]


def _top_up(version: str, venv: Path) -> None:
    """Install seeds added to IMPORT_DEPS since the venv was built, and record them in its marker."""
    missing = _missing_seeds(version)
    log.info("sglang==%s: adding %s to %s", version, ", ".join(missing), venv)
    _pip(str(venv / "bin" / "python"), "install", TORCH_REQUIREMENT, *(_requirement(d, {}) for d in missing))
    info = venv_info(version) or {}
    info["import_deps"] = list(info.get("import_deps", [])) + missing
    write_json_atomic(venv / MARKER, info)


def _build_venv(version: str, venv: Path) -> None:
    """Create the venv from scratch; the marker is written last, so a partial build is never used."""
    started = time.monotonic()
    if venv.exists():
        log.info("removing incomplete venv %s", venv)
        shutil.rmtree(venv)
    python = shutil.which(PYTHON)
    if python is None:
        raise RealParserUnavailable(f"{PYTHON} not found on PATH (SGLang wheels are cp311)",
                                    hint=f"install {PYTHON}")
    log.info("sglang==%s: creating venv %s", version, venv)
    _run([python, "-m", "venv", str(venv)], what="create the venv")
    vpy = str(venv / "bin" / "python")
    wheel_dir = venv / "wheel"
    log.info("sglang==%s: downloading the wheel", version)
    _pip(vpy, "download", "--no-deps", "-d", str(wheel_dir), f"sglang=={version}")
    wheel = next(wheel_dir.glob("sglang-*.whl"))
    sha256 = hashlib.sha256(wheel.read_bytes()).hexdigest()
    pins = _wheel_pins(wheel)
    log.info("sglang==%s: installing %s and the wheel (--no-deps)", version, TORCH_REQUIREMENT)
    _pip(vpy, "install", TORCH_REQUIREMENT)
    _pip(vpy, "install", "--no-deps", str(wheel))
    shutil.rmtree(wheel_dir)
    site = Path(_run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     what="locate site-packages").strip())
    stubs: list[str] = []
    seeds = IMPORT_DEPS.get(version, ())
    if "triton" not in seeds:
        _write_stub(site, "triton", stubs)  # every version imports it; others are stubbed when found missing
    installed = [_requirement(d, pins) for d in seeds]
    if installed:
        _pip(vpy, "install", TORCH_REQUIREMENT, *installed)
    for _ in range(_MAX_TRIALS):
        probe = subprocess.run([vpy, "-c", _IMPORT_PROBE], capture_output=True, text=True)
        if probe.returncode == 0:
            break
        missing = re.findall(r"No module named '([^']+)'", probe.stderr)
        last_lines = _tail(probe.stderr, 3)
        failing_stub = next((m for m in stubs if str(site / m) in last_lines), None)
        if not missing and failing_stub is None:
            raise RealParserUnavailable(f"sglang=={version} does not import in {venv}",
                                        evidence=_tail(probe.stderr, 15))
        module = failing_stub or missing[-1].split(".")[0]
        requirement = _requirement(_DIST_OF_MODULE.get(module, module), pins)
        if module in STUBS and module not in stubs and requirement not in installed:
            _write_stub(site, module, stubs)
            continue
        if module in stubs and module not in REPLACEABLE_STUBS:
            raise RealParserUnavailable(f"the {module} stub is not enough for sglang=={version}",
                                        evidence=_tail(probe.stderr, 15))
        if module in stubs:  # the stub is not enough: use the real one
            log.info("sglang==%s: the %s stub is not enough -> pip install %s", version, module, requirement)
            shutil.rmtree(site / module)
            stubs.remove(module)
            _pip(vpy, "install", TORCH_REQUIREMENT, requirement)
            installed.append(requirement)
            continue
        if requirement in installed:
            raise RealParserUnavailable(f"installing {requirement} did not provide module {module!r}",
                                        evidence=_tail(probe.stderr, 15))
        log.info("sglang==%s: import needs %r -> pip install %s", version, module, requirement)
        _pip(vpy, "install", TORCH_REQUIREMENT, requirement)  # never let a dependency swap torch
        installed.append(requirement)
    else:
        raise RealParserUnavailable(f"sglang=={version} still does not import after {_MAX_TRIALS} installs")
    info = {"version": version, "wheel": wheel.name, "sha256": sha256, "torch": TORCH_REQUIREMENT,
            "import_deps": installed, "stubs": stubs,
            "pip_freeze": _run([vpy, "-m", "pip", "freeze", "--all"], what="pip freeze").split(),
            "build_seconds": round(time.monotonic() - started, 1)}
    write_json_atomic(venv / MARKER, info)   # written last: a partial build has no marker
    log.info("sglang==%s: venv ready in %.0fs (import deps: %s)", version, info["build_seconds"],
             ", ".join(installed) or "none")


def _write_stub(site: Path, name: str, done: list[str]) -> None:
    for rel, source in STUBS[name].items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source.read_text(encoding="utf-8"))
    done.append(name)


def _wheel_pins(wheel: Path) -> dict[str, str]:
    """Normalised distribution name -> requirement string, from the wheel's unconditional Requires-Dist."""
    with ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = _EmailParser().parsestr(zf.read(meta_name).decode())
    pins = {}
    for req in meta.get_all("Requires-Dist") or []:
        if ";" in req:  # extras and platform markers: not for us
            continue
        name = re.match(r"[A-Za-z0-9_.\-]+", req.strip())
        if name:
            pins[_norm(name.group(0))] = req.strip().replace(" ", "")
    return pins


def _requirement(dist: str, pins: dict[str, str]) -> str:
    """What to pip install for a distribution: KNOWN_GOOD, else the wheel's own pin, else the latest."""
    return KNOWN_GOOD.get(_norm(dist)) or pins.get(_norm(dist), dist)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pip(vpy: str, *args: str) -> str:
    return _run([vpy, "-m", "pip", "--disable-pip-version-check", "-q", *args], what=f"pip {args[0]}")


def _run(argv: list[str], *, what: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RealParserUnavailable(f"could not {what}: {' '.join(argv[-3:])} exited {proc.returncode}",
                                    evidence=_tail(proc.stderr or proc.stdout, 15))
    return proc.stdout


def _tail(text: str, n: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


# --- running SGLang inside the venv -------------------------------------------------------------
# driver.py runs with the venv's python (as `python -c TEXT`, so nothing of sparkctl is on its path); it
# reads one JSON request on stdin and prints one JSON result line (prefixed: SGLang may print too).
DRIVER = Path(__file__).parent / "driver.py"
DRIVER_LOOP = Path(__file__).parent / "driverloop.py"   # appended to each engine's driver: one request loop



class _Server:
    """One driver per version in ``serve`` mode for the whole test session: SGLang (and torch) imported once, each
    request parsed in a child forked from that state (driver.py), so a parse costs a fork, not an import. vLLM's
    driver (vllm_driver.py, testrig.realparser.vllm) is run the same way."""

    def __init__(self, version: str, venv: Path, *, driver: Path = DRIVER, engine: str = "sglang",
                 env: dict[str, str] | None = None) -> None:
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
        self.version, self.venv, self.engine = version, venv, engine
        text = driver.read_text(encoding="utf-8") + "\n" + DRIVER_LOOP.read_text(encoding="utf-8")
        self.proc = subprocess.Popen([str(venv / "bin" / "python"), "-c", text,
                                      _RESULT_PREFIX, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr   # all three are pipes (above)
        self.stdin, self.stdout, stderr = self.proc.stdin, self.proc.stdout, self.proc.stderr
        self.replies: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(stderr), daemon=True).start()
        self.lock = threading.Lock()

    def _read(self) -> None:
        for line in self.stdout:
            if line.startswith(_RESULT_PREFIX):
                self.replies.put(line[len(_RESULT_PREFIX):])
        self.replies.put(None)

    def ask(self, request: dict[str, Any], timeout: float) -> tuple[str, str]:
        with self.lock:
            try:
                self.stdin.write(json.dumps(request) + "\n")
                self.stdin.flush()
                line = self.replies.get(timeout=timeout)
            except (OSError, queue.Empty):
                line = None
            if line is None:
                self.close()
                raise RealParserUnavailable(f"the {self.engine}=={self.version} driver stopped answering (exit "
                                            f"{self.proc.poll()})", where=str(self.venv),
                                            evidence=_tail("".join(self.stderr), 15))
            reply = json.loads(line)
            return reply["stdout"], reply["stderr"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


_SERVERS: dict[str, _Server] = {}
_SERVERS_LOCK = threading.Lock()


@atexit.register
def _close_servers() -> None:
    for server in list(_SERVERS.values()):
        server.close()


def _server(version: str) -> _Server:
    with _SERVERS_LOCK:
        server = _SERVERS.get(version)
        if server is None or server.proc.poll() is not None:
            server = _SERVERS[version] = _Server(version, ensure_sglang_venv(version))
        return server


def _drive(version: str, request: dict[str, Any], timeout: float = 300.0) -> tuple[dict[str, Any], str]:
    """Run one request through the version's driver; return (result JSON, stderr of that request)."""
    server = _server(version)
    stdout, stderr = server.ask(request, timeout)
    venv = server.venv
    lines = [ln for ln in stdout.splitlines() if ln.startswith(_RESULT_PREFIX)]
    if not lines:
        raise RealParserUnavailable(f"the sglang=={version} driver's parse ended without a result",
                                    where=str(venv), evidence=_tail(stderr, 15))
    result = json.loads(lines[-1][len(_RESULT_PREFIX):])
    if not result["ok"] and result["kind"] == "import":
        raise RealParserUnavailable(f"sglang=={version} does not import: {result['message']}",
                                    where=str(venv), evidence=_tail("".join(server.stderr) or stderr, 15))
    return result, stderr


def run_real_parser(version: str, argv: list[str]) -> RealParse:
    """Parse `argv` (what follows ``python3 -m sglang.launch_server``) with sglang==`version`'s parser.

    Raises RealParserError (SGLang's message) on rejection, RealParserUnavailable if no venv.
    """
    result, stderr = _drive(version, {"mode": "parse", "argv": list(argv)})
    if not result["ok"]:
        if result["kind"] == "argparse":
            errors = [ln for ln in stderr.splitlines() if ": error: " in ln]
            message = errors[-1] if errors else f"exited {result.get('code')}"
        else:
            message = result["message"]
        raise RealParserError(message, version=version, argv=list(argv), stderr=stderr, kind=result["kind"])
    return RealParse(values=result["values"], stderr=stderr, method=result["method"])


def parse_with_real_sglang(version: str, argv: list[str]) -> dict[str, Any]:
    """The ServerArgs field values SGLang `version` parses from `argv` (unresolved input, JSON-safe)."""
    return run_real_parser(version, argv).values


def dump_real_parser(version: str) -> dict[str, Any]:
    """Every argparse action SGLang `version` registers (raw, for scripts/gen_dialects.py).

    Deprecated* actions carry ``probe = [effect, message]``: what invoking them did
    ("warn", "parser.error" or "raise <Exception>") and the text they logged or raised.
    """
    result, _ = _drive(version, {"mode": "dump"})
    return result
