"""`sparkctl up` with the image pipeline on the real test cluster: build (when missing) -> distribute -> verify,
the ranks run the launch image, a flag change rebuilds only the launch layer, rollback runs the previous launch
image, and an image ID mismatch on a node blocks `up` before anything stops or starts.

The inventory is the test cluster's without ``sparkctl_engine_image`` (so `up` builds from the profile's
base image); the base is the test base image (emulator + SGLang 0.5.23's real source, on spark-a only).
Flag values carry a per-run number so images cached in the nodes' data roots by an earlier run cannot turn a
build into a no-op.
"""
from __future__ import annotations

import json
import re
import resource
import sys
from pathlib import Path

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.images import manage, pipeline
from sparkctl.nodes.container import MEMLOCK_ENV
from sparkctl.state.ledger import Ledger
from testrig.engine_image import EngineImages
from testrig.testenv import run_salt

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
RUN = run_salt()   # a flag value per run (launch images cached by an earlier run never match), within bounds
SIM = {"boot_s": 3.0, "decode_tps": 2000, "peer_timeout_s": 5}


@pytest.fixture(scope="module")
def base_tag(test_cluster):
    # docker-registry and openssl come with each node's own root filesystem (testrig.rootfs)
    tag = EngineImages(test_cluster).ensure_sglang_base("spark-a", "0.5.23")
    yield tag
    inv = load_inventory(test_cluster.inventory_path)
    manage.prune_images(pipeline.connections(inv), keep=set())   # no pipeline image left in the cached data roots


@pytest.fixture
def env(test_cluster, base_tag, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path):
    """An inventory without a prebuilt engine image, the shipped model directories, profiles on the test base."""
    doc = yaml.safe_load(Path(test_cluster.inventory_path).read_text())
    doc["all"]["vars"].pop("sparkctl_engine_image", None)
    doc["all"]["vars"]["sparkctl_sim"] = SIM
    doc["all"]["vars"]["sparkctl_cluster"] = f"{doc['all']['vars']['sparkctl_cluster']}-{tmp_path.name[-12:]}"
    inv_path = tmp_path / "inv.yml"
    inv_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    inv = load_inventory(inv_path)
    for node in inv.nodes:
        for name in ("GLM-5.3-Flash-NVFP4", "GLM-5.3-Flash-DFlash2"):
            Path(node.host_paths.models, name).mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(inv_path))
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    if hard != resource.RLIM_INFINITY:
        monkeypatch.setenv(MEMLOCK_ENV, str(hard))

    def profile(watchdog: int) -> str:
        path = tmp_path / f"d5-w{watchdog}.yml"
        path.write_text(f"extends: d5\nimage:\n  base_image: {base_tag}\nserver:\n  watchdog_timeout: {watchdog}\n")
        return str(path)
    conns = pipeline.connections(inv)
    yield {"inv": inv, "profile": profile, "conns": conns, "cluster": inv.cluster.name}
    for conn in conns.values():
        ids = conn.run(["docker", "ps", "-aq", "--filter", f"label=sparkctl.cluster={inv.cluster.name}"]).stdout.split()
        if ids:
            conn.run(["docker", "rm", "-f", *ids], timeout=120)


def _up(cli, *args: str) -> tuple[int, dict | None, str]:
    code, out, err = cli(*args, "--yes", "--json")
    return code, (json.loads(out) if out.strip() else None), err


def _running(env, node: str) -> list[dict]:
    """docker inspect of the engine containers running on `node` for this test's cluster."""
    conn = env["conns"][node]
    ids = conn.run(["docker", "ps", "-q", "--filter", f"label=sparkctl.cluster={env['cluster']}"]).stdout.split()
    return json.loads(conn.run(["docker", "inspect", *ids], check=True).stdout) if ids else []


def _stage_s(result: dict, prefix: str = "image-") -> float:
    return sum(s["elapsed_s"] for s in result["steps"] if s["name"].startswith(prefix))


def _runs_launch_image(env, tag: str, profile_name: str) -> None:
    for node in ("spark-a", "spark-b"):
        (c,) = _running(env, node)
        labels = c["Config"]["Labels"]
        assert c["Config"]["Image"] == tag
        assert labels["org.sparkctl.role"] == "launch" and labels["org.sparkctl.profile"] == profile_name
        assert len(labels["org.sparkctl.launch-spec-sha256"]) == 64
        assert c["Config"]["Entrypoint"] == ["python3", "-I", "/etc/sparkctl/entrypoint.py"]


