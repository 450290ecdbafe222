"""The mission's own path on the real engine: real SGLang 0.5.23 TP=2 in containers on the SSH + Docker test
cluster, from the images `sparkctl up` builds with the GB10 patch series applied to the real source.

One deployment shared by the module, in order (each real TP=2 boot costs 40-180 s on 2 cores):
`up` (the engine image built FROM the real-engine base with gb10-0.5.23 applied inside `docker build`, the launch
image with the rendered flags, copied to spark-b over the fabric, verified on both; rank 1 then rank 0 in containers
on two network namespaces, the TCP store and the collectives on the fabric's addresses; warm-up; every gate judged
from the real server; hand-off) -> the patched files are what the running container imports -> `status`, `logs
--rank 1` -> a small `bench` card -> `rollback --to` a profile that differs in one flag (only the launch image is
built and only its layer copied) -> `watch` restarts a `docker kill`ed rank 1 as a pair -> `down` leaves no container
and no process.

The base (testrig.realengine.base_image) stands in for a Spark's production base: the CPU torch, g++ for torch's
kernel compiler, no CUDA. What it cannot show: CUDA graphs, NCCL over RoCE, the GB10 kernels the patches change
(docs/testing.md). Markers: `cluster` (the test cluster's group) and `real_engine`, so `-m "cluster and
real_engine"` selects exactly these; under CI=true nothing here skips.
"""
from __future__ import annotations

import hashlib
import json
import re
import resource
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.images import manage, pipeline
from sparkctl.images.patchapply import apply_series, parse_patch, read_series
from sparkctl.images.series import ensure_wheel, patches_dir, unpack_package
from sparkctl.nodes.container import MEMLOCK_ENV
from sparkctl.nodes.handles import DockerHandle
from sparkctl.prepare.plays import prepare
from sparkctl.state.ledger import Ledger
from testrig.cluster import TestCluster
from testrig.controller import SparkctlProcess, passed_gates
from testrig.realengine.base_image import ensure_real_engine_base, write_real_engine_cluster_inventory
from testrig.testenv import need_real_engine, run_salt

# Its own cluster (real_engine_cluster) and its own xdist group (tests/conftest.py LONG_GROUPS): beside the local real
# engine tier (loopback, the host network namespace), this engine listens only in the two nodes' namespaces
pytestmark = [pytest.mark.cluster, pytest.mark.real_engine, pytest.mark.xdist_group("real_engine_cluster"),
              pytest.mark.timeout(1800)]
