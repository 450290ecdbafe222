"""Pure parts of host preparation: manifest/ssh parsers, the cross-node checks, the sync plan, the manifest
helper on a real directory, failure hints. (The playbooks run for real in tests/cluster/test_prepare.py.)"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkctl.deploy.host_checks import HostFacts, evaluate, fabric_ssh, model_parity, mtu_equal
from sparkctl.nodes.facts import MANIFEST_SOURCE, FabricSsh, Manifest, model_manifest, parse_fabric_ssh, parse_manifest
from sparkctl.prepare.runner import PLAYBOOK_DIR, TaskResult, fix_for

HELPER = Path(__file__).resolve().parents[2] / "sparkctl" / "prepare" / "model_manifest.py"


def _plan_filter():
    spec = importlib.util.spec_from_file_location("sparkctl_models",
                                                  PLAYBOOK_DIR / "filter_plugins" / "sparkctl_models.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.FilterModule().filters()["sparkctl_sync_plan"]


def _facts(node: str, files: dict[str, str] | None, *, mtu: int | None = 9000, status: str = "cached") -> HostFacts:
    m = Manifest("missing", "/m/X.sha256") if files is None else Manifest(status, "/m/X.sha256", files)
    return HostFacts(node, {("model", "/models/X"): m}, mtu=mtu, fabric_interface="enp1s0f0np0")


def test_parse_manifest_and_the_fact_argv_carries_the_helper_source():
    line = json.dumps({"status": "computed", "manifest": "/m/X.sha256", "files": {"a": "1"}})
    assert parse_manifest("noise\n" + line + "\n") == Manifest("computed", "/m/X.sha256", {"a": "1"})
    assert model_manifest("/m/X").argv == ("python3", "-c", MANIFEST_SOURCE, "/m/X")
    with pytest.raises(ValueError):
        parse_manifest("")


def test_manifest_helper_reuses_then_recomputes_when_a_file_is_newer(tmp_path: Path):
    model = tmp_path / "X"
    (model / "sub").mkdir(parents=True)
    (model / "w.bin").write_bytes(b"weights")
    (model / "sub" / "c.json").write_text("{}")

    def run(*extra: str) -> dict:
        return json.loads(subprocess.run([sys.executable, str(HELPER), str(model), *extra], check=True,
                                         capture_output=True, text=True).stdout)

    first = run()
    assert first["status"] == "computed" and set(first["files"]) == {"w.bin", "sub/c.json"}
    assert (tmp_path / "X.sha256").read_text().count("  ") == 2     # sha256sum -c format
    assert run()["status"] == "cached"
    time.sleep(0.02)
    (model / "w.bin").write_bytes(b"other weights")
    assert run("--no-write")["status"] == "computed"
    assert run()["status"] == "computed" and run()["status"] == "cached"
    (model / "sub" / "c.json").unlink()                               # a deletion changes the directory's ctime
    assert set(run()["files"]) == {"w.bin"}
    assert json.loads(subprocess.run([sys.executable, str(HELPER), str(tmp_path / "none")], check=True,
                                     capture_output=True, text=True).stdout)["status"] == "missing"


def test_parse_fabric_ssh_outputs_of_openssh():
    assert parse_fabric_ssh("sparkctl-fabric-ok\n").ok
    missing = parse_fabric_ssh("Warning: Identity file /root/.ssh/sparkctl_fabric_ed25519 not accessible: No such "
                               "file or directory.\nroot@198.18.0.2: Permission denied (publickey).\n")
    assert missing == FabricSsh(False, True, False, "root@198.18.0.2: Permission denied (publickey).")
    unknown = parse_fabric_ssh("No ED25519 host key is known for 198.18.0.2 and you have requested strict "
                               "checking.\nHost key verification failed.\n")
    assert unknown.host_key_problem and not unknown.key_missing


def test_model_parity_names_node_check_and_fix():
    same = {"a": "1", "b": "2"}
    ok = model_parity({"spark-a": _facts("spark-a", same), "spark-b": _facts("spark-b", same, status="computed")},
                      "spark-a")
    assert [(c.node, c.name, c.ok) for c in ok] == [("spark-a", "model parity", True)]
    assert "same checksums on spark-a, spark-b (manifest recomputed on spark-b)" in ok[0].seen
    bad = model_parity({"spark-a": _facts("spark-a", same), "spark-b": _facts("spark-b", {"a": "1", "b": "9",
                                                                                        "c": "3"})}, "spark-a")
    assert [(c.node, c.ok) for c in bad] == [("spark-b", False)]
    assert bad[0].seen == ("model /models/X differs between spark-a and spark-b: 1 file(s) differ or are missing, "
                           "1 extra (b, c)")
    assert bad[0].fix.startswith("sparkctl prepare --tags models")
    gone = model_parity({"spark-a": _facts("spark-a", None), "spark-b": _facts("spark-b", same)}, "spark-a")
    assert [(c.node, c.ok) for c in gone] == [("spark-a", False)]
    assert "is not on spark-a (directory missing) but is on spark-b" in gone[0].seen
    assert model_parity({"spark-a": _facts("spark-a", None), "spark-b": _facts("spark-b", None)}, "spark-a") == []


def test_mtu_equal_and_fabric_ssh_checks():
    diff = mtu_equal({"spark-a": _facts("spark-a", {}), "spark-b": _facts("spark-b", {}, mtu=1500)}, "spark-a")
    assert [(c.node, c.name, c.ok) for c in diff] == [("spark-b", "fabric mtu equal", False)]
    assert diff[0].seen == "fabric mtu differs between the ends: 9000 on spark-a, 1500 on spark-b"
    assert "set mtu 9000 on enp1s0f0np0 of spark-b" in diff[0].fix
    assert mtu_equal({"spark-a": _facts("spark-a", {}), "spark-b": _facts("spark-b", {})}, "spark-a")[0].ok
    r0 = _facts("spark-a", {})
    r0.fabric_ssh = {"spark-b": FabricSsh(False, key_missing=True, error="denied")}
    warn = fabric_ssh(r0)[0]
    assert warn.ok and warn.severity == "warning"
    assert warn.seen.startswith("the fabric SSH key") and warn.fix.endswith("fabric-ssh")
    r0.fabric_ssh = {"spark-b": FabricSsh(False, host_key_problem=True, error="Host key verification failed.")}
    assert not fabric_ssh(r0)[0].ok
    assert len(evaluate({"spark-a": r0, "spark-b": _facts("spark-b", {})}, "spark-a")) == 3


def test_sync_plan_pushes_from_rank0_and_pulls_what_only_a_peer_has():
    """Source: the copy most nodes share, then the one with most files, then rank 0 (a two-node tie)."""
    plan = _plan_filter()
    m = {"spark-a": {"M": {"files": {"w": "1", "c": "2"}}, "D": {"status": "missing", "files": {}}},
         "spark-b": {"M": {"files": {"c": "X", "old": "3"}}, "D": {"files": {"d": "4"}}}}
    got = plan(m, ["M", "D"], "spark-a")
    assert got == [{"model": "M", "source": "spark-a", "target": "spark-b", "push": True, "files": ["c", "w"],
                    "extra": ["old"]},
                   {"model": "D", "source": "spark-b", "target": "spark-a", "push": False, "files": ["d"],
                    "extra": []}]
    assert plan({"spark-a": {"M": {"files": {"w": "1"}}}, "spark-b": {"M": {"files": {"w": "1"}}}},
                ["M"], "spark-a") == []
    assert plan({"spark-a": {"M": {"files": {"w": "1"}}}, "spark-b": None}, ["M"], "spark-a") == []   # unreachable
    with pytest.raises(ValueError, match="on no node"):
        plan({"spark-a": {"M": {"files": {}}}}, ["M"], "spark-a")


@pytest.mark.parametrize("status,res,expect", [
    ("unreachable", {"msg": "Failed to connect to the host via ssh: Connection refused"}, "sshd answers"),
    ("failed", {"msg": "Missing sudo password"}, "--ask-become-pass"),
    ("failed", {"msg": "non-zero return code", "stderr": "rsync: write failed: No space left on device (28)"},
     "free space under host_paths.models"),
    ("failed", {"msg": "failed to validate", "stderr": "/tmp/x/etc/netplan/50-b.yaml:5:12: Error"}, "previous one"),
])
def test_failure_hints(status, res, expect):
    r = TaskResult("spark-b", "some task", status, res)
    assert expect in fix_for(r)
    assert r.message.splitlines()[0] == res["msg"]


def test_an_unreachable_host_whose_reason_ansible_lost_gets_it_from_a_probe(tmp_path: Path):
    """Pipelining writes the module into ssh's stdin; if sshd refused the connection first, Ansible says only
    "Broken pipe". The runner connects to the SSH port once and names the refusal (here: a closed local port)."""
    import socket

    import yaml

    from sparkctl.config.inventory import load_inventory
    from sparkctl.prepare.runner import PlaybookRun, _probe_unreachable

    with socket.socket() as s:                       # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((repo / "inventory" / "sparks.example.yml").read_text())
    host = doc["all"]["children"]["sparks"]["hosts"]["spark-b"]
    host["ansible_host"], host["ansible_port"] = "127.0.0.1", port
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(doc))
    inv = load_inventory(tmp_path / "inv.yml")
    lost = 'Data could not be sent to remote host "127.0.0.1". Make sure this host can be reached over ssh: ' \
           '[Errno 32] Broken pipe'
    run = PlaybookRun("prepare.yml", False)
    run.results = [TaskResult("spark-b", "t", "unreachable", {"msg": lost}),
                   TaskResult("spark-b", "t", "unreachable", {"msg": "ssh: connect to host x port 22: No route"})]
    _probe_unreachable(run, inv)
    first = run.results[0].message.splitlines()[0]
    assert first.startswith(f"ssh: connect to host 127.0.0.1 port {port}: Connection refused") and lost in first
    assert run.results[1].res["msg"] == "ssh: connect to host x port 22: No route"     # already said: untouched
    assert "sshd answers" in fix_for(run.results[0])


def test_every_playbook_passes_syntax_check_and_ansible_lint(tmp_path: Path):
    bindir = Path(sys.executable).parent
    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  hosts:\n    spark-a: {fabric_address: 198.18.0.1}\n")
    env = {**os.environ, "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_HOME": str(tmp_path / "home")}
    for book in ("prepare.yml", "models.yml", "facts.yml", "restore.yml"):
        res = subprocess.run([str(bindir / "ansible-playbook"), "--syntax-check", "-i", str(inv), book],
                             cwd=PLAYBOOK_DIR, capture_output=True, text=True, env=env)
        assert res.returncode == 0, res.stdout + res.stderr
    # ansible-lint, production profile: clean. Inline exceptions (each with its reason in the playbook):
    # command-instead-of-module for `systemctl restart docker` (test nodes have no systemd) and run-once
    # (the plays use the linear strategy).
    lint = subprocess.run([str(bindir / "ansible-lint"), "--offline", "--nocolor", "--profile", "production",
                           "prepare.yml", "models.yml", "facts.yml", "restore.yml"], cwd=PLAYBOOK_DIR,
                          capture_output=True, text=True, env={**env, "PATH": f"{bindir}:{os.environ['PATH']}"},
                          timeout=600)
    assert lint.returncode == 0, lint.stdout + lint.stderr
