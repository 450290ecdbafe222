"""`sparkctl up` for real over SSH and Docker on the two-node test cluster (tests/cluster/conftest.py).

Each node is a network namespace with its own sshd and dockerd; the engine image's
`python3 -m sglang.launch_server` is sparkctl's emulator, so only the GPU engine is a stand-in.
"""
from __future__ import annotations

import json
import resource
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.nodes.container import MEMLOCK_ENV
from sparkctl.state.ledger import Ledger
from testrig.cluster import TestCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

SIM = {"boot_s": 3.0, "decode_tps": 2000, "peer_timeout_s": 5}
FABRIC = "enp1s0f0np0"


def _derived_inventory(test_cluster: TestCluster, tmp_path: Path, name: str = "inv.yml", **host_overrides) -> Path:
    """The cluster's generated inventory plus fast emulator knobs (and optional per-host overrides)."""
    doc = yaml.safe_load(Path(test_cluster.inventory_path).read_text())
    doc["all"]["vars"]["sparkctl_sim"] = SIM
    doc["all"]["vars"]["sparkctl_cluster"] = f"{doc['all']['vars']['sparkctl_cluster']}-{tmp_path.name[-12:]}"
    for host, overrides in host_overrides.items():
        doc["all"]["children"]["sparks"]["hosts"][host].update(overrides)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def cluster_env(test_cluster: TestCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path):
    """Point sparkctl at the test cluster; stop every engine container this test created at teardown."""
    inv = _derived_inventory(test_cluster, tmp_path)
    for node in load_inventory(inv).nodes:   # the shipped profiles' model and drafter, as empty directories
        for name in ("GLM-5.3-Flash-NVFP4", "GLM-5.3-Flash-DFlash2"):
            Path(node.host_paths.models, name).mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(inv))
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    if hard != resource.RLIM_INFINITY:  # this sandbox's dockerd cannot raise RLIMIT_MEMLOCK
        monkeypatch.setenv(MEMLOCK_ENV, str(hard))
    yield inv
    for name in ("spark-a", "spark-b"):
        test_cluster.link_up(name)
    cluster = load_inventory(inv).cluster.name
    for name in ("spark-a", "spark-b"):
        ids = _docker(test_cluster, name, "ps", "-aq", "--filter", f"label=sparkctl.cluster={cluster}").split()
        if ids:
            _docker(test_cluster, name, "rm", "-f", *ids)


def _docker(test_cluster: TestCluster, node: str, *args: str) -> str:
    res = test_cluster.run_on(node, ["docker", "-H", test_cluster.docker_host(node), *args], check=False)
    return res.stdout


def _running(test_cluster: TestCluster, node: str, cluster: str) -> list[str]:
    out = _docker(test_cluster, node, "ps", "--filter", f"label=sparkctl.cluster={cluster}",
                  "--format", '{{.Names}} {{.Label "sparkctl.deployment"}}')
    return [line for line in out.splitlines() if line.strip()]


def _up(cli, *args: str) -> tuple[int, dict | None, str]:
    code, out, err = cli("up", *args, "--yes", "--json")
    return code, (json.loads(out) if out.strip() else None), err


def test_up_status_rollback_down_over_ssh_and_docker(cli, test_cluster, cluster_env):
    code, first, err = _up(cli, "--profile", "d5")
    assert code == 0 and first is not None, err
    assert first["outcome"] == "deployed" and first["emulated"] is True
    assert first["endpoint"] == "http://198.19.0.1:30000" or first["endpoint"].endswith(":30000")
    assert all(g["ok"] for g in first["gates"])
    assert err.index("[spark-b] rank 1 started") < err.index("[spark-a] rank 0 started")
    code, out, err = cli("status", "--json")
    st = json.loads(out)
    assert code == 0 and st["healthy"] and st["profile"] == "d5" and st["speculative_algorithm"] == "DFLASH"
    assert [r["alive"] for r in st["ranks"]] == [True, True]

    code, off, err = _up(cli, "--profile", "dflash-off")
    assert code == 0 and off is not None and off["outcome"] == "deployed", err
    cluster = load_inventory(cluster_env).cluster.name
    # the previous engine's containers are kept stopped (not removed) so rollback can restart them
    stopped = _docker(test_cluster, "spark-a", "ps", "-a",
                      "--filter", f"label=sparkctl.deployment={first['deployment']}",
                      "--format", "{{.State}}").split()
    assert stopped == ["exited"]

    code, out, err = cli("rollback", "--yes", "--json")
    assert code == 0, err
    code, out, err = cli("status", "--json")
    assert json.loads(out)["profile"] == "d5" and json.loads(out)["healthy"]
    # only the deployment just superseded (dflash-off) stays stopped for a fast rollback; older ones are removed
    def states(dep: str) -> list[str]:
        return _docker(test_cluster, "spark-b", "ps", "-a", "--filter", f"label=sparkctl.deployment={dep}",
                       "--format", "{{.State}}").split()
    assert states(off["deployment"]) == ["exited"] and states(first["deployment"]) == []
    code, out, err = cli("logs", "--rank", "1", "--tail", "20")
    assert code == 0 and "Dummy health check server started" in out

    code, out, err = cli("down", "--yes", "--json")
    assert code == 0 and json.loads(out)["changed"]
    assert _running(test_cluster, "spark-a", cluster) == [] and _running(test_cluster, "spark-b", cluster) == []


