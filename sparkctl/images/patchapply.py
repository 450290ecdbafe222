"""Apply a patch series to an installed SGLang package: strict unified-diff applier, standard library only.

One applier for both places a series is applied: ``sparkctl patches check`` (against the released wheel on
the controller) and the engine image build (copied into the build context and run by the base image's own
``python3``). Why not GNU ``patch``: the base image may not carry it (lmsysorg's runtime stage, a slim
site-packages image), and ``patch`` accepts fuzz (a hunk whose context drifted applies silently, maybe in the
wrong place). Here a hunk applies only where its context and removed lines match exactly (the line offset
may move, nothing else), every patch of the series is tried in memory first, and files are written only
when all apply. A failure names the patch, the file and the hunk, and prints the hunk.

Patch paths are SGLang repository paths (``a/python/sglang/...``, what ``git diff`` in a checkout gives);
they are applied under the installed package directory (``python/sglang/X`` -> ``<package_dir>/X``), which
is ``/sgl-workspace/sglang/python/sglang`` in lmsysorg images and ``.../site-packages/sglang`` elsewhere.

Series file: ``#`` comments, then ``sglang==<version>`` (the release the diffs are against), then one patch
file name per line, in order. Text before a patch's first ``--- `` line is its header (what/why/hardware).

Command line (what the engine Dockerfile runs; without ``--package-dir`` the package is located the way
``python3 -c 'import sglang, os; print(os.path.dirname(sglang.__file__))'`` would, but with
``importlib.util.find_spec`` so SGLang's import-time code, which may probe CUDA, does not run at build time)::

    python3 patchapply.py --series DIR/series [--package-dir /sgl-workspace/sglang/python/sglang] --compile
"""
from __future__ import annotations

import argparse
import json
import py_compile
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
PACKAGE_PREFIX = "python/sglang/"


class SeriesError(Exception):
    """The series file or a patch file is malformed."""


@dataclass
class Hunk:
    header: str                 # the "@@ -a,b +c,d @@" line
    old_start: int              # 1-based
    lines: list[str]            # raw hunk body lines (' ', '-', '+', '\\')

    @property
    def old(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[:1] in (" ", "-")]

    @property
    def new(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[:1] in (" ", "+")]

    def text(self) -> str:
        return "\n".join([self.header, *self.lines])


@dataclass
class FilePatch:
    path: str                   # repository path, e.g. python/sglang/srt/model_loader/utils.py
    hunks: list[Hunk] = field(default_factory=list)

    def target(self, package_dir: Path) -> Path:
        if not self.path.startswith(PACKAGE_PREFIX) or ".." in Path(self.path).parts:
            raise SeriesError(f"{self.path}: patch paths must be under {PACKAGE_PREFIX} (SGLang repository layout)")
        return package_dir / self.path[len(PACKAGE_PREFIX):]


@dataclass
class PatchFailure:
    patch: str
    file: str
    hunk_index: int             # 1-based
    hunk: str
    reason: str

    def line(self) -> str:
        return f"{self.patch}: hunk #{self.hunk_index} of {self.file} {self.reason}"


def _strip_prefix(name: str) -> str:
    name = name.split("\t", 1)[0].strip()
    return name[2:] if name[:2] in ("a/", "b/") else name


