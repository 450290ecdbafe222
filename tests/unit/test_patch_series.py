"""Patch series: the strict applier, every shipped series against the real SGLang wheel, bad input."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkctl.cli.main import main as cli
from sparkctl.errors import ConfigError, SparkctlError
from sparkctl.images import patchapply
from sparkctl.images import series as series_mod
from sparkctl.images.series import PatchCheckError, check_series, list_series, load_series
from testrig.testenv import in_ci

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.parent.name for p in (REPO / "patches").glob("*/series"))
# the SGLang series (the vLLM ones: tests/unit/test_vllm_series.py, against the vLLM test environment's source)
SHIPPED_SGLANG = [n for n in SHIPPED if load_series(n).engine == "sglang"]

ORIGINAL = "def f(x):\n    a = 1\n    b = 2\n    return a + b + x\n"
PATCH = """What: test patch
Validated on GB10: no

--- a/python/sglang/mod.py
+++ b/python/sglang/mod.py
@@ -2,3 +2,3 @@
     a = 1
-    b = 2
+    b = 3
     return a + b + x
"""


def _wheel_or_skip(version: str) -> Path:
    try:
        return series_mod.ensure_wheel(version)
    except SparkctlError as exc:
        if in_ci():
            raise
        pytest.skip(f"SGLang {version} wheel not downloadable here: {exc.message}")


def _series(tmp_path: Path, patches: dict[str, str], version: str = "0.5.23", name: str = "t") -> Path:
    d = tmp_path / "patches" / name
    d.mkdir(parents=True)
    for fname, text in patches.items():
        (d / fname).write_text(text)
    (d / "series").write_text(f"# test\nsglang=={version}\n" + "".join(f"{n}\n" for n in patches))
    return d / "series"


def _package(tmp_path: Path, text: str = ORIGINAL) -> Path:
    pkg = tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "mod.py").write_text(text)
    return pkg


def test_applier_applies_at_an_offset_and_compiles(tmp_path):
    pkg = _package(tmp_path, "# moved down by two lines\n\n" + ORIGINAL)
    results = patchapply.apply_series(_series(tmp_path, {"0001-b.patch": PATCH}), pkg, compile_files=True)
    assert [r.status for r in results] == ["applied"]
    assert "    b = 3\n" in (pkg / "mod.py").read_text()
    assert list((pkg / "__pycache__").glob("mod.*.pyc"))


def test_applier_names_patch_file_and_hunk_and_writes_nothing(tmp_path):
    pkg = _package(tmp_path)
    broken = PATCH.replace("     a = 1", "     a = 100")
    series_file = _series(tmp_path, {"0001-b.patch": PATCH.replace("b = 3", "b = 4").replace(
        "@@ -2,3", "@@ -2,3"), "0002-broken.patch": broken})
    results = patchapply.apply_series(series_file, pkg)
    assert [r.status for r in results] == ["applied", "failed"]
    failure = results[1].failure
    assert failure is not None
    assert failure.patch == "0002-broken.patch" and failure.file == "python/sglang/mod.py"
    assert failure.hunk_index == 1 and "a = 100" in failure.hunk and "not found" in failure.reason
    assert (pkg / "mod.py").read_text() == ORIGINAL          # all or nothing


def test_applier_says_when_a_patch_is_already_applied(tmp_path):
    pkg = _package(tmp_path, ORIGINAL.replace("b = 2", "b = 3"))
    [result] = patchapply.apply_series(_series(tmp_path, {"0001-b.patch": PATCH}), pkg)
    assert result.status == "failed" and result.failure is not None and "already there" in result.failure.reason


def test_applier_refuses_paths_outside_the_package(tmp_path):
    evil = PATCH.replace("python/sglang/mod.py", "python/sglang/../../etc/passwd")
    with pytest.raises(patchapply.SeriesError, match="must be under python/sglang/"):
        patchapply.apply_series(_series(tmp_path, {"0001-evil.patch": evil}), _package(tmp_path))


def test_applier_command_line_exit_status_and_message(tmp_path, capsys):
    series_file = _series(tmp_path, {"0001-b.patch": PATCH.replace("a = 1", "a = 9")})
    assert patchapply.main(["--series", str(series_file), "--package-dir", str(_package(tmp_path))]) == 1
    err = capsys.readouterr().err
    assert "FAILED 0001-b.patch: hunk #1 of python/sglang/mod.py does not apply" in err and "@@ -2,3 +2,3 @@" in err


@pytest.mark.parametrize("name", SHIPPED_SGLANG)
def test_every_shipped_series_applies_to_the_real_released_wheel(name):
    """CI runs this against the wheel from PyPI (cached in ~/.cache/sparkctl/wheels)."""
    _wheel_or_skip(load_series(name).sglang_version)
    report = check_series(name)
    assert report.ok, "\n".join(report.lines())
    assert [r.patch for r in report.results] == [p.name for p in load_series(name).patches]


def test_shipped_patches_carry_the_header():
    for name in SHIPPED:
        for patch in load_series(name).patches:
            header = patch.read_text().split("\n--- a/", 1)[0]
            for field in ("What:", "Why:", "Hardware:", "Validated on GB10: no"):
                assert field in header, f"{patch.name} lacks {field!r} in its header"


def test_dsa_tile_patch_targets_the_real_kernel_file():
    patch = (REPO / "patches" / "gb10-0.5.23" / "0001-dsa-tilelang-sm12x-tiles.patch").read_text()
    assert "+++ b/python/sglang/kernels/ops/attention/dsa/tilelang_kernel.py" in patch
    assert '{"block_I": 32, "num_stages": 1, "threads": 128}' in patch


def test_a_broken_patch_fails_the_check_naming_patch_and_hunk(tmp_path, monkeypatch, capsys):
    _wheel_or_skip("0.5.23")
    real = REPO / "patches" / "gb10-0.5.23"
    target = tmp_path / "patches" / "broken-0.5.23"
    shutil.copytree(real, target)
    p = target / "0002-deepgemm-ue8m0-requant-sm121.patch"
    p.write_text(p.read_text().replace("         and weight_block_size is not None",
                                       "         and weight_block_size is not None and True"))
    monkeypatch.setenv("SPARKCTL_PATCHES_DIR", str(tmp_path / "patches"))
    report = check_series("broken-0.5.23")
    assert [r.status for r in report.results] == ["applied", "failed", "applied"]
    with pytest.raises(PatchCheckError, match=r"0002-deepgemm-ue8m0-requant-sm121.patch: hunk #1 of "
                                              r"python/sglang/srt/model_loader/utils.py"):
        report.raise_for_failure()
    assert cli(["patches", "check", "--series", "broken-0.5.23"]) == 4
    out = capsys.readouterr()
    assert "applied 0001-dsa-tilelang-sm12x-tiles.patch" in out.out
    assert "FAILED  0002-deepgemm-ue8m0-requant-sm121.patch: hunk #1" in out.out
    assert "@@ -279,9 +279,9 @@" in out.err


def test_unknown_series_lists_the_shipped_ones(capsys):
    with pytest.raises(ConfigError, match="unknown patch series 'gb10-9.9'") as err:
        load_series("gb10-9.9")
    assert err.value.hint is not None and "gb10-0.5.23" in err.value.hint
    assert cli(["patches", "check", "--series", "gb10-9.9"]) == 2


def test_series_for_another_version_than_the_profile_is_refused(tmp_path, monkeypatch):
    _series(tmp_path, {"0001-b.patch": PATCH}, version="0.5.11", name="gb10-0.5.11")
    monkeypatch.setenv("SPARKCTL_PATCHES_DIR", str(tmp_path / "patches"))
    with pytest.raises(ConfigError, match="is for SGLang 0.5.11, the profile runs SGLang 0.5.23"):
        load_series("gb10-0.5.11", expect_version="0.5.23")
    assert list_series() == ["gb10-0.5.11"]


def test_profile_series_is_checked_against_the_profile_version(capsys):
    _wheel_or_skip("0.5.23")
    assert cli(["patches", "check", "--profile", "d5"]) == 0
    assert "applied 0002-deepgemm-ue8m0-requant-sm121.patch" in capsys.readouterr().out


def test_every_line_of_the_applier_reaches_a_merged_stream_whole(tmp_path, monkeypatch):
    """docker build gives the applier's stdout and stderr one stream, merging them as each pipe's reads arrive: so a
    line the build's reader looks for (``sparkctl-patch: FAILED ...`` at a line's start, sparkctl/images/build.py)
    arrives whole only if every write the applier makes is whole lines. Once a failed build read as "docker build
    exit 1", without the patch and hunk (a whole run, under load): print() writes a message and its newline in two
    writes, and a block-buffered stdout flushes wherever its buffer fills. Here every write to either stream, over a
    series of good and failing patches, is checked to end a line."""
    import sys

    writes: list[tuple[str, str]] = []

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def write(self, text: str) -> int:
            writes.append((self.name, text))
            return len(text)

        def flush(self) -> None:
            pass

    patches, pkg = {}, tmp_path / "site" / "sglang"
    pkg.mkdir(parents=True)
    for i in range(20):
        (pkg / f"mod{i}.py").write_text(ORIGINAL)
        text = PATCH.replace("mod.py", f"mod{i}.py")
        patches[f"{i:04d}-p.patch"] = text.replace("a = 1", "a = 9") if i % 2 else text
    series_file = _series(tmp_path, patches)
    monkeypatch.setattr(sys, "stdout", Recorder("stdout"))
    monkeypatch.setattr(sys, "stderr", Recorder("stderr"))
    code = patchapply.main(["--series", str(series_file), "--package-dir", str(pkg)])
    monkeypatch.undo()
    assert code == 1
    assert [w for w in writes if not w[1].endswith("\n")] == []
    assert sum(w[1].startswith("sparkctl-patch: FAILED ") for w in writes if w[0] == "stderr") == 10
    assert sum(w[1].startswith("sparkctl-patch: applied ") for w in writes if w[0] == "stdout") == 10