def _when_rank1_container_runs(test_cluster: TestCluster, cluster: str, exclude: str | None,
                               action) -> threading.Thread:
    """Run `action(container_name)` once a rank-1 container of a new deployment runs on spark-b (bounded wait)."""
    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for line in _running(test_cluster, "spark-b", cluster):
                name, _, dep = line.partition(" ")
                if "rank1" in name and dep != exclude:
                    action(name)
                    return
            time.sleep(0.2)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_rank1_container_killed_during_boot_fails_and_rolls_back(cli, test_cluster, cluster_env):
    code, prev, err = _up(cli, "--profile", "dflash-off")
    assert code == 0 and prev is not None, err
    cluster = load_inventory(cluster_env).cluster.name
    killer = _when_rank1_container_runs(test_cluster, cluster, prev["deployment"],
                                        lambda name: _docker(test_cluster, "spark-b", "kill", name))
    code, _, err = _up(cli, "--profile", "d5")
    killer.join(timeout=5)
    assert code == 4, err
    assert "spark-b" in err and "rank 1" in err and f"restored {prev['deployment']}" in err
    code, out, _ = cli("status", "--json")
    st = json.loads(out)
    assert st["active"] == prev["deployment"] and st["healthy"]


def test_fabric_link_down_during_boot_times_out_with_evidence_then_preflight_reports_it(cli, test_cluster,
                                                                                         cluster_env):
    cluster = load_inventory(cluster_env).cluster.name
    cutter = _when_rank1_container_runs(test_cluster, cluster, None,
                                        lambda name: test_cluster.link_down("spark-b", FABRIC))
    t0 = time.monotonic()
    code, _, err = _up(cli, "--profile", "d5", "--boot-timeout", "40")
    cutter.join(timeout=5)
    assert code == 4, err
    assert time.monotonic() - t0 < 120
    assert "log tail" in err and ("nccl" in err.lower() or "not ready within" in err)
    # second try: preflight (read-only) names the node and the fabric problem; nothing is started
    code, _, err = _up(cli, "--profile", "d5")
    assert code == 3, err
    assert FABRIC in err and ("spark-b" in err or "spark-a" in err) and "preflight" in err
    assert _running(test_cluster, "spark-a", cluster) == [] and _running(test_cluster, "spark-b", cluster) == []


def test_wrong_fabric_interface_is_a_preflight_error(cli, test_cluster, cluster_env, tmp_path, monkeypatch):
    inv = _derived_inventory(test_cluster, tmp_path, "wrong.yml", **{"spark-b": {"fabric_interface": "enp9s9f9np9"}})
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(inv))
    code, _, err = _up(cli, "--profile", "d5")
    assert code == 3 and "[spark-b] preflight" in err and "enp9s9f9np9" in err


def test_changed_host_key_is_refused(cli, test_cluster, cluster_env):
    test_cluster.rotate_host_key("spark-b")
    try:
        code, _, err = _up(cli, "--profile", "d5")
        assert code == 3, err
        assert "spark-b" in err and "host key" in err.lower() and "ssh-keygen -R" in err
    finally:
        test_cluster.restore_host_keys()


def test_node_ssh_down_is_named_and_nothing_starts_elsewhere(cli, test_cluster, cluster_env):
    cluster = load_inventory(cluster_env).cluster.name
    test_cluster.stop_sshd("spark-b")
    try:
        t0 = time.monotonic()
        code, _, err = _up(cli, "--profile", "d5")
        assert code == 3, err
        assert "[spark-b]" in err and "198.19." in err and time.monotonic() - t0 < 60
        assert _running(test_cluster, "spark-a", cluster) == []
    finally:
        test_cluster.start_sshd("spark-b")
    assert Ledger.for_cluster(cluster).index()["active"] is None


