"""Patch series (``patches/<series>/``): find them, fetch the released SGLang wheel they target, check them.

``check_series("gb10-0.5.23")`` downloads (once; cached in ``~/.cache/sparkctl/wheels``) the released SGLang
wheel of the series' version, unpacks its ``sglang/`` package in a temporary directory, applies every patch
with the same applier the engine image build runs (`sparkctl.images.patchapply`), byte-compiles the patched
files and reports each patch: applied, or failed with the rejected hunk. Example::

    report = check_series("gb10-0.5.23", expect_version="0.5.23")
    report.ok, [r.status for r in report.results]      # True, ['applied', 'applied']
"""
from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sparkctl.errors import ConfigError, ImageError, SparkctlError
from sparkctl.images import patchapply
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
    sglang_version: str
    patches: tuple[Path, ...]

    def content_hash(self) -> str:
        """sha256 over the series file and every patch (name + bytes): the series' identity in image tags."""
        h = hashlib.sha256()
        for path in (self.dir / "series", *self.patches):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return h.hexdigest()


def load_series(name: str, *, expect_version: str | None = None, where: str | None = None) -> Series:
    """The series ``name``; ConfigError for an unknown series, a malformed one, or another SGLang version."""
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"bad patch series name {name!r}", where=where, hint="a directory name under patches/")
    directory = patches_dir() / name
    if not (directory / "series").is_file():
        known = ", ".join(list_series()) or "none"
        raise ConfigError(f"unknown patch series {name!r} (no {directory}/series)", where=where,
                          hint=f"shipped series: {known}; or set image.patch_series to one of them")
    try:
        version, patches = patchapply.read_series(directory / "series")
    except patchapply.SeriesError as exc:
        raise ConfigError(f"patch series {name}: {exc}", where=where,
                          hint="first entry 'sglang==<version>', then patch file names") from None
    if expect_version is not None and version != expect_version:
        raise ConfigError(f"patch series {name} is for SGLang {version}, the profile runs SGLang {expect_version}",
                          where=where, hint=f"use a series made for {expect_version} (shipped: "
                                            f"{', '.join(list_series())}), or rebase {name} onto {expect_version}")
    return Series(name, directory, version, tuple(patches))


def ensure_wheel(version: str) -> Path:
    """The released ``sglang==version`` wheel, from the cache or downloaded with pip (no dependencies)."""
    cache = wheel_cache()
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        attempts = [[], ["--only-binary=:all:", "--python-version", "3.11"]]   # SGLang wheels are cp311
        errors = []
        for extra in attempts:
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check",
                   *extra, "-d", tmp, f"sglang=={version}"]
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=helper_env(network=True))
            wheels = list(Path(tmp).glob(f"sglang-{version}-*.whl"))
            if result.returncode == 0 and wheels:
                target = cache / wheels[0].name
                replace_durably(wheels[0], target)
                return target
            errors.append(result.stderr.strip()[-800:])
    raise SparkctlError(f"could not download the sglang=={version} wheel from PyPI", where="patches check",
                        hint="check network access to PyPI, or put the wheel into " + str(cache),
                        evidence="\n".join(errors))


def unpack_package(wheel: Path, dest: Path, only: set[str] | None = None) -> Path:
    """Extract the wheel's ``sglang/`` package (Python source; ``only`` these package-relative paths when given)
    under ``dest``; returns the package dir."""
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.startswith("sglang/") and not m.endswith((".so", "/"))
                   and (only is None or m[len("sglang/"):] in only)]
        for member in members:
            if ".." in Path(member).parts:
                continue
            zf.extract(member, dest)
    return dest / "sglang"


@dataclass
class CheckReport:
    series: Series
    wheel: Path
    results: list[patchapply.PatchResult]

    @property
    def ok(self) -> bool:
        return all(r.status == "applied" for r in self.results)

    def to_json(self) -> dict[str, object]:
        return {"series": self.series.name, "sglang_version": self.series.sglang_version,
                "wheel": self.wheel.name, "ok": self.ok, "patches": [r.to_json() for r in self.results]}

    def lines(self) -> list[str]:
        out = [f"series {self.series.name} against {self.wheel.name}:"]
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
                                  hint=f"rebase the patch onto SGLang {self.series.sglang_version}'s source "
                                       f"(sparkctl patches check --series {self.series.name})",
                                  evidence="\n".join(self.lines()))


def check_series(name: str, *, expect_version: str | None = None) -> CheckReport:
    """Apply series ``name`` to a fresh copy of its SGLang version's released source; report each patch."""
    series = load_series(name, expect_version=expect_version)
    wheel = ensure_wheel(series.sglang_version)
    with tempfile.TemporaryDirectory(prefix="sparkctl-patch-check-") as tmp:
        touched = {fp.path[len(patchapply.PACKAGE_PREFIX):] for p in series.patches
                   for fp in _parse(p, name)}
        package = unpack_package(wheel, Path(tmp), touched)
        try:
            results = patchapply.apply_series(series.dir / "series", package, compile_files=True)
        except patchapply.SeriesError as exc:
            raise ConfigError(f"patch series {name}: {exc}", where=f"patches/{name}") from None
    return CheckReport(series, wheel, results)


def _parse(patch: Path, series: str) -> list[patchapply.FilePatch]:
    try:
        return patchapply.parse_patch(patch.read_text(), patch.name)
    except patchapply.SeriesError as exc:
        raise ConfigError(f"patch series {series}: {exc}", where=f"patches/{series}/{patch.name}",
                          hint="a unified diff with a/python/sglang/... paths") from None