def test_up_flag_change_up_rollback_runs_the_previous_launch_image(cli, env, state_dir):
    p1, p2 = env["profile"](900 + RUN), env["profile"](901 + RUN)
    code, dry, err = _up(cli, "up", "--profile", p1, "--dry-run")
    assert code == 0 and dry is not None and dry["outcome"] == "dry-run", err
    names = [s["name"] for s in dry["plan"]["steps"]]
    assert names[:4] == ["preflight", "image-build", "image-distribute", "image-verify"]
    assert "image-build: build engine image sparkctl/sglang-gb10:" in err or \
        "image-build: build launch image" in err          # the engine may be cached from an earlier module
    assert "[spark-a] $ docker run" in err and "sparkctl/sglang-gb10-launch:" in err

    code, first, err = _up(cli, "up", "--profile", p1)
    assert code == 0 and first is not None and first["outcome"] == "deployed", err
    ledger = Ledger.for_cluster(env["cluster"])
    rec1 = ledger.load(first["deployment"])
    l1 = rec1.images["spark-a"].launch_tag
    assert l1 is not None
    assert rec1.images["spark-b"].launch_tag == l1 and rec1.images["spark-a"].launch_id == \
        rec1.images["spark-b"].launch_id == rec1.image_ids["spark-b"]
    assert rec1.images["spark-a"].engine_id == rec1.images["spark-b"].engine_id
    assert rec1.launch_doc and "sparkctl-secret-placeholder" not in json.dumps(rec1.launch_doc)
    _runs_launch_image(env, l1, Path(p1).stem)
    assert all(g["ok"] for g in first["gates"])

    code, second, err = _up(cli, "up", "--profile", p2)
    assert code == 0 and second is not None and second["outcome"] == "deployed", err
    rec2 = ledger.load(second["deployment"])
    l2 = rec2.images["spark-a"].launch_tag
    assert l2 is not None
    assert l2 != l1 and rec2.images["spark-a"].engine_tag == rec1.images["spark-a"].engine_tag
    assert f"launch {l2} assembled, " in err and "no build (tag present with the planned inputs)" in err
    assert "spark-b has" in err                       # the engine image: nothing to copy to the peer
    assert re.search(rf"spark-b <- {re.escape(l2)}: assembled by sparkctl, [\d.]+ kB loaded over SSH", err), err
    logs = list((Path(state_dir) / env["cluster"] / "builds").glob("*.log"))
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in logs)     # build logs kept, private
    _runs_launch_image(env, l2, Path(p2).stem)
    print(f"\nFIGURE image stages: first up {_stage_s(first):.1f}s, flag-only up {_stage_s(second):.1f}s",
          file=sys.__stderr__)

    code, back, err = _up(cli, "rollback")
    assert code == 0 and back is not None and back["outcome"] == "deployed", err
    assert "image-build: no-op" in err and "image-distribute: no-op" in err    # both launch images are there
    _runs_launch_image(env, l1, Path(p1).stem)                                # the previous launch image runs
    code, out, _ = cli("status", "--json")
    st = json.loads(out)
    assert st["healthy"] and st["images"] == [l1] and st["images_per_node"]["spark-b"]["launch_tag"] == l1

    code, again, err = _up(cli, "up", "--profile", p1)                        # same launch: nothing to do
    assert code == 0 and again is not None and again["outcome"] == "unchanged", err
    assert cli("down", "--yes")[0] == 0


def test_rollback_after_the_base_tag_moved_runs_the_recorded_images(cli, env, base_tag):
    """A user re-pulls the base (same tag, new image), deploys, and rolls back: the rollback runs the images
    the earlier deployment ran, found from its record, not a rebuild of its profile on the new base."""
    conn = env["conns"]["spark-a"]
    p1, p2 = env["profile"](950 + RUN), env["profile"](951 + RUN)
    code, first, err = _up(cli, "up", "--profile", p1)
    assert code == 0 and first is not None and first["outcome"] == "deployed", err
    ledger = Ledger.for_cluster(env["cluster"])
    rec1 = ledger.load(first["deployment"])
    e1, l1 = rec1.images["spark-a"].engine_tag, rec1.images["spark-a"].launch_tag
    assert l1 is not None
    original = conn.run(["docker", "image", "inspect", "--format", "{{.Id}}", base_tag], check=True).stdout.strip()
    moved = conn.run(["env", "DOCKER_BUILDKIT=0", "docker", "build", "-q", "-t", base_tag, "-"],
                     stdin=f"FROM {original}\nLABEL org.sparkctl.test.moved=\"{RUN}\"\n", timeout=300, check=True)
    try:
        code, second, err = _up(cli, "up", "--profile", p2)
        assert code == 0 and second is not None and second["outcome"] == "deployed", err
        e2 = ledger.load(second["deployment"]).images["spark-a"].engine_tag
        assert e2 != e1                                   # the new base gives a new engine image

        code, back, err = _up(cli, "rollback")
        assert code == 0 and back is not None and back["outcome"] == "deployed", err
        assert "rollback: on the recorded base" in err and "image-build: no-op" in err
        assert "built in" not in err and "assembled, " not in err    # nothing was rebuilt on the new base
        rec = ledger.load(back["deployment"])
        assert rec.images["spark-a"].engine_tag == e1 and rec.images["spark-b"].launch_tag == l1
        _runs_launch_image(env, l1, Path(p1).stem)
    finally:
        conn.run(["docker", "tag", original, base_tag], check=True)
        conn.run(["docker", "rmi", moved.stdout.strip()], timeout=120)
        assert cli("down", "--yes")[0] == 0