def parse_patch(text: str, name: str = "<patch>") -> list[FilePatch]:
    """Parse a unified diff (header text before the first ``--- `` line is ignored)."""
    lines = text.splitlines()
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        if not (lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            if files and lines[i].startswith("@@"):
                raise SeriesError(f"{name}: hunk outside a file section at line {i + 1}")
            i += 1
            continue
        fp = FilePatch(_strip_prefix(lines[i + 1][4:]))
        if fp.path == "/dev/null":
            raise SeriesError(f"{name}: file deletion is not supported ({lines[i]})")
        i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            m = _HUNK.match(lines[i])
            if not m:
                raise SeriesError(f"{name}: bad hunk header at line {i + 1}: {lines[i]!r}")
            old_len = int(m.group(2) or 1)
            new_len = int(m.group(4) or 1)
            hunk = Hunk(lines[i], int(m.group(1)), [])
            i += 1
            seen_old = seen_new = 0
            while i < len(lines) and (seen_old < old_len or seen_new < new_len or lines[i].startswith("\\")):
                ln = lines[i]
                tag = ln[:1] if ln else " "
                if tag not in (" ", "-", "+", "\\"):
                    raise SeriesError(f"{name}: hunk {hunk.header} ends early at line {i + 1}")
                hunk.lines.append(ln if ln else " ")
                seen_old += tag in (" ", "-")
                seen_new += tag in (" ", "+")
                i += 1
            if seen_old != old_len or seen_new != new_len:
                raise SeriesError(f"{name}: hunk {hunk.header} has {seen_old}/{seen_new} lines, header says "
                                  f"{old_len}/{new_len}")
            fp.hunks.append(hunk)
        if not fp.hunks:
            raise SeriesError(f"{name}: no hunks for {fp.path}")
        files.append(fp)
    if not files:
        raise SeriesError(f"{name}: not a unified diff (no '--- a/...' / '+++ b/...' section)")
    return files


def read_series(series_file: Path) -> tuple[str, list[Path]]:
    """(sglang version, patch paths in order) from a series file."""
    version = None
    patches: list[Path] = []
    for raw in series_file.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if version is None:
            if not line.startswith("sglang=="):
                raise SeriesError(f"{series_file}: first entry must be 'sglang==<version>', got {line!r}")
            version = line[len("sglang=="):]
            continue
        path = series_file.parent / line
        if "/" in line or not path.is_file():
            raise SeriesError(f"{series_file}: patch {line!r} is not a file next to the series file")
        patches.append(path)
    if version is None:
        raise SeriesError(f"{series_file}: no 'sglang==<version>' line")
    if not patches:
        raise SeriesError(f"{series_file}: lists no patches")
    return version, patches


def _find(lines: list[str], block: list[str], expected: int) -> int | None:
    """Index where ``block`` matches exactly, nearest to ``expected`` (0-based); None if nowhere."""
    if not block:
        return min(max(expected, 0), len(lines))
    n = len(block)
    for delta in range(0, len(lines) + 1):
        for pos in ((expected - delta, expected + delta) if delta else (expected,)):
            if 0 <= pos <= len(lines) - n and lines[pos:pos + n] == block:
                return pos
    return None


def apply_file_patch(text: str, fp: FilePatch, patch_name: str) -> tuple[str, PatchFailure | None]:
    """Apply every hunk of ``fp`` to ``text``; returns (new text, None) or (text, first failure)."""
    lines = text.split("\n")
    offset = 0
    for index, hunk in enumerate(fp.hunks, 1):
        expected = hunk.old_start - 1 + offset
        pos = _find(lines, hunk.old, expected)
        if pos is None:
            already = _find(lines, hunk.new, expected) is not None and hunk.old != hunk.new
            reason = ("does not apply: its new lines are already there (patch applied twice, or already upstream)"
                      if already else f"does not apply: context/removed lines not found (expected near line "
                                      f"{hunk.old_start})")
            return text, PatchFailure(patch_name, fp.path, index, hunk.text(), reason)
        lines[pos:pos + len(hunk.old)] = hunk.new
        offset = pos - (hunk.old_start - 1) + len(hunk.new) - len(hunk.old)
    return "\n".join(lines), None


@dataclass
class PatchResult:
    patch: str
    status: str                 # "applied" | "failed"
    files: list[str] = field(default_factory=list)
    failure: PatchFailure | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"patch": self.patch, "status": self.status, "files": self.files}
        if self.failure:
            out.update(file=self.failure.file, hunk_index=self.failure.hunk_index, hunk=self.failure.hunk,
                       reason=self.failure.reason)
        return out


