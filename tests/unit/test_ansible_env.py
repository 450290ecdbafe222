"""ansible-runner gets only the variables it needs: the caller's API key and HF token (and anything else it
does not use) never reach ansible-playbook's environment nor an artifact; artifact directories are 0700 and
files 0600. One real ansible-runner run (facts.yml, read-only) against hosts whose SSH port refuses."""
from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.prepare.runner import ansible_env, run_playbook
from sparkctl.prepare.runner import state_dir as ansible_dir

API_KEY = "sk-ansible-env-7c1e9a"
HF_TOKEN = "hf_ansibleEnv0123"


def test_ansible_env_keeps_settings_runner_additions_and_the_callers_needs_only():
    caller = {"HOME": "/root", "USER": "root", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "SSH_AUTH_SOCK": "/s",
              "ANSIBLE_CONFIG": "/etc/a.cfg", "SPARKCTL_API_KEY": API_KEY, "HF_TOKEN": HF_TOKEN,
              "AWS_SECRET_ACCESS_KEY": "x", "PYTHONPATH": "/evil", "LD_PRELOAD": "/evil.so", "PATH": "/usr/bin"}
    settings = {"PATH": "/venv/bin:/usr/bin", "ANSIBLE_NOCOLOR": "True"}
    job = {**caller, **settings, "ANSIBLE_STDOUT_CALLBACK": "awx_display", "AWX_ISOLATED_DATA_DIR": "/a/1"}
    env = ansible_env(job, caller, settings)
    assert env == {"HOME": "/root", "USER": "root", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "SSH_AUTH_SOCK": "/s",
                   "ANSIBLE_CONFIG": "/etc/a.cfg", "PATH": "/venv/bin:/usr/bin", "ANSIBLE_NOCOLOR": "True",
                   "ANSIBLE_STDOUT_CALLBACK": "awx_display", "AWX_ISOLATED_DATA_DIR": "/a/1"}


def test_ansible_env_and_helper_env_share_one_allowlist():
    """One helper environment rule (nodes/environ.py): what any helper inherits of the caller, ansible-playbook
    inherits too, plus its SSH agent and ANSIBLE_*; a variable outside it reaches neither."""
    from sparkctl.nodes.environ import helper_env
    caller = {"HOME": "/root", "SHELL": "/bin/bash", "DOCKER_HOST": "unix:///d.sock", "LC_ALL": "C",
              "SSH_AUTH_SOCK": "/s", "ANSIBLE_CONFIG": "/a.cfg", "HF_TOKEN": HF_TOKEN, "PYTHONPATH": "/evil"}
    helper = helper_env(environ=caller)
    ansible = ansible_env(dict(caller), caller, {})
    assert set(helper) - {"PATH"} == {"HOME", "SHELL", "DOCKER_HOST", "LC_ALL"}
    assert set(ansible) == set(helper) - {"PATH"} | {"SSH_AUTH_SOCK", "ANSIBLE_CONFIG"}


def _refusing_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]          # closed again: connecting is refused


@pytest.fixture
def unreachable_inventory(tmp_path: Path) -> Path:
    port = _refusing_port()
    hosts = {f"spark-{x}": {"ansible_host": "127.0.0.1", "ansible_port": port, "sparkctl_rank": r,
                            "fabric_interface": "lo", "fabric_address": f"127.0.0.{r + 2}", "runtime": "docker",
                            "gpu_runtime": "none"} for x, r in (("a", 0), ("b", 1))}
    doc = {"all": {"vars": {"sparkctl_cluster": f"envtest{port}", "sparkctl_known_hosts": str(tmp_path / "kh"),
                            "ansible_user": "nobody"},
                   "children": {"sparks": {"hosts": hosts}}}}
    path = tmp_path / "sparks.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_no_artifact_holds_a_secret_and_modes_are_private(unreachable_inventory, state_dir, monkeypatch):
    monkeypatch.setenv("SPARKCTL_API_KEY", API_KEY)
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    old = os.umask(0o022)
    try:
        inv = load_inventory(unreachable_inventory)
        run = run_playbook(inv, "facts.yml", extravars={"prepare_models": []})
    finally:
        os.umask(old)
    assert {r.status for r in run.results} == {"unreachable"}     # it really ran, and reached nobody
    base = ansible_dir(inv)
    files = [p for p in base.rglob("*") if p.is_file()]
    assert any(p.name == "command" for p in files) and any(p.parent.name == "job_events" for p in files)
    for path in [base, *base.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_symlink():
            continue
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    for path in files:
        data = path.read_bytes()
        assert API_KEY.encode() not in data and HF_TOKEN.encode() not in data, path
    command = json.loads(next(p for p in files if p.name == "command").read_text())
    assert "HF_TOKEN" not in command["env"] and "SPARKCTL_API_KEY" not in command["env"]
    assert command["env"]["ANSIBLE_HOST_KEY_CHECKING"] == "True" and "HOME" in command["env"]