def test_image_missing_on_one_node_is_copied_and_a_mismatch_is_refused(cli, test_cluster, cluster_env):
    image, original = test_cluster.engine_image, test_cluster.engine_image_id
    cluster = load_inventory(cluster_env).cluster.name

    def image_id(node: str) -> str:
        return _docker(test_cluster, node, "image", "inspect", "--format", "{{.Id}}", image).strip()
    try:
        # A different image under the same tag on spark-b (the docker client reaches that node's daemon by its
        # socket): refused before anything starts.
        res = subprocess.run(["docker", "-H", test_cluster.docker_host("spark-b"), "build", "-q", "-t", image, "-"],
                             input=f"FROM {original}\nLABEL sparkctl.test=odd\n", capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 0, res.stderr
        assert image_id("spark-b") != original
        code, _, err = _up(cli, "--profile", "d5")
        assert code == 3, err
        assert "differs between nodes" in err and "spark-b" in err
        assert _running(test_cluster, "spark-a", cluster) == [] and _running(test_cluster, "spark-b", cluster) == []
        ledger = Ledger.for_cluster(cluster)
        refused = ledger.load(ledger.index()["history"][-1])      # recorded as the image stage's failure,
        assert refused.failure is not None
        assert refused.failure.step == "image-distribute" and "differs between nodes" in refused.failure.message
        assert refused.preflight and all(c.ok for c in refused.preflight)   # with the checks that passed
        # Missing on spark-b: streamed from spark-a, then the deployment runs with one image ID on both nodes.
        _docker(test_cluster, "spark-b", "rmi", "-f", image)
        code, out, err = _up(cli, "--profile", "d5")
        assert code == 0 and out is not None, err
        assert "copying it from spark-a" in err and "image copied from spark-a" in err
        assert image_id("spark-a") == image_id("spark-b") == original
        code, out, _ = cli("status", "--json")
        assert set(json.loads(out)["image_ids"].values()) == {original}
        cli("down", "--yes")
    finally:
        if image_id("spark-b") != original:
            _docker(test_cluster, "spark-b", "rmi", "-f", image)
            test_cluster.ensure_engine_image()


def test_missing_drafter_is_a_preflight_error(cli, test_cluster, cluster_env, profiles_dir):
    (profiles_dir / "nodrafter.yml").write_text("extends: d5\nspeculative: {draft_model_path: /models/absent}\n")
    code, _, err = _up(cli, "--profile", "nodrafter")
    assert code == 3, err
    assert "drafter: /models/absent not found" in err and "srv/spark-" in err


def test_api_key_and_hf_token_never_in_docker_inspect_ps_or_logs(cli, test_cluster, cluster_env, monkeypatch,
                                                                  state_dir):
    """Secrets reach the engine container as 0400 files on the node's tmpfs (bind-mounted read-only), not as argv
    or env: `docker inspect`, the node's process table, `sparkctl logs`, archived logs and the ledger hold none."""
    key, token = "sk-cluster-5a4b3c2d1e", "hf_CLUSTERtoken9876543210"
    monkeypatch.setenv("SPARKCTL_API_KEY", key)
    monkeypatch.setenv("HF_TOKEN", token)
    code, first, err = _up(cli, "--profile", "d5")
    assert code == 0 and first is not None, err
    cluster = load_inventory(cluster_env).cluster.name
    for node in ("spark-a", "spark-b"):
        names = [ln.split()[0] for ln in _running(test_cluster, node, cluster)]
        assert len(names) == 1
        inspect = _docker(test_cluster, node, "inspect", names[0])
        assert inspect and key not in inspect and token not in inspect
        info = json.loads(inspect)[0]
        assert "HF_TOKEN_PATH=/run/sparkctl-secrets/hf-token" in info["Config"]["Env"]
        assert "--config" in info["Config"]["Cmd"] and "--api-key" not in info["Config"]["Cmd"]
        mount = next(m for m in info["Mounts"] if m["Destination"] == "/run/sparkctl-secrets")
        assert mount["RW"] is False and mount["Source"] == f"/dev/shm/sparkctl-secrets/{names[0]}"
        # the node's own /dev/shm, as its SSH sessions and its dockerd see it (testrig Node.shm_dir)
        modes = test_cluster.run_in_root(node, ["stat", "-c", "%a %n", mount["Source"], f"{mount['Source']}/hf-token",
                                           f"{mount['Source']}/engine-secrets.yaml"]).stdout.split("\n")
        assert [m.split()[0] for m in modes if m] == ["700", "400", "400"]
        ps = test_cluster.run_on(node, ["ps", "-ww", "-eo", "args"]).stdout     # -ww: a long argv never cut (COLUMNS)
        assert "sglang.launch_server" in ps and key not in ps and token not in ps
    code, logs_out, err = cli("logs", "--rank", "0", "--tail", "0")
    assert code == 0 and "server_args=" in logs_out and key not in logs_out
    assert "api_key='***'" in logs_out or "'api_key': '***'" in logs_out
    code, out, err = cli("down", "--yes")
    assert code == 0, err
    for node in ("spark-a", "spark-b"):
        listed = test_cluster.run_in_root(node, ["ls", "-A", "/dev/shm/sparkctl-secrets"], check=False)
        assert listed.stdout.strip() == "", listed
    stored = [p for p in state_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in stored)          # the archived engine logs
    for p in stored:
        text = p.read_text(errors="replace")
        assert key not in text and token not in text, p