def apply_series(series_file: Path, package_dir: Path, *, write: bool = True,
                 compile_files: bool = False) -> list[PatchResult]:
    """Apply every patch of a series to ``package_dir`` (all in memory first; files written only if all apply).

    Each patch is tried on top of the ones that applied before it, so one bad patch does not hide the state
    of the others. Byte-compiles the patched files when ``compile_files`` (a SyntaxError is a failure).
    """
    _, patches = read_series(series_file)
    state: dict[Path, str] = {}
    results: list[PatchResult] = []
    for patch_path in patches:
        file_patches = parse_patch(patch_path.read_text(), patch_path.name)
        trial = dict(state)
        failure = None
        for fp in file_patches:
            target = fp.target(package_dir)
            if target not in trial:
                if not target.is_file():
                    failure = PatchFailure(patch_path.name, fp.path, 1, fp.hunks[0].text(),
                                           f"does not apply: {target} does not exist")
                    break
                trial[target] = target.read_text()
            trial[target], failure = apply_file_patch(trial[target], fp, patch_path.name)
            if failure:
                break
        if failure:
            results.append(PatchResult(patch_path.name, "failed", [f.path for f in file_patches], failure))
        else:
            state = trial
            results.append(PatchResult(patch_path.name, "applied", [f.path for f in file_patches]))
    if write and all(r.status == "applied" for r in results):
        for target, text in state.items():
            target.write_text(text)
            if compile_files:
                try:
                    py_compile.compile(str(target), doraise=True)
                except py_compile.PyCompileError as exc:
                    owner = next(r for r in results if any(target == FilePatch(f).target(package_dir)
                                                           for f in r.files))
                    owner.status = "failed"
                    owner.failure = PatchFailure(owner.patch, str(target), 0, "", f"does not compile: {exc.msg}")
    return results


def locate_package() -> Path:
    """Directory of the ``sglang`` package this interpreter imports (without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SeriesError(f"no 'sglang' package importable by {sys.executable} in this image")
    return Path(list(spec.submodule_search_locations)[0])


_VERSION = re.compile(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", re.M)


def installed_version(package_dir: Path) -> str | None:
    """SGLang's version from ``_version.py`` (setuptools-scm, in wheels and source installs); None if absent."""
    try:
        m = _VERSION.search((package_dir / "_version.py").read_text())
    except OSError:
        return None
    return m.group(1) if m else None


def _say(text: str, *, err: bool = False) -> None:
    """One message, its newline included, in one write, flushed at once: docker build merges the RUN step's stdout and
    stderr into one stream, so a message written in pieces (print's text, then its end) or held in a block buffer
    could be cut by the other stream's output and lose the ``sparkctl-patch:`` at its line's start that the build's
    reader looks for (sparkctl/images/build.py)."""
    stream = sys.stderr if err else sys.stdout
    stream.write(text + "\n")
    stream.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="patchapply", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--series", type=Path, required=True)
    parser.add_argument("--package-dir", type=Path, help="directory of the installed sglang package (default: locate)")
    parser.add_argument("--compile", action="store_true", help="byte-compile the patched files")
    parser.add_argument("--json", action="store_true", help="one JSON line per patch")
    args = parser.parse_args(argv)
    try:
        if args.package_dir is None:
            args.package_dir = locate_package()
            _say(f"sparkctl-patch: sglang package at {args.package_dir}")
        wanted, _ = read_series(args.series)
        found = installed_version(args.package_dir)
        if found is None:
            _say(f"sparkctl-patch: warning: no _version.py in {args.package_dir}; the patches' context decides")
        elif found != wanted:
            _say(f"sparkctl-patch: ERROR series {args.series.parent.name} is for SGLang {wanted}, the image carries "
                 f"SGLang {found} ({args.package_dir})", err=True)
            return 3
        results = apply_series(args.series, args.package_dir, compile_files=args.compile)
    except (SeriesError, OSError) as exc:
        _say(f"sparkctl-patch: ERROR {exc}", err=True)
        return 2
    for r in results:
        if args.json:
            _say(json.dumps(r.to_json()))
        elif r.failure:
            _say(f"sparkctl-patch: FAILED {r.failure.line()}\n{r.failure.hunk}", err=True)
        else:
            _say(f"sparkctl-patch: applied {r.patch} ({', '.join(r.files)})")
    failed = [r for r in results if r.status != "applied"]
    if failed:
        _say(f"sparkctl-patch: {len(failed)} of {len(results)} patches failed in {args.series.parent.name} "
             f"(package {args.package_dir})", err=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
