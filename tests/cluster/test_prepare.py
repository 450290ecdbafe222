"""`sparkctl prepare` for real: Ansible (ansible-runner) over real SSH against the two test-cluster nodes.

Each node has its own root filesystem (testrig/rootfs.py), so what a playbook writes on spark-b
(/etc/docker/daemon.json, /etc/netplan, groups, ~/.ssh) is visible only there. Stand-ins, because the test
machine has no such hardware: `nvidia-smi` and `ibdev2netdev` print captured DGX Spark output, `netplan apply`
validates with the real `netplan generate` and then sets address/MTU with `ip`, and `systemctl restart docker`
sends SIGHUP to the node's dockerd. Everything else is real: files, the docker group, SSH keys, rsync of a
model directory between the nodes over the fabric veth, checksums, MTU.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.errors import NodeError
from sparkctl.prepare.plays import prepare
from testrig.cluster import TestCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

MODEL, DRAFTER = "GLM-5.3-Flash-NVFP4", "GLM-5.3-Flash-DFlash2"   # the d5 profile's model and drafter
FABRIC = "enp1s0f0np0"


@pytest.fixture(scope="module")
def env(test_cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory):
    """A derived inventory whose models live in their own directory per node, sparkctl pointed at it; at the end
    the nodes get their files back (restore), MTU 9000 and no test models."""
    tmp = tmp_path_factory.mktemp("prepare")
    doc = yaml.safe_load(Path(test_cluster.inventory_path).read_text())
    doc["all"]["vars"]["sparkctl_cluster"] += "-prep"
    for name, host in doc["all"]["children"]["sparks"]["hosts"].items():
        host["host_paths"]["models"] = str(test_cluster.node(name).host_root / "prep-models")
    inv_path = tmp / "inventory.yml"
    inv_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    original = {n: _cat(test_cluster, n, "/etc/docker/daemon.json") for n in ("spark-a", "spark-b")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKCTL_INVENTORY", str(inv_path))
        mp.setenv("SPARKCTL_STATE_DIR", str(tmp / "state"))
        yield {"inv": load_inventory(inv_path), "path": inv_path, "original": original, "tmp": tmp}
        for n in ("spark-a", "spark-b"):
            test_cluster.start_sshd(n)
            test_cluster.run_on(n, ["ip", "link", "set", FABRIC, "mtu", "9000"])
        prepare(load_inventory(inv_path), restore=True)


def _cat(cluster: TestCluster, node: str, path: str) -> str | None:
    res = cluster.run_in_root(node, ["cat", path], check=False)
    return res.stdout if res.returncode == 0 else None


def _read(cluster: TestCluster, node: str, path: str) -> str:
    """The file `path` on `node`, which the test expects to be there."""
    text = _cat(cluster, node, path)
    assert text is not None, f"{node}: no {path}"
    return text


def _models(cluster: TestCluster, node: str) -> Path:
    return cluster.node(node).host_root / "prep-models"


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".rsync-partial" not in p.parts}


def _mtu(cluster: TestCluster, node: str) -> int:
    return json.loads(cluster.run_on(node, ["ip", "-j", "link", "show", "dev", FABRIC]).stdout)[0]["mtu"]


def test_prepare_then_a_second_run_changes_nothing(test_cluster, env):
    first = prepare(env["inv"])
    assert all(s["changed"] > 0 for s in first.stats.values()), first.stats
    for n in ("spark-a", "spark-b"):
        daemon = json.loads(_read(test_cluster, n, "/etc/docker/daemon.json"))
        assert daemon["runtimes"]["nvidia"] == {"path": "runc"}          # the registered runtime is kept as is
        assert daemon["log-opts"] == {"max-size": "100m", "max-file": "3"}
        assert _cat(test_cluster, n, "/var/lib/sparkctl/prepare/previous/daemon.json") == env["original"][n]
        assert _cat(test_cluster, n, "/var/lib/sparkctl/prepare/previous/fabric-netplan.yaml.absent") == ""
        netplan = yaml.safe_load(_read(test_cluster, n, "/etc/netplan/40-sparkctl-fabric.yaml"))
        eth = netplan["network"]["ethernets"][FABRIC]
        assert eth["mtu"] == 9000 and eth["addresses"] == [f"{test_cluster.node(n).fabric_address}/24"]
        assert "docker" in test_cluster.run_in_root(n, ["id", "-nG", "root"]).stdout.split()
        assert Path(env["inv"].node(n).host_paths.models).is_dir()
    # the playbook's change is visible only inside the node: the controller's own files are untouched
    assert not Path("/etc/netplan/40-sparkctl-fabric.yaml").exists()
    assert _cat(test_cluster, "spark-a", "/root/.ssh/sparkctl_fabric_ed25519.pub")
    assert _cat(test_cluster, "spark-b", "/root/.ssh/sparkctl_fabric_ed25519.pub") is None
    a_fabric = test_cluster.node("spark-a").fabric_address
    assert f'from="{a_fabric}" ssh-ed25519 ' in _read(test_cluster, "spark-b", "/root/.ssh/authorized_keys")
    second = prepare(env["inv"])
    assert {h: s["changed"] for h, s in second.stats.items()} == {"spark-a": 0, "spark-b": 0}


def test_check_mode_changes_nothing_then_a_run_repairs(test_cluster, env, cli):
    daemon_b = json.loads(_read(test_cluster, "spark-b", "/etc/docker/daemon.json"))
    del daemon_b["log-opts"]
    edited = json.dumps(daemon_b)
    test_cluster.run_in_root("spark-b", ["tee", "/etc/docker/daemon.json"], input=edited)
    test_cluster.run_on("spark-b", ["ip", "link", "set", FABRIC, "mtu", "1500"])

    checked = prepare(env["inv"], check=True)
    would = {(r.host, r.task) for run in checked.runs for r in run.changed()}
    assert ("spark-b", "NVIDIA runtime registered and engine logs rotated in daemon.json") in would
    assert ("spark-b", "Apply netplan (file changed, or the live address/MTU differ from it)") in would
    assert checked.stats["spark-a"]["changed"] == 0
    assert _cat(test_cluster, "spark-b", "/etc/docker/daemon.json") == edited       # check mode changed nothing
    assert _mtu(test_cluster, "spark-b") == 1500

    # preflight names the node, the check and the fix for the MTU mismatch (wired into today's preflight)
    Path(_models(test_cluster, "spark-a"), MODEL).mkdir(parents=True, exist_ok=True)
    for n in ("spark-a", "spark-b"):
        for d in (MODEL, DRAFTER):
            (_models(test_cluster, n) / d).mkdir(parents=True, exist_ok=True)
    code, _, err = cli("preflight", "--profile", "d5")
    assert code == 3, err
    assert "[spark-b] fabric mtu equal: fabric mtu differs between the ends: 9000 on spark-a, 1500 on spark-b" in err
    assert "sparkctl prepare --tags fabric" in err

    repaired = prepare(env["inv"])
    assert repaired.stats["spark-a"]["changed"] == 0 and repaired.stats["spark-b"]["changed"] >= 2
    assert _mtu(test_cluster, "spark-b") == 9000
    assert json.loads(_read(test_cluster, "spark-b", "/etc/docker/daemon.json"))["log-opts"]["max-file"] == "3"


def test_models_synced_node_to_node_then_preflight_compares_manifests(test_cluster, env, cli):
    a, b = _models(test_cluster, "spark-a"), _models(test_cluster, "spark-b")
    (a / MODEL / "sub").mkdir(parents=True, exist_ok=True)
    (a / MODEL / "model.safetensors").write_bytes(os.urandom(2_000_000))
    (a / MODEL / "config.json").write_text('{"architectures": ["Glm"]}\n')
    (a / MODEL / "sub" / "tokenizer.json").write_text("{}\n")
    (b / MODEL / "stale.bin").write_bytes(b"only on b")                      # an extra file the source lacks
    (b / DRAFTER / "draft.safetensors").write_bytes(os.urandom(300_000))   # the drafter only on rank 1

    code, out, err = cli("prepare", "--profile", "d5", "--tags", "models", "--json")
    assert code == 0, err
    runs = json.loads(out)["runs"]
    assert [r["playbook"] for r in runs] == ["models.yml"]
    assert "[spark-a] changed: Rsync over the fabric" in err
    assert _digests(a / MODEL) == _digests(b / MODEL) and len(_digests(a / MODEL)) == 3
    assert _digests(a / DRAFTER) == _digests(b / DRAFTER) and _digests(a / DRAFTER)
    for root in (a, b):   # the manifest next to each model directory, in sha256sum -c format
        lines = (root / f"{MODEL}.sha256").read_text().splitlines()
        assert sorted(ln.split("  ", 1)[1] for ln in lines) == ["config.json", "model.safetensors",
                                                               "sub/tokenizer.json"]
    code, out, err = cli("prepare", "--profile", "d5", "--tags", "models", "--json")
    assert code == 0, err
    assert all(s["changed"] == 0 for s in json.loads(out)["stats"].values())

    code, out, err = cli("preflight", "--profile", "d5", "--json")
    assert code == 0, err
    parity = {c["name"]: c for c in json.loads(out)["checks"] if c["name"].endswith("parity")}
    assert parity["model parity"]["ok"] and "same checksums on spark-a, spark-b" in parity["model parity"]["seen"]
    assert "recomputed" not in parity["model parity"]["seen"]        # compared, not recomputed: nothing changed

    # one file differs on spark-b, the drafter is gone from spark-b: both named, with node, check and fix
    with open(b / MODEL / "config.json", "a") as f:
        f.write(" ")
    for p in (b / DRAFTER).iterdir():
        p.unlink()
    (b / DRAFTER).rmdir()
    code, _, err = cli("preflight", "--profile", "d5")
    assert code == 3, err
    assert ("[spark-b] model parity: model /models/GLM-5.3-Flash-NVFP4 differs between spark-a and spark-b: "
            "1 file(s) differ or are missing, 0 extra (config.json)") in err
    assert ("drafter parity: drafter /models/GLM-5.3-Flash-DFlash2 is not on spark-b (directory missing) but is "
            "on spark-a -> sparkctl prepare --tags models --profile PROFILE") in err
    code, _, err = cli("prepare", "--profile", "d5", "--tags", "models")
    assert code == 0, err
    assert _digests(a / MODEL) == _digests(b / MODEL) and _digests(a / DRAFTER) == _digests(b / DRAFTER)


def test_facts_per_node(test_cluster, env, cli):
    code, out, err = cli("facts", "--profile", "d5", "--json")
    assert code == 0, err
    found = json.loads(out)
    for n in ("spark-a", "spark-b"):
        f = found[n]
        assert f["gpu"] == {"name": "NVIDIA GB10", "driver": "580.95.05", "cuda": "13.0"}   # stand-in: a capture
        address = test_cluster.node(n).fabric_address
        assert f["fabric"] == {"interface": FABRIC, "state": "UP", "mtu": 9000,                # real: the veth
                               "ipv4": [address], "address": address, "holds_address": True}
        assert "nvidia" in f["docker"]["runtimes"] and f["memory_gib"] > 0
        assert {(r["hca"], r["up"]) for r in f["roce"]} >= {("rocep1s0f0", True)}
        assert f["models"][MODEL]["status"] == "cached" and f["models"][MODEL]["files"] == 3


def test_preflight_warns_when_the_fabric_key_is_missing(test_cluster, env, cli):
    test_cluster.run_in_root("spark-a", ["mv", "/root/.ssh/sparkctl_fabric_ed25519", "/root/fabric.moved"])
    try:
        code, out, err = cli("preflight", "--profile", "d5", "--json")
        assert code == 0, err     # serving does not need it; node-to-node copies do: a warning with its fix
        ssh = next(c for c in json.loads(out)["checks"] if c["name"] == "fabric ssh spark-b")
        assert ssh["node"] == "spark-a"
        assert ssh["severity"] == "warning" and ssh["ok"]
        assert ssh["seen"].startswith("the fabric SSH key ~/.ssh/sparkctl_fabric_ed25519 is missing on spark-a")
        assert ssh["fix"] == "sparkctl prepare --tags fabric-ssh"
    finally:
        test_cluster.run_in_root("spark-a", ["mv", "/root/fabric.moved", "/root/.ssh/sparkctl_fabric_ed25519"])
    code, out, err = cli("preflight", "--profile", "d5", "--json")
    assert code == 0, err
    ssh = next(c for c in json.loads(out)["checks"] if c["name"] == "fabric ssh spark-b")
    assert ssh["ok"] and ssh["seen"] == "spark-a reaches spark-b over the fabric"


def test_fabric_ssh_drift_is_found_by_the_state_read_and_repaired(test_cluster, env):
    """A no-change run skips the fabric-SSH tasks on what its first task read; drift must still make them run:
    rank 0's private key gone, the peer's authorized_keys entry gone, known_hosts with a loose mode."""
    key = "/root/.ssh/sparkctl_fabric_ed25519"
    old_pub = _cat(test_cluster, "spark-a", key + ".pub")
    test_cluster.run_in_root("spark-a", ["rm", "-f", key])
    test_cluster.run_in_root("spark-b", ["sh", "-c", "grep -v 'sparkctl fabric' /root/.ssh/authorized_keys >/tmp/ak; "
                                         "cat /tmp/ak >/root/.ssh/authorized_keys"])
    test_cluster.run_in_root("spark-a", ["chmod", "644", "/root/.ssh/sparkctl_fabric_known_hosts"])

    res = prepare(env["inv"], tags=["fabric-ssh"])
    changed = {(r.host, r.task) for run in res.runs for r in run.changed()}
    assert ("spark-a", "Fabric key on rank 0 (made once), its public half read") in changed
    assert ("spark-b", "Peers accept rank 0's fabric key (only from rank 0's fabric address)") in changed
    assert ("spark-a", "Rank 0 knows its peers' fabric host keys") in changed
    new_pub = _cat(test_cluster, "spark-a", key + ".pub")
    assert new_pub and new_pub != old_pub                          # a new key pair, both halves
    assert new_pub.split()[1] in _read(test_cluster, "spark-b", "/root/.ssh/authorized_keys")
    mode = test_cluster.run_in_root("spark-a", ["stat", "-c", "%a", "/root/.ssh/sparkctl_fabric_known_hosts"])
    assert mode.stdout.strip() == "600"
    reached = [r for run in res.runs for r in run.results
               if r.task == "Rank 0 reaches each peer over the fabric" and r.host == "spark-a"]
    assert reached and all(r.status == "ok" for r in reached)      # proved at the end, after the repairs

    again = prepare(env["inv"])
    assert {h: s["changed"] for h, s in again.stats.items()} == {"spark-a": 0, "spark-b": 0}
    ran = {r.task for run in again.runs for r in run.results if r.status != "skipped"}
    assert ran == {"Directories made, files prepare changes kept as they were (once), Docker, daemon.json and the "
                   "fabric link read"}, ran                        # one round trip: everything else was in force


def test_unreachable_host_named_and_a_rerun_picks_up(test_cluster, env, monkeypatch):
    test_cluster.run_in_root("spark-b", ["rm", "/etc/docker/daemon.json"])   # something for the re-run to fix
    test_cluster.stop_sshd("spark-b")
    # a fresh state directory: no SSH master connection of an earlier run (ControlPersist) outlives the sshd
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(env["tmp"] / "state-unreachable"))
    try:
        with pytest.raises(NodeError) as exc:
            prepare(env["inv"], tags=["docker"])
        err = exc.value
        assert err.where == "[spark-b] prepare.yml" and "spark-b is up and its sshd answers" in (err.hint or "")
        assert f"{test_cluster.node('spark-b').mgmt_address} port 22: Connection refused" in err.render()
    finally:
        test_cluster.start_sshd("spark-b")
    again = prepare(env["inv"], tags=["docker"])
    assert again.stats["spark-a"]["changed"] == 0 and again.stats["spark-b"]["changed"] >= 1
    assert json.loads(_read(test_cluster, "spark-b", "/etc/docker/daemon.json"))["log-opts"]


def test_sudo_password_needed_and_not_given(test_cluster, env):
    node = "spark-b"
    test_cluster.run_in_root(node, ["useradd", "--create-home", "--shell", "/bin/bash", "deploy"])
    test_cluster.run_in_root(node, ["chpasswd"], input="deploy:s3cret-test\n")
    test_cluster.run_in_root(node, ["tee", "/etc/sudoers.d/deploy"], input="deploy ALL=(ALL:ALL) ALL\n")
    pub = test_cluster.ssh_key_path.with_suffix(".pub").read_text()
    test_cluster.run_in_root(node, ["install", "-d", "-o", "deploy", "-m", "700", "/home/deploy/.ssh"])
    test_cluster.run_in_root(node, ["tee", "/home/deploy/.ssh/authorized_keys"], input=pub)
    test_cluster.run_in_root(node, ["chown", "deploy", "/home/deploy/.ssh/authorized_keys"])
    doc = yaml.safe_load(env["path"].read_text())
    doc["all"]["children"]["sparks"]["hosts"][node]["ansible_user"] = "deploy"
    path = env["tmp"] / "deploy-inventory.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = _cat(test_cluster, node, "/etc/docker/daemon.json")
    with pytest.raises(NodeError) as exc:
        prepare(load_inventory(path), tags=["docker"])
    assert exc.value.where == f"[{node}] prepare.yml"
    assert "sudo" in exc.value.message.lower() and "password" in exc.value.message.lower()
    assert "--ask-become-pass" in (exc.value.hint or "")
    assert _cat(test_cluster, node, "/etc/docker/daemon.json") == before
    done = prepare(load_inventory(path), tags=["docker"], become_password="s3cret-test")
    assert done.stats[node]["failed"] == 0
    assert "docker" in test_cluster.run_in_root(node, ["id", "-nG", "deploy"]).stdout.split()


def test_netplan_that_does_not_validate_keeps_the_previous_file(test_cluster, env):
    node = "spark-b"
    previous = _cat(test_cluster, node, "/etc/netplan/40-sparkctl-fabric.yaml")
    doc = yaml.safe_load(env["path"].read_text())
    doc["all"]["children"]["sparks"]["hosts"][node]["prepare_fabric_mtu"] = 8000   # a change to validate
    path = env["tmp"] / "mtu8000-inventory.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    test_cluster.run_in_root(node, ["tee", "/etc/netplan/50-broken.yaml"],
                             input="network:\n  version: 2\n  ethernets:\n    eth9:\n      mtu: lots\n")
    test_cluster.run_in_root(node, ["chmod", "600", "/etc/netplan/50-broken.yaml"])
    try:
        with pytest.raises(NodeError) as exc:
            prepare(load_inventory(path), tags=["fabric"])
        err = exc.value
        assert err.where == f"[{node}] prepare.yml" and "Fabric netplan file" in err.message
        assert "50-broken.yaml" in err.render() and "invalid unsigned int value 'lots'" in err.render()
        assert "the previous one is still in force" in (err.hint or "")
        assert _cat(test_cluster, node, "/etc/netplan/40-sparkctl-fabric.yaml") == previous
        assert _mtu(test_cluster, node) == 9000
    finally:
        test_cluster.run_in_root(node, ["rm", "-f", "/etc/netplan/50-broken.yaml"])
    assert prepare(env["inv"], tags=["fabric"]).stats[node]["failed"] == 0


def _digests_in(cluster: TestCluster, node: str, path: Path) -> dict[str, str]:
    """Checksums of the files under ``path`` as the node sees them (a mount inside the node is not visible
    from the controller)."""
    out = cluster.run_in_root(node, ["sh", "-c", 'cd "$1" && find . -type f -not -path "./.rsync-partial/*" '
                                     "-exec sha256sum {} +", "_", str(path)]).stdout
    return {ln.split("  ", 1)[1][2:]: ln.split("  ", 1)[0] for ln in out.splitlines() if ln.strip()}


def test_disk_full_during_model_sync_then_a_rerun_finishes(test_cluster, env, cli):
    prepare(env["inv"], tags=["fabric-ssh"])          # the fabric key (already there when run in module order)
    a, b = _models(test_cluster, "spark-a"), _models(test_cluster, "spark-b")
    big = MODEL
    (a / big).mkdir(parents=True, exist_ok=True)
    for i in range(4):
        (a / big / f"shard-{i}.safetensors").write_bytes(os.urandom(600_000))
    (a / DRAFTER).mkdir(parents=True, exist_ok=True)             # the profile's drafter (present in module order)
    (a / DRAFTER / "draft.safetensors").write_bytes(b"d" * 1000)
    target = b / big
    target.mkdir(parents=True, exist_ok=True)
    # a small tmpfs over the model directory inside spark-b's own mount namespace: the disk fills mid-sync
    test_cluster.run_in_root("spark-b", ["mount", "-t", "tmpfs", "-o", "size=1500k", "tmpfs", str(target)])
    try:
        code, _, err = cli("prepare", "--profile", "d5", "--tags", "models")
        assert code == 7, err
        assert "[spark-a] models.yml: task 'Rsync over the fabric' failed" in err
        assert "No space left on device" in err and "free space under host_paths.models" in err
        src = _digests(a / big)
        partial = _digests_in(test_cluster, "spark-b", target)
        for rel, digest in partial.items():     # nothing half-written under a final name
            assert src.get(rel) == digest, rel
        assert 0 < len(partial) < len(src), partial
        test_cluster.run_in_root("spark-b", ["mount", "-o", "remount,size=8m", str(target)])
        code, _, err = cli("prepare", "--profile", "d5", "--tags", "models")
        assert code == 0, err
        sent = _read(test_cluster, "spark-a", f"/var/lib/sparkctl/prepare/sync-{big}-spark-b.list").split()
        assert sorted(sent) == sorted(set(src) - set(partial))     # only the rest was sent
        assert _digests_in(test_cluster, "spark-b", target) == src
    finally:
        test_cluster.run_in_root("spark-b", ["umount", str(target)], check=False)


def test_restore_brings_back_the_previous_files(test_cluster, env):
    result = prepare(env["inv"], restore=True)
    assert all(s["failed"] == 0 for s in result.stats.values())
    for n in ("spark-a", "spark-b"):
        assert _cat(test_cluster, n, "/etc/docker/daemon.json") == env["original"][n]
        assert _cat(test_cluster, n, "/etc/netplan/40-sparkctl-fabric.yaml") is None
    assert prepare(env["inv"], tags=["docker", "fabric"]).stats["spark-b"]["changed"] > 0   # prepares again


def test_check_on_a_host_without_the_docker_group_reports_and_changes_nothing(test_cluster, env):
    """--check where the group is missing (a fresh host): the group task says it would make it; the membership
    task, which would fail on the missing group in check mode, waits for the real run."""
    test_cluster.run_in_root("spark-b", ["groupdel", "docker"])
    try:
        checked = prepare(env["inv"], check=True, tags=["docker"])
        assert all(s["failed"] == 0 for s in checked.stats.values()), checked.stats
        would = {(r.host, r.task) for run in checked.runs for r in run.changed()}
        assert ("spark-b", "The docker group exists") in would and checked.stats["spark-a"]["changed"] == 0
        assert test_cluster.run_in_root("spark-b", ["getent", "group", "docker"], check=False).returncode == 2
    finally:
        done = prepare(env["inv"], tags=["docker"])
    assert done.stats["spark-b"]["changed"] >= 2                              # the group, then the membership
    assert "docker" in test_cluster.run_in_root("spark-b", ["id", "-nG", "root"]).stdout.split()
