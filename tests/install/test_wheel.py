"""The built wheel stands alone: installed into a fresh virtualenv outside the checkout, it deploys the shipped D5
profile on the shipped embedded cluster from an empty directory, reports it and takes it down.

One wheel build and one install (pip resolves the dependencies from the configured index: PyPI in CI), shared by
the checks below. Nothing of the checkout is importable in that virtualenv: no PYTHONPATH, cwd an empty directory,
HOME a fresh one (so no ~/.config/sparkctl either), and the test asserts where sparkctl and its data were loaded from.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from testrig.wheel import checkout_build_lock

REPO = Path(__file__).resolve().parents[2]
EMBEDDED_API = ("127.0.0.2", 30000)   # the shipped inventory/local.yml's rank 0 endpoint


def _run(argv: list[str], *, timeout: float, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    with checkout_build_lock(REPO):     # setuptools builds in the checkout: one build at a time (testrig.wheel)
        res = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)], timeout=600)
    assert res.returncode == 0, res.stderr
    (whl,) = out.glob("sparkctl-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("installed")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    py = env_dir / "bin" / "python"
    res = _run([str(py), "-m", "pip", "install", "-q", str(wheel)], timeout=900, cwd=root)
    assert res.returncode == 0, res.stderr
    (root / "home").mkdir()
    (root / "empty").mkdir()
    return {"python": py, "sparkctl": env_dir / "bin" / "sparkctl", "home": root / "home", "cwd": root / "empty",
            "state": root / "state", "venv": env_dir}


def _clean_env(installed: dict[str, Path]) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("SPARKCTL_", "PYTHON", "VIRTUAL_ENV", "XDG_CONFIG")) and k != "HOME"}
    return {**keep, "HOME": str(installed["home"]), "SPARKCTL_STATE_DIR": str(installed["state"]),
            "PATH": f"{installed['venv'] / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


def test_wheel_carries_the_data_and_not_the_test_rig(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    for must in ("sparkctl/data/profiles/d5.yml", "sparkctl/data/profiles/base.yml",
                 "sparkctl/data/inventory/local.yml", "sparkctl/data/inventory/sparks.example.yml",
                 "sparkctl/data/images/engine/Dockerfile.j2", "sparkctl/data/images/launch/Dockerfile.j2",
                 "sparkctl/data/patches/gb10-0.5.23/series", "sparkctl/data/playbooks/prepare.yml",
                 "sparkctl/data/playbooks/filter_plugins/sparkctl_models.py", "sparkctl/prepare/model_manifest.py"):
        assert must in names, f"{must} missing from {wheel.name}"
    assert not [n for n in names if n.startswith(("testrig/", "sparkctl/testing/", "tests/"))]
    # every file of the checkout's top-level data directories, exactly once, under sparkctl/data/<dir>/
    from sparkctl.resources import SHIPPED_DIRS
    tracked = subprocess.run(["git", "ls-files", "--", *SHIPPED_DIRS], cwd=REPO, capture_output=True, text=True,
                             check=False)
    if tracked.returncode == 0 and tracked.stdout:
        want = {f"sparkctl/data/{path}" for path in tracked.stdout.split()}
        assert want <= names, f"missing from {wheel.name}: {sorted(want - names)} (setup.py maps the data directories)"
    stray = sorted(n for n in names if n.startswith("sparkctl/data/") and n.split("/")[2] not in SHIPPED_DIRS)
    assert not stray, (f"{wheel.name} carries {stray[:5]}: left by an earlier build in {REPO / 'build'}; "
                       f"remove that directory (rm -rf build) and build again")


def test_installed_wheel_deploys_d5_from_an_empty_directory(installed: dict[str, Path]):
    with socket.socket() as s:
        s.settimeout(0.5)
        busy = s.connect_ex(EMBEDDED_API) == 0
    if busy:   # the shipped embedded cluster has fixed addresses: someone's own `sparkctl up` holds them
        msg = f"{EMBEDDED_API[0]}:{EMBEDDED_API[1]} is in use (an embedded-cluster deployment is running here)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    env, cwd, exe = _clean_env(installed), installed["cwd"], str(installed["sparkctl"])

    where = _run([str(installed["python"]), "-c", "import sparkctl.resources as r, sparkctl; "
                  "print(sparkctl.__file__); print(r.shipped('profiles'))"], timeout=60, env=env, cwd=cwd)
    assert where.returncode == 0, where.stderr
    for line in where.stdout.split():
        assert Path(line).is_relative_to(installed["venv"]) and not Path(line).is_relative_to(REPO), line

    version = _run([exe, "--version"], timeout=60, env=env, cwd=cwd)
    assert version.returncode == 0 and version.stdout.startswith("sparkctl "), version.stderr
    plan = _run([exe, "image", "plan", "--profile", "d5", "--json"], timeout=60, env=env, cwd=cwd)   # templates +
    assert plan.returncode == 0, plan.stderr                                                        # patches shipped
    assert json.loads(plan.stdout)["engine"]["inputs"]["series"] == "gb10-0.5.23"

    up = _run([exe, "up", "--profile", "d5", "--json"], timeout=300, env=env, cwd=cwd)
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        assert "embedded local cluster" in up.stderr and str(installed["venv"]) in up.stderr
        status = _run([exe, "status", "--json"], timeout=60, env=env, cwd=cwd)
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        assert doc["healthy"] is True and doc["profile"] == "d5"
    finally:
        down = _run([exe, "down", "--yes"], timeout=120, env=env, cwd=cwd)
    assert down.returncode == 0, down.stderr
    after = _run([exe, "status", "--json"], timeout=60, env=env, cwd=cwd)
    assert after.returncode == 0 and json.loads(after.stdout)["active"] is None, after.stdout
    assert list(cwd.iterdir()) == []   # nothing written into the user's working directory


def _extras_installed(installed: dict[str, Path], env: dict[str, str]) -> set[str]:
    from sparkctl.extras import MODULES
    probe = _run([str(installed["python"]), "-c", "import importlib.util as u, sys; print(' '.join(m for m in "
                  "sys.argv[1:] if u.find_spec(m) is not None))", *MODULES], timeout=60, env=env, cwd=installed["cwd"])
    assert probe.returncode == 0, probe.stderr
    return {MODULES[m] for m in probe.stdout.split()}


def test_installed_without_extras_names_each_missing_extra_for_every_command_that_needs_it(
        installed: dict[str, Path], tmp_path: Path):
    """`pip install sparkctl` (the wheel, no extras): every command that needs an extra says which and how to
    install it (exit 2), never an internal error (issue 31: `preflight` on SSH nodes was exit 70 for paramiko)."""
    from testrig.embedded import write_replicated_profile
    from testrig.usage_cases import NEEDS
    env, exe = _clean_env(installed), str(installed["sparkctl"])
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    write_replicated_profile(profiles / "two.yml", 8)
    env |= {"SPARKCTL_PROFILES_DIR": str(profiles), "SPARKCTL_STATE_DIR": str(tmp_path / "state")}
    present = _extras_installed(installed, env)
    assert present == {"watch"}, present     # prometheus_client is also a base dependency; the others are extras
    ran = 0
    for extra, argvs in NEEDS.items():
        if extra in present:
            continue
        for argv in argvs:
            res = _run([exe, *(a.replace("{replicated}", "two") for a in argv)], timeout=120, env=env,
                       cwd=installed["cwd"])
            ran += 1
            where = f"sparkctl {' '.join(argv)}: exit {res.returncode}\n{res.stderr}"
            assert res.returncode == 2, where
            assert "internal error" not in res.stderr and "Traceback" not in res.stderr, where
            assert f"needs the optional `{extra}` extra" in res.stderr, where
            assert f"pip install 'sparkctl[{extra}]'" in res.stderr and "pipx inject sparkctl '" in res.stderr, where
    assert ran == sum(len(v) for k, v in NEEDS.items() if k not in present)
