"""Where sparkctl finds files: the working directory, then ~/.config/sparkctl/, then what the package ships."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sparkctl.resources import SHIPPED_DIRS, config_home, data_root, search_dirs, shipped

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    cwd, conf = tmp_path / "work", tmp_path / "xdg"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(conf))
    for var in ("SPARKCTL_PROFILES_DIR", "SPARKCTL_INVENTORY"):
        monkeypatch.delenv(var, raising=False)
    return cwd, conf / "sparkctl"


def test_shipped_data_is_on_disk():
    for kind, probe in (("profiles", "d5.yml"), ("inventory", "local.yml"), ("images", "engine/Dockerfile.j2"),
                        ("patches", "gb10-0.5.23/series"), ("playbooks", "prepare.yml")):
        assert (shipped(kind) / probe).is_file(), kind


def test_a_checkout_reads_its_top_level_directories():
    # the tests import the checkout: its profiles/, images/ ... are the shipped data (no copy under sparkctl/)
    assert data_root() == REPO
    stray = [p for p in (REPO / "sparkctl" / "data").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert not stray, (f"{stray[:3]}: files under sparkctl/data/ in the checkout; the shipped data lives at the top "
                       f"({', '.join(SHIPPED_DIRS)}) and setup.py maps it into the wheel: move them there")


def test_setup_py_maps_the_same_directories_into_the_wheel():
    import ast
    tree = ast.parse((REPO / "setup.py").read_text())
    mapped = next(ast.literal_eval(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                  and any(getattr(t, "id", None) == "SHIPPED_DIRS" for t in node.targets))
    assert tuple(mapped) == SHIPPED_DIRS, (
        f"setup.py SHIPPED_DIRS {mapped} != sparkctl/resources.py SHIPPED_DIRS {SHIPPED_DIRS}: "
        "make the two lists the same (setup.py puts them in the wheel, resources.py reads them)")


def test_run_from_the_checkout_root_shipped_profiles_stay_after_the_config_dir(places, monkeypatch):
    _, conf = places
    monkeypatch.chdir(REPO)   # ./profiles is the shipped directory here: not the user's own
    assert search_dirs("profiles") == [conf / "profiles", REPO / "profiles"]


def test_profile_order_working_dir_then_config_then_shipped(places):
    from sparkctl.config.profile import find_profile, list_profiles
    cwd, conf = places
    assert config_home() == conf
    assert search_dirs("profiles") == [cwd / "profiles", conf / "profiles", shipped("profiles")]
    for base in (cwd, conf):
        (base / "profiles").mkdir(parents=True)
        shutil.copy(shipped("profiles", "d5.yml"), base / "profiles" / "d5.yml")
    assert find_profile("d5") == cwd / "profiles" / "d5.yml"
    (cwd / "profiles" / "d5.yml").unlink()
    assert find_profile("d5") == conf / "profiles" / "d5.yml"
    assert find_profile("base") == shipped("profiles", "base.yml")
    assert {n: p for n, _, p in list_profiles()}["d5"] == conf / "profiles" / "d5.yml"


def test_inventory_order_working_dir_then_config_then_embedded(places):
    from sparkctl.config.inventory import resolve_inventory
    cwd, conf = places
    assert resolve_inventory(None).emulated and Path(resolve_inventory(None).path) == shipped("inventory", "local.yml")
    (conf / "inventory").mkdir(parents=True)
    shutil.copy(shipped("inventory", "sparks.example.yml"), conf / "inventory" / "sparks.yml")
    assert Path(resolve_inventory(None).path) == conf / "inventory" / "sparks.yml"
    (cwd / "inventory").mkdir()
    shutil.copy(shipped("inventory", "sparks.example.yml"), cwd / "inventory" / "sparks.yml")
    assert Path(resolve_inventory(None).path).resolve() == (cwd / "inventory" / "sparks.yml").resolve()