SHIPPED_D5 = True          # boots no d5: the cluster conftest's d5 fixture stays out of the way
RUN = run_salt()   # a flag value per run (launch images cached by an earlier run never match), within bounds
SERIES = "gb10-0.5.23"
DIST_PORT = 26000          # cpu-tiny's api.dist_port (SGLang's TCP store)
Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture(scope="module")
def real(real_engine_cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """The real-engine base on both nodes, an inventory of the cluster for it, two profiles FROM that base."""
    engine = need_real_engine()
    test_cluster = real_engine_cluster
    base = ensure_real_engine_base(test_cluster)
    root = tmp_path_factory.mktemp("real-containers")
    name = f"realdocker-{root.name[-8:]}"
    inv = write_real_engine_cluster_inventory(test_cluster, root / "inventory.yml", engine, name=name)
    profiles = root / "profiles"
    profiles.mkdir()
    # One flag differs between the two: SGLang's watchdog (a launch flag only), per run.
    (profiles / "rc1.yml").write_text(f"extends: cpu-tiny\ndescription: real SGLang in containers\n"
                                      f"image:\n  base_image: {base}\nserver:\n  watchdog_timeout: {600 + RUN}\n")
    (profiles / "rc2.yml").write_text(f"extends: rc1\nserver:\n  watchdog_timeout: {601 + RUN}\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKCTL_INVENTORY", str(inv))
        mp.setenv("SPARKCTL_STATE_DIR", str(root / "state"))
        mp.setenv("SPARKCTL_PROFILES_DIR", str(profiles))
        mp.delenv("SPARKCTL_API_KEY", raising=False)
        hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
        if hard != resource.RLIM_INFINITY:   # this sandbox's dockerd cannot raise RLIMIT_MEMLOCK
            mp.setenv(MEMLOCK_ENV, str(hard))
        inventory = load_inventory(inv)
        prepare(inventory, tags=["fabric-ssh"])   # as a user's `sparkctl prepare`: the copy streams over the fabric
        conns = pipeline.connections(inventory)
        try:
            yield {"inv": inv, "inventory": inventory, "cluster": test_cluster, "name": name, "base": base,
                   "conns": conns, "ledger": Ledger.for_cluster(name)}
        finally:
            for conn in conns.values():
                ids = conn.run(["docker", "ps", "-aq", "--filter", f"label=sparkctl.cluster={name}"]).stdout.split()
                if ids:
                    conn.run(["docker", "rm", "-f", *ids], timeout=120)
            # the launch images of this run go; the engine image (same base + series next run) stays cached
            engines = {t for row in manage.list_images(conns) if row.get("role") == "engine"
                       for t in row.get("tags", [])}
            manage.prune_images(conns, keep={str(t) for t in engines})


def _docker(real: dict, node: str, *args: str) -> str:
    cluster: TestCluster = real["cluster"]
    return cluster.run_on(node, ["docker", "-H", cluster.docker_host(node), *args], check=False).stdout


def _containers(real: dict, node: str, *, all_states: bool = False) -> list[str]:
    flags = ["-a"] if all_states else []
    return _docker(real, node, "ps", *flags, "-q", "--filter", f"label=sparkctl.cluster={real['name']}").split()


def _status(cli: Cli) -> tuple[int, dict]:
    code, out, _ = cli("status", "--json")
    return code, json.loads(out)


def test_up_tp2_in_containers_from_the_built_image_over_the_fabric(cli: Cli, real: dict) -> None:
    code, out, err = cli("up", "--profile", "rc1", "--yes", "--json")
    assert code == 0, err[-5000:]
    res = json.loads(out)
    assert res["outcome"] == "deployed" and res["emulated"] is False, res
    gates = passed_gates(res)
    assert "tp_size=2" in gates["settings"]["evidence"]
    assert "max_total_num_tokens=16384" in gates["capacity"]["evidence"]        # from the real log's KV line
    assert "container" in gates["workers"]["evidence"]
    assert err.index("[spark-b] rank 1 started") < err.index("[spark-a] rank 0 started")
    assert "warm-up" in err and "cold request 1/2" in err
    # the images the pipeline built: the engine FROM the real-engine base with the series, the launch image on top
    rec = real["ledger"].load(res["deployment"])
    for node in ("spark-a", "spark-b"):
        img = rec.images[node]
        assert img.engine_tag.startswith(f"sparkctl/sglang-gb10:0.5.23-{SERIES}-") and img.engine_id
        assert img.launch_tag.startswith("sparkctl/sglang-gb10-launch:rc1-")
        (cid,) = _containers(real, node)
        info = json.loads(_docker(real, node, "inspect", cid))[0]
        assert info["Config"]["Image"] == img.launch_tag and info["State"]["Running"]
        assert info["HostConfig"]["NetworkMode"] == "host" and info["HostConfig"]["IpcMode"] == "host"
        models = next(m for m in info["Mounts"] if m["Destination"] == "/models")
        assert models["RW"] is False       # the node's model directory, read-only; the model is not in the image
    assert rec.images["spark-a"].engine_id == rec.images["spark-b"].engine_id
    assert rec.images["spark-a"].launch_id == rec.images["spark-b"].launch_id
    labels = json.loads(_docker(real, "spark-a", "image", "inspect", rec.images["spark-a"].engine_tag))[0][
        "Config"]["Labels"]
    assert labels["org.sparkctl.patch-series"] == SERIES and labels["org.sparkctl.base-image"] == real["base"]
    # the ranks talk over the fabric: rank 1's TCP store connection and the collectives' sockets run between the
    # nodes' fabric addresses, none over the management network
    cluster: TestCluster = real["cluster"]
    fab_a, fab_b = cluster.node("spark-a").fabric_address, cluster.node("spark-b").fabric_address
    mgmt_a = cluster.node("spark-a").mgmt_address
    conns = cluster.run_on("spark-b", ["ss", "-Htn", "state", "established"]).stdout
    pairs = [(ln.split()[-2], ln.split()[-1]) for ln in conns.splitlines() if len(ln.split()) >= 4]
    assert any(local.endswith(f"{fab_b}]:" + local.rsplit(":", 1)[1]) or local.startswith(f"{fab_b}:")
               for local, peer in pairs if peer.endswith(f"{fab_a}:{DIST_PORT}") or
               peer.endswith(f"{fab_a}]:{DIST_PORT}")), conns
    collectives = [p for p in pairs if fab_a in p[1] and not p[1].endswith(f":{DIST_PORT}")]
    assert collectives, conns                                          # gloo / ZMQ, rank 1 -> rank 0 over the fabric
    assert not any(mgmt_a in peer and not peer.endswith(":22") for _, peer in pairs), conns


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_patched_source_is_what_the_running_container_imports(cli: Cli, real: dict) -> None:
    """The files the series touches, as the running rank-0 container's python3 resolves the package the server
    imports, hash to the series applied to the released 0.5.23 source, and not to that source unpatched."""
    series_file = patches_dir() / SERIES / "series"
    _, patches = read_series(series_file)
    touched = sorted({fp.path.removeprefix("python/sglang/") for p in patches for fp in parse_patch(p.read_text())})
    with tempfile.TemporaryDirectory() as tmp:
        package = unpack_package(ensure_wheel("0.5.23"), Path(tmp), only=set(touched))
        original = {rel: _sha256((package / rel).read_text()) for rel in touched}
        results = apply_series(series_file, package)
        assert all(r.status == "applied" for r in results), [r.to_json() for r in results]
        patched = {rel: _sha256((package / rel).read_text()) for rel in touched}
    assert all(original[r] != patched[r] for r in touched)
    probe = ("import hashlib, importlib.util, json, os, sys\n"
             "d = os.path.dirname(importlib.util.find_spec('sglang').origin)\n"
             "print(json.dumps({'dir': d, 'files': {r: hashlib.sha256(open(os.path.join(d, r), encoding='utf-8')"
             ".read().encode()).hexdigest() for r in sys.argv[1:]}}))\n")
    (cid,) = _containers(real, "spark-a")
    seen = json.loads(_docker(real, "spark-a", "exec", cid, "python3", "-c", probe, *touched))
    assert seen["dir"] == "/usr/local/lib/python3.11/dist-packages/sglang", seen
    assert seen["files"] == patched, {r: (seen["files"][r] == patched[r]) for r in touched}
    # ... and that python3 is the server's: the serving processes run it with the same package directory
    ps = _docker(real, "spark-a", "exec", cid, "ps", "-eo", "args")
    assert "python3 -m sglang.launch_server" in ps, ps
    # `sparkctl image build` of the deployed profile: what up built is what the command builds (nothing to do)
    code, out, err = cli("image", "build", "--profile", "rc1", "--json")
    assert code == 0, err[-3000:]
    code, out, err = cli("image", "verify", "--profile", "rc1", "--json")
    assert code == 0, err[-3000:]


def test_status_and_the_rank1_log_are_the_real_servers(cli: Cli, real: dict) -> None:
    code, st = _status(cli)
    assert code == 0 and st["healthy"] and st["profile"] == "rc1", st
    assert [r["alive"] for r in st["ranks"]] == [True, True], st["ranks"]
    code, out, err = cli("logs", "--rank", "1", "--tail", "400")
    assert code == 0, err
    assert "TP1] Init parallel begin" in out and "Dummy health check server" in out or "TP1]" in out, out[-2000:]
    r = httpx.get(st["endpoint"] + "/v1/models", timeout=30, trust_env=False)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "tiny-qwen2"


def test_a_small_bench_card_from_the_real_engine_in_containers(cli: Cli, real: dict, tmp_path: Path) -> None:
    code, out, err = cli("bench", "--runs", "1", "--max-tokens", "16", "--warmup", "0", "--ttft-sizes", "128",
                         "--ttft-runs", "1", "--concurrency", "1", "--g6-max-tokens", "8",
                         "--out", str(tmp_path / "card"), "--json")
    assert code == 0, err[-3000:]
    card = json.loads((tmp_path / "card" / "report.json").read_text())
    assert card["emulated"] is False and card["status"] == "successful", card.get("status")
    # every run generated its 16 tokens, and decode is measured; or, for a class whose whole answer came in one read,
    # the card says so instead of a number (the engine's incremental detokenizer holds the tiny random model's byte
    # tokens until they decode: a test run once got the code answer in one read at the end, TTFT 0.39 s of 3.24 s)
    classes = card["arms"][0]["results"]["decode"]["classes"]
    assert all(r["completion_tokens"] == 16 for c in classes.values() for r in c["runs"]), classes
    assert any((c["decode_tok_s"] or {}).get("median", 0) > 0 for c in classes.values()), classes
    assert all((c["decode_tok_s"] or {}).get("median", 0) > 0 or "every token arrived in one read" in c["note"]
               for c in classes.values()), classes
    assert (tmp_path / "card" / "card.md").is_file() or any((tmp_path / "card").glob("*.md"))


def test_a_flag_only_rollback_builds_and_copies_only_the_launch_layer(cli: Cli, real: dict) -> None:
    ledger: Ledger = real["ledger"]
    before = ledger.load(ledger.index()["active"])
    code, out, err = cli("rollback", "--to", "rc2", "--yes", "--json")
    assert code == 0, err[-5000:]
    after = ledger.load(ledger.index()["active"])
    assert after.profile == "rc2"
    for node in ("spark-a", "spark-b"):
        assert after.images[node].engine_tag == before.images[node].engine_tag
        assert after.images[node].engine_id == before.images[node].engine_id
        assert after.images[node].launch_tag != before.images[node].launch_tag
    assert re.search(r"launch sparkctl/sglang-gb10-launch:rc2-\S+ assembled, \d+ B loaded in", err), err[-4000:]
    assert not re.search(r"engine sparkctl/sglang-gb10:\S+ built in", err), err[-4000:]
    # the peer loads the assembled launch image (a few kB over SSH), nothing of the engine image crosses
    assert re.search(r"spark-b <- sparkctl/sglang-gb10-launch:rc2-\S+: assembled by sparkctl, [\d.]+ kB loaded",
                     err), err[-4000:]
    assert not re.search(r"spark-b <- sparkctl/sglang-gb10:\S+: [1-9]\d* of \d+ layers sent", err), err[-4000:]
    code, st = _status(cli)
    assert code == 0 and st["healthy"] and st["profile"] == "rc2", st


def test_the_watcher_restarts_a_docker_killed_rank1_as_a_pair(cli: Cli, real: dict) -> None:
    ledger: Ledger = real["ledger"]
    old = ledger.index()["active"]
    rank1 = ledger.load(old).handle_of(1)
    assert isinstance(rank1, DockerHandle) and rank1.node == "spark-b" and rank1.container_id
    with SparkctlProcess(["watch", "--interval", "1", "--backoff", "1", "--backoff-max", "5"]) as run:
        run.wait_for(r"watch +watching cluster", timeout=60)
        _docker(real, "spark-b", "kill", rank1.container_id)
        run.wait_for(rf"detected: {re.escape(old)} is not serving", timeout=120)
        line = run.wait_for(rf"restarted {re.escape(old)} as (\S+)", timeout=900)
        new = re.search(r" as (\S+)", line).group(1)  # type: ignore[union-attr]
        code, st = _status(cli)
        assert code == 0 and st["healthy"] and st["active"] == new, st
        assert st["profile"] == "rc2"              # the recorded deployment, exactly
        run.kill(15)
        assert run.wait(timeout=120) == 143, run.stderr[-3000:]
    rec = ledger.load(new)
    starts = [e for e in rec.journal if e.step == "boot" and e.phase == "ok" and "started" in (e.what or "")]
    assert [e.nodes for e in starts][:2] == [["spark-b"], ["spark-a"]], starts
    assert rec.images["spark-a"].launch_tag == ledger.load(old).images["spark-a"].launch_tag


def test_down_leaves_no_container_and_no_process(cli: Cli, real: dict) -> None:
    code, out, err = cli("down", "--yes")
    assert code == 0, err
    cluster: TestCluster = real["cluster"]
    for node in ("spark-a", "spark-b"):
        assert _containers(real, node, all_states=True) == [], node
        # nothing of an engine in the node's network namespace: only the node's own daemons are left
        pids = subprocess.run(["ip", "netns", "pids", cluster.node(node).netns], capture_output=True, text=True,
                              check=True).stdout.split()
        args = [_cmdline(pid) for pid in pids]
        engines = [a for a in args if "sglang" in a or "/etc/sparkctl/entrypoint.py" in a or "docker-init" in a]
        assert engines == [], engines
    code, st = _status(cli)
    assert st.get("active") in (None, "") or not st.get("ranks"), st


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""