def test_image_id_mismatch_on_a_node_blocks_up_and_leaves_the_running_deployment(cli, env):
    p, q = env["profile"](950 + RUN), env["profile"](951 + RUN)
    code, first, err = _up(cli, "up", "--profile", p)
    assert code == 0 and first is not None, err
    running = {n: [c["Id"] for c in _running(env, n)] for n in ("spark-a", "spark-b")}
    code, out, err = cli("image", "build", "--profile", q, "--json")          # q's images on both nodes
    assert code == 0, err
    tag = json.loads(out)["launch"]["tag"]
    b = env["conns"]["spark-b"]
    right = b.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], check=True).stdout.strip()
    # Another image under q's launch tag on spark-b: `up` of q must refuse before anything stops or starts.
    b.run(["env", "DOCKER_BUILDKIT=0", "docker", "build", "-q", "-t", tag, "-"], timeout=300, check=True,
          stdin=f"FROM {tag}\nLABEL org.sparkctl.test=odd\n")
    try:
        code, _, err = _up(cli, "up", "--profile", q)
        assert code == 4, err
        assert "spark-b" in err and tag in err
        ledger = Ledger.for_cluster(env["cluster"])
        refused = ledger.load(ledger.index()["history"][-1])
        assert refused.failure is not None
        assert refused.failure.step in ("image-distribute", "image-verify") and refused.status == "failed"
        assert not refused.handles and refused.rollback is None
        assert {n: [c["Id"] for c in _running(env, n)] for n in ("spark-a", "spark-b")} == running
        assert ledger.index()["active"] == first["deployment"]
    finally:
        b.run(["docker", "tag", right, tag], check=True)
    assert cli("image", "verify", "--profile", q)[0] == 0                   # identity restored
    assert cli("down", "--yes")[0] == 0


def test_apply_refuses_a_stale_image_plan_rather_than_planning_again(env, base_tag, tmp_path):
    """The image steps run the plan's `ImagePlan`: when the building node changed between plan and apply (the base
    tag now names another image; a tag the plan saw missing appeared), image-build refuses with what moved and
    "run the command again", and builds nothing (as Terraform refuses a stale plan)."""
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy.image_stage import ImageStage, survey
    from sparkctl.errors import ImageError
    from sparkctl.sglang.render import render

    conn, inv = env["conns"]["spark-a"], env["inv"]
    p = load_profile(env["profile"](953 + RUN))
    result = render(p, inv, environ={})

    def stage() -> tuple[ImageStage, str, str]:
        s = survey(p, inv, result)
        assert {n: noop for n, _, noop in s.steps()}["image-build"] is False, s.steps()
        assert s.plan is not None                 # the base is on the building node: the plan is made
        return (ImageStage(p, inv, result, s, runtimes=None, log_dir=tmp_path / "builds",
                           report=lambda *_: None), s.plan.engine_tag, s.plan.launch_tag)

    planned, engine_tag, launch_tag = stage()
    conn.run(["docker", "tag", base_tag, engine_tag], check=True)          # a tag appeared since the plan
    try:
        with pytest.raises(ImageError) as err:
            planned.build()
        assert "the image plan is stale" in err.value.message and engine_tag in err.value.message
        assert "run the command again" in (err.value.hint or "")
    finally:
        conn.run(["docker", "rmi", engine_tag], check=True)
    planned, engine_tag, launch_tag = stage()
    original = conn.run(["docker", "image", "inspect", "--format", "{{.Id}}", base_tag], check=True).stdout.strip()
    moved = conn.run(["env", "DOCKER_BUILDKIT=0", "docker", "build", "-q", "-t", base_tag, "-"],
                     stdin=f"FROM {original}\nLABEL org.sparkctl.test.stale=\"{RUN}\"\n", timeout=300, check=True)
    try:                                                                    # the base moved since the plan
        with pytest.raises(ImageError) as err:
            planned.build()
        assert f"base image {base_tag} on spark-a changed since the plan" in err.value.message, err.value.message
    finally:
        conn.run(["docker", "tag", original, base_tag], check=True)
        conn.run(["docker", "rmi", moved.stdout.strip()], timeout=120)
    assert not any(conn.run(["docker", "image", "inspect", t]).returncode == 0 for t in (engine_tag, launch_tag))
