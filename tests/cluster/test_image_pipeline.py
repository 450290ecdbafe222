"""Image pipeline on the real test cluster: the patch series applied in a real `docker build` to the real SGLang
0.5.23 source, content-addressed engine/launch images, layer-aware copy over the fabric, identity, bad input.

The base is the test base image (`testrig.engine_image`): the emulator image + SGLang 0.5.23's source at
/sgl-workspace/sglang/python/sglang, on spark-a only. Flag changes use a per-run value so that images left in the
nodes' cached data roots by an earlier run cannot turn a "build and copy" into a no-op.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError, ImageError
from sparkctl.images import launchdoc, manage, pipeline
from sparkctl.images.assemble import EngineConfig, launch_archive
from sparkctl.images.build import build_image, build_images, ensure_base, image_layers
from sparkctl.images.copy import distribute
from sparkctl.images.plan import plan_images
from sparkctl.images.registry import PULLED_FILE, Endpoint, Registry, image_ids, prune_cache
from sparkctl.nodes.facts import FABRIC_KEY
from sparkctl.sglang.render import render
from testrig.engine_image import SGLANG_WORKSPACE_PACKAGE, EngineImages
from testrig.testenv import run_salt

pytestmark = pytest.mark.cluster
# Nothing here boots (no preflight judges this host's memory), and the tests compare with the images the session
# built from the shipped d5: they keep it (tests/cluster/conftest.py gives the other cluster tests a d5 at 0.5).
SHIPPED_D5 = True
REPO = Path(__file__).resolve().parents[2]
RUN = run_salt()   # a flag value per run (launch images cached by an earlier run never match), within bounds


@pytest.fixture(scope="module")
def env(test_cluster):
    # docker-registry and openssl come with each node's own root filesystem (testrig.rootfs)
    inv = load_inventory(test_cluster.inventory_path)
    base_tag = EngineImages(test_cluster).ensure_sglang_base("spark-a", "0.5.23")
    conns = pipeline.connections(inv)
    yield {"cluster": test_cluster, "inv": inv, "base_tag": base_tag, "a": conns["spark-a"], "b": conns["spark-b"],
           "conns": conns}
    manage.prune_images(conns, keep=set())          # leave no pipeline image in the cached data roots


def _profile(env, **server):
    prof = load_profile("d5")
    prof = prof.model_copy(update={"image": prof.image.model_copy(update={"base_image": env["base_tag"]})})
    if server:
        prof = prof.model_copy(update={"server": prof.server.model_copy(update=server)})
    return prof


def _plan(env, **server):
    base = ensure_base(env["a"], env["base_tag"], node="spark-a", pull=False)
    return plan_images(_profile(env, **server), env["inv"], base)


def _endpoints(env):
    return Endpoint.of(env["inv"], env["inv"].node("spark-a")), Endpoint.of(env["inv"], env["inv"].node("spark-b"))


@pytest.fixture(scope="module")
def built(env):
    plan = _plan(env, watchdog_timeout=600 + RUN)
    steps = build_images(plan, env["a"], log_dir=env["cluster"].workdir / "builds")
    return plan, steps


def test_series_is_applied_for_real_in_docker_build(env, built):
    plan, steps = built
    assert [s.role for s in steps] == ["engine", "launch"]
    script = "\n".join([
        "import os, sys",
        "p = sys.argv[1]",
        "k = open(p + '/kernels/ops/attention/dsa/tilelang_kernel.py').read()",
        "u = open(p + '/srt/model_loader/utils.py').read()",
        "e = open(p + '/srt/layers/deep_gemm_wrapper/entrypoint.py').read()",
        "c = p + '/kernels/ops/attention/dsa/__pycache__'",
        "pyc = os.path.isdir(c) and any(f.startswith('tilelang_kernel.') for f in os.listdir(c))",
        "print(int('_v1_tile_for_major' in k), int('get_device_sm() in (120, 121)' in u),"
        "      int('    import deep_gemm  # module-level' in e), int(pyc))"])
    r = env["a"].run(["docker", "run", "--rm", "--entrypoint", "python3", plan.engine_tag, "-c", script,
                      SGLANG_WORKSPACE_PACKAGE], timeout=120, check=True)
    assert r.stdout.split() == ["1", "1", "1", "1"]   # the three patches in the image's SGLang source, compiled
    base = env["a"].run(["docker", "run", "--rm", "--entrypoint", "python3", env["base_tag"], "-c", script,
                         SGLANG_WORKSPACE_PACKAGE], timeout=120)
    assert base.stdout.split() == ["0", "0", "0", "0"]   # the base image carries the unpatched release
    labels = json.loads(env["a"].run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}",
                                      plan.engine_tag], check=True).stdout)
    assert labels["org.sparkctl.patch-series"] == "gb10-0.5.23"
    assert labels["org.sparkctl.series-sha256"] == plan.engine_inputs["series_sha256"]
    assert labels["org.sparkctl.sglang-version"] == "0.5.23"
    assert labels["org.sparkctl.base-digest"] == plan.base.pinned


def test_nothing_changed_builds_nothing(env, built):
    plan, _ = built
    again = build_images(_plan(env, watchdog_timeout=600 + RUN), env["a"])
    assert [(s.tag, s.built) for s in again] == [(plan.engine_tag, False), (plan.launch_tag, False)]
    assert all(s.reason == "tag present with the planned inputs" for s in again)


def test_flag_only_change_rebuilds_only_the_launch_layer(env, built):
    plan, _ = built
    changed = _plan(env, watchdog_timeout=601 + RUN)
    assert changed.engine_tag == plan.engine_tag and changed.launch_tag != plan.launch_tag
    steps = build_images(changed, env["a"])
    assert [(s.role, s.built) for s in steps] == [("engine", False), ("launch", True)]
    engine = image_layers(env["a"], plan.engine_tag)
    old, new = image_layers(env["a"], plan.launch_tag), image_layers(env["a"], changed.launch_tag)
    assert old[:-1] == engine and new[:-1] == engine      # both launch images = engine + one layer
    assert old[-1] != new[-1]


def test_assembled_launch_image_is_what_docker_build_makes_of_its_dockerfile(env, built):
    """sparkctl assembles the launch image (sparkctl.images.assemble) instead of `docker build`ing it: the same
    settings, layers below and files as the legacy builder makes of the same Dockerfile and context."""
    plan, steps = built
    assert steps[1].reason.startswith("assembled, ") and steps[1].built
    docker_tag = f"sparkctl-test/launch-docker-built:{RUN}"
    build_image(env["a"], role="launch", tag=docker_tag, context=plan.launch_context(),
                inputs_sha256=plan.launch_inputs_sha256, node="spark-a")
    try:
        made, ours = (json.loads(env["a"].run(["docker", "image", "inspect", ref], check=True).stdout)[0]
                      for ref in (docker_tag, plan.launch_tag))
        assert ours["Id"] == steps[1].image_id == launch_archive(
            plan, EngineConfig.inspect(env["a"], plan.engine_tag)).image_id      # known before any load
        # Entrypoint, Cmd, Labels, Env, WorkingDir, ...; "Image" is the parent: the legacy builder's is its own
        # intermediate image of the step before LABEL, the assembled one's the engine image
        assert {**ours["Config"], "Image": None} == {**made["Config"], "Image": None}
        assert ours["Config"]["Image"] == image_ids(env["a"], [plan.engine_tag])[plan.engine_tag]
        assert ours["RootFS"]["Layers"][:-1] == made["RootFS"]["Layers"][:-1] == image_layers(env["a"],
                                                                                                plan.engine_tag)
        assert (ours["Architecture"], ours["Os"]) == (made["Architecture"], made["Os"])
        listing = "cd /etc/sparkctl && for f in . *; do stat -c '%n %a %u:%g %s' \"$f\"; done && sha256sum *"
        files = [env["a"].run(["docker", "run", "--rm", "--entrypoint", "sh", ref, "-c", listing], timeout=120,
                              check=True).stdout for ref in (docker_tag, plan.launch_tag)]
        assert files[0] == files[1] and "entrypoint.py 644 0:0" in files[1] and "launch.json" in files[1], files
        history = env["a"].run(["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", plan.launch_tag],
                               check=True).stdout
        assert "COPY etc-sparkctl/ /etc/sparkctl/" in history and "org.sparkctl.role=launch" in history, history
    finally:
        env["a"].run(["docker", "rmi", docker_tag], timeout=120)


def test_flag_only_change_through_the_pipeline_reads_no_engine_byte(env, built):
    """`up`'s copy of a flag-only change: the engine image is where it was, the launch image (assembled, a few kB)
    is loaded on each node over its SSH connection: nothing crosses the fabric, no `docker save` of the engine."""
    plan, _ = built
    pipeline.distribute_plan(plan, env["inv"])                 # both nodes hold the engine image
    changed = _plan(env, watchdog_timeout=604 + RUN)
    lines: list[str] = []
    build_images(changed, env["a"], report=lines.append)
    transfers = pipeline.distribute_plan(changed, env["inv"], report=lines.append)
    engine_t = [t for t in transfers if t.image == changed.engine_tag]
    assert engine_t and all(t.skipped and t.rx_bytes == 0 for t in engine_t), lines
    placed = {t.node: t for t in transfers if t.image == changed.launch_tag}
    assert sorted(placed) == ["spark-a", "spark-b"] and all(t.via == "assembled" for t in placed.values())
    assert placed["spark-a"].skipped == "tag present with the planned inputs"     # image-build placed it there
    assert not placed["spark-b"].skipped and 0 < placed["spark-b"].rx_bytes < 100_000, lines
    assert any(ln.startswith(f"spark-b <- {changed.launch_tag}: assembled by sparkctl, ") for ln in lines), lines
    ids = manage.verify_images(changed, env["conns"])[changed.launch_tag]
    assert ids == {"spark-a": placed["spark-a"].image_id, "spark-b": placed["spark-b"].image_id}
    assert pipeline.distribute_plan(changed, env["inv"])[-1].skipped                # placed: nothing to do


def test_a_docker_built_launch_image_is_replaced_by_the_assembled_one(env, built):
    """A launch tag `docker build` made before sparkctl assembled launch images (same inputs, another ID) on the
    building node, and a peer that lacks it: placing makes both nodes hold the assembled image, one ID."""
    plan, _ = built
    pipeline.distribute_plan(plan, env["inv"])
    legacy = _plan(env, watchdog_timeout=605 + RUN)
    build_image(env["a"], role="launch", tag=legacy.launch_tag, context=legacy.launch_context(),
                inputs_sha256=legacy.launch_inputs_sha256, node="spark-a")
    docker_built = image_ids(env["a"], [legacy.launch_tag])[legacy.launch_tag]
    placed = {t.node: t for t in pipeline.distribute_plan(legacy, env["inv"]) if t.image == legacy.launch_tag}
    assert not placed["spark-a"].skipped and not placed["spark-b"].skipped
    ids = manage.verify_images(legacy, env["conns"])[legacy.launch_tag]
    assert docker_built not in ids.values() and len(set(ids.values())) == 1


def test_launch_image_entrypoint_rebuilds_each_ranks_argv(env, built):
    plan, _ = built
    specs = render(_profile(env, watchdog_timeout=600 + RUN), env["inv"], environ={}).specs
    for spec in specs:
        flags = [a for k, v in launchdoc.rank_environment(plan.launch_doc, spec).items() for a in ("-e", f"{k}={v}")]
        r = env["a"].run(["docker", "run", "--rm", *flags, plan.launch_tag, "--print"], timeout=120, check=True)
        shown = json.loads(r.stdout)
        assert shown["argv"] == spec.argv
        assert {k: shown["env"][k] for k in spec.env} == spec.env
    r = env["a"].run(["docker", "run", "--rm", plan.launch_tag, "--print"], timeout=120)
    assert r.returncode == 2 and "lacks SPARKCTL_ARG_NODE_RANK" in r.stderr


def _forget_pulled(env) -> None:
    """spark-b forgets what it pulled from the fabric registry: every layer it holds counts as loaded (Docker's
    pull would send it again), as on a peer whose images came by stream, by `docker load` or from another registry."""
    peer = env["inv"].node("spark-b")
    env["b"].run(["rm", "-f", f"{peer.host_paths.cache}/{PULLED_FILE}"], check=True)


def _flag_only_copy(env, watchdog_timeout: int):
    """A profile one launch flag apart built on spark-a and copied to spark-b: (its plan, the launch image's
    transfer, the copy's lines); the engine image, which spark-b holds, is skipped."""
    src, dst = _endpoints(env)
    changed = _plan(env, watchdog_timeout=watchdog_timeout)
    build_images(changed, env["a"])
    lines: list[str] = []
    transfers = distribute([changed.engine_tag, changed.launch_tag], src, [dst], report=lines.append)
    engine_t = next(t for t in transfers if t.image == changed.engine_tag)
    assert engine_t.skipped and engine_t.rx_bytes == 0
    return changed, next(t for t in transfers if t.image == changed.launch_tag), lines


@pytest.fixture
def fabric_ssh(env):
    """The fabric key on spark-a and spark-b's host key pinned (`sparkctl prepare --tags fabric-ssh`), for one test:
    the module's other copies go through the registry, the path they check."""
    from sparkctl.prepare.plays import prepare
    prepare(env["inv"], tags=["fabric-ssh"])
    try:
        yield
    finally:
        env["a"].run(["sh", "-c", f"rm -f {FABRIC_KEY} {FABRIC_KEY}.pub"], check=True)


def test_flag_only_change_after_a_stream_streams_only_the_launch_layer(env, built, fabric_ssh):
    plan, _ = built
    src, dst = _endpoints(env)
    distribute([plan.engine_tag, plan.launch_tag], src, [dst])       # whatever spark-b lacked
    assert manage.verify_images(plan, env["conns"])                   # same IDs on both nodes
    _forget_pulled(env)

    changed, launch_t, lines = _flag_only_copy(env, 603 + RUN)
    n = len(image_layers(env["a"], changed.launch_tag))
    assert (launch_t.via, launch_t.stream_layers) == ("stream", (1, n)), lines
    size = int(env["a"].run(["docker", "image", "inspect", "--format", "{{.Size}}", changed.launch_tag]).stdout)
    assert launch_t.rx_bytes < 1_000_000 < 100_000_000 < size        # one thin layer of a >100 MB image crossed
    assert launch_t.left_out_bytes > 100_000_000                      # the engine's layers stayed on spark-a
    assert any("the registry would send 100%" in ln for ln in lines), lines
    assert any(f"over the fabric, without the {n - 1} layers spark-b holds" in ln for ln in lines), lines
    assert launch_t.line().startswith(f"spark-b <- {changed.launch_tag}: 1 of {n} layers sent, ")
    assert manage.verify_images(changed, env["conns"])


def test_peer_receives_only_missing_layers_and_nothing_when_it_has_them(env, built):
    plan, _ = built
    src, dst = _endpoints(env)
    distribute([plan.engine_tag, plan.launch_tag], src, [dst])       # whatever spark-b lacked
    assert manage.verify_images(plan, env["conns"])                   # same IDs on both nodes
    # the engine through the registry once (spark-b holds it, but loaded: its pull sends every layer this time) ...
    env["b"].run(["docker", "rmi", plan.launch_tag, plan.engine_tag], timeout=120)
    _forget_pulled(env)
    (first,) = [t for t in distribute([plan.engine_tag], src, [dst], stream=False) if t.image == plan.engine_tag]
    assert first.via == "registry" and not first.skipped, first.line()

    # ... so that a flag-only change through the registry costs its one thin layer: spark-b's record of what it
    # pulled tells the choice that Docker's pull cache knows the engine's layers
    changed, launch_t, lines = _flag_only_copy(env, 601 + RUN)
    assert launch_t.via == "registry", lines
    assert [layer.sent for layer in launch_t.layers].count(True) == 1 and not launch_t.skipped
    size = int(env["a"].run(["docker", "image", "inspect", "--format", "{{.Size}}", changed.launch_tag]).stdout)
    assert launch_t.sent_bytes < 100_000 < 100_000_000 < size       # one thin layer of a >100 MB image
    assert launch_t.rx_bytes < 1_000_000                              # measured on spark-b's fabric interface
    assert any("sent" in ln for ln in lines) and any("present" in ln for ln in lines)   # per-layer progress
    # ... and as it happens: each layer's state from docker push/pull, before the copy's summary line
    summary = next(i for i, ln in enumerate(lines) if ln.startswith(f"spark-b <- {changed.launch_tag}: 1 of"))
    pushed = [i for i, ln in enumerate(lines) if ln.startswith("  [spark-a] layer ")]
    unpacked = [i for i, ln in enumerate(lines) if ln.startswith("  [spark-b] layer ") and ln.endswith(": unpacked")]
    assert pushed and len(unpacked) == 1 and max(pushed) < unpacked[0] < summary, lines
    assert any(ln.endswith("compressed and stored in the fabric registry") for ln in lines), lines
    assert manage.verify_images(changed, env["conns"])

    again = distribute([changed.engine_tag, changed.launch_tag], src, [dst])
    assert all(t.skipped for t in again) and sum(t.rx_bytes for t in again) == 0

def test_broken_patch_fails_the_build_naming_patch_and_hunk(env, tmp_path, monkeypatch):
    shutil.copytree(REPO / "patches" / "gb10-0.5.23", tmp_path / "gb10-0.5.23")
    p = tmp_path / "gb10-0.5.23" / "0002-deepgemm-ue8m0-requant-sm121.patch"
    p.write_text(p.read_text().replace("         and weight_block_size is not None",
                                       f"         and weight_block_size is not None  # {RUN}"))
    monkeypatch.setenv("SPARKCTL_PATCHES_DIR", str(tmp_path))
    plan = _plan(env)
    with pytest.raises(ImageError) as err:
        build_images(plan, env["a"])
    msg = err.value.render()
    assert "engine image build failed on spark-a" in msg, msg
    assert "0002-deepgemm-ue8m0-requant-sm121.patch: hunk #1 of python/sglang/srt/model_loader/utils.py" in msg, msg
    assert "sparkctl patches check" in msg and "@@ -279,9 +279,9 @@" in msg, msg
    assert env["a"].run(["docker", "image", "inspect", plan.engine_tag]).returncode != 0   # nothing tagged


def test_tag_holding_other_content_is_refused(env, built):
    plan = _plan(env, watchdog_timeout=602 + RUN)
    env["a"].run(["docker", "tag", env["cluster"].engine_image, plan.launch_tag], check=True)
    try:
        with pytest.raises(ImageError, match=r"tag sparkctl/sglang-gb10-launch:d5-\w+ on spark-a holds other content"
                           ) as err:
            build_images(plan, env["a"])
        assert err.value.hint is not None and f"docker rmi {plan.launch_tag} on spark-a" in err.value.hint
    finally:
        env["a"].run(["docker", "rmi", plan.launch_tag])


def test_identity_mismatch_is_refused_before_boot(env, built):
    plan, _ = built
    src, dst = _endpoints(env)
    distribute([plan.engine_tag, plan.launch_tag], src, [dst])
    right = env["b"].run(["docker", "image", "inspect", "--format", "{{.Id}}", plan.launch_tag],
                         check=True).stdout.strip()
    env["b"].run(["docker", "tag", env["cluster"].engine_image, plan.launch_tag], check=True)
    try:
        with pytest.raises(ImageError, match=r"image sparkctl/sglang-gb10-launch:\S+ on spark-b was not built from "
                                             r"this plan"):
            manage.verify_images(plan, env["conns"])
        with pytest.raises(ImageError, match=r"on spark-b is sha256:\w+, on spark-a sha256:"):
            distribute([plan.engine_tag, plan.launch_tag], src, [dst])
    finally:
        env["b"].run(["docker", "tag", right, plan.launch_tag], check=True)
    assert manage.verify_images(plan, env["conns"])


def test_base_image_missing_and_not_pullable(env, test_cluster):
    ref = f"198.18.{test_cluster.net_index}.99:5999/sparkctl-absent:never"
    with pytest.raises(ImageError, match=rf"base image {ref} is missing on spark-a and could not be pulled") as err:
        ensure_base(env["a"], ref, node="spark-a")
    assert err.value.hint is not None and "docker pull" in err.value.hint


def test_process_inventory_has_no_images():
    with pytest.raises(ConfigError, match="not in Docker"):
        pipeline.connections(load_inventory(REPO / "inventory" / "local.yml"))


def test_ls_and_prune_keep_what_the_ledger_uses(env, built, tmp_path):
    plan, _ = built
    rows = manage.list_images(env["conns"])
    assert {(r["node"], r["role"]) for r in rows if plan.launch_tag in r["tags"]} >= {("spark-a", "launch")}
    ledger = tmp_path / "state" / "deployments"
    ledger.mkdir(parents=True)
    (ledger / "x.json").write_text(json.dumps({"specs": [{"image": plan.launch_tag}]}))
    keep = manage.images_in_use([tmp_path / "state"])
    would = manage.prune_images(env["conns"], keep, dry_run=True)
    gone = {t for r in would for t in r["tags"]}
    assert plan.launch_tag not in gone and plan.engine_tag not in gone     # kept launch keeps its engine


def test_prune_drops_from_the_registry_cache_what_no_kept_image_uses(env, built):
    plan, _ = built
    src, dst = _endpoints(env)
    distribute([plan.engine_tag, plan.launch_tag], src, [dst])          # both pushed into spark-a's cache
    would = prune_cache(src, {plan.engine_tag}, dry_run=True)
    assert plan.launch_tag in would["removed"] and plan.engine_tag not in would["removed"] and would["freed"] == 0
    done = prune_cache(src, {plan.engine_tag})
    assert done["removed"] == would["removed"] and done["freed"] > 0
    assert Registry(src, [dst]).manifest_layers(plan.engine_tag)       # the kept image and its layers stay
    assert prune_cache(src, {plan.engine_tag}) == {"removed": [], "freed": 0}
    env["b"].run(["docker", "rmi", plan.launch_tag], check=True)
    (t,) = distribute([plan.launch_tag], src, [dst])                      # the next copy pushes it again
    assert not t.skipped and t.image_id == image_ids(env["a"], [plan.launch_tag])[plan.launch_tag]


def test_peer_disk_full_mid_copy_names_node_image_and_fix(env, test_cluster):
    """A real ENOSPC on spark-b: its daemon downloads layer blobs into <data-root>/tmp, here a 1 MB tmpfs."""
    from testrig.cluster import DATA_ROOT

    tag = f"sparkctl-test-incompressible:{RUN}"
    env["a"].run(["env", "DOCKER_BUILDKIT=0", "docker", "build", "-q", "-t", tag, "-"], timeout=300, check=True,
                 stdin=f"FROM {test_cluster.engine_image}\nRUN head -c 3000000 /dev/urandom > /blob\n")
    tmp = DATA_ROOT / test_cluster.node("spark-b").netns / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    # in the daemon's own mount namespace (testrig: each node's dockerd has one, for its /dev/shm)
    in_dockerd = test_cluster.in_dockerd_mounts("spark-b")
    subprocess.run([*in_dockerd, "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tmp)], check=True)
    try:
        src, dst = _endpoints(env)
        with pytest.raises(ImageError, match=rf"spark-b ran out of disk space while receiving {tag}") as err:
            distribute([tag], src, [dst])
        assert err.value.hint is not None and err.value.evidence is not None
        assert "free space in spark-b's docker data root" in err.value.hint
        assert "no space left on device" in err.value.evidence
    finally:
        subprocess.run([*in_dockerd, "umount", str(tmp)], check=False)
        for conn in (env["a"], env["b"]):
            conn.run(["docker", "rmi", tag])
    assert env["b"].run(["docker", "image", "inspect", tag]).returncode != 0      # nothing half-tagged on the peer


def test_cli_plan_build_ls_verify_prune(env, tmp_path, monkeypatch, capsys):
    from sparkctl.cli.main import main as cli

    profile = tmp_path / "d5-testbase.yml"
    profile.write_text(f"extends: d5\nimage:\n  base_image: {env['base_tag']}\n"
                       f"server:\n  watchdog_timeout: {700 + RUN}\n")
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(env["cluster"].inventory_path))
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(tmp_path / "state"))
    assert cli(["image", "plan", "--profile", str(profile), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert set(plan) >= {"engine", "launch"} and plan["engine"]["inputs"]["series"] == "gb10-0.5.23"
    assert plan["launch"]["inputs"]["engine_tag"] == plan["engine"]["tag"]
    assert cli(["image", "build", "--profile", str(profile)]) == 0
    cap = capsys.readouterr()     # each step and copy reported once as it happens (stderr); stdout keeps the outcome
    assert f"launch {plan['launch']['tag']} assembled, " in cap.err and "spark-b <- " in cap.err, cap.err
    assert f"launch {plan['launch']['tag']}" in cap.out and "assembled, " not in cap.out, cap.out
    assert cli(["image", "verify", "--profile", str(profile)]) == 0
    assert f"ok {plan['launch']['tag']}: spark-a, spark-b" in capsys.readouterr().out
    assert cli(["image", "ls", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["node"] for r in rows if plan["launch"]["tag"] in r["tags"]} == {"spark-a", "spark-b"}
    assert cli(["image", "prune", "--dry-run"]) == 0
    assert f"would remove {plan['launch']['tag']}" in capsys.readouterr().out         # no deployment uses it


def test_series_for_another_version_than_the_base_image_fails_the_build(env, tmp_path, monkeypatch):
    """Profile and series agree on 0.5.11, but the base image carries 0.5.23: the build says so."""
    series = tmp_path / "gb10-0.5.11"
    shutil.copytree(REPO / "patches" / "gb10-0.5.23", series)
    (series / "series").write_text((series / "series").read_text().replace("sglang==0.5.23", "sglang==0.5.11"))
    monkeypatch.setenv("SPARKCTL_PATCHES_DIR", str(tmp_path))
    prof = load_profile("base")
    prof = prof.model_copy(update={"image": prof.image.model_copy(update={
        "base_image": env["base_tag"], "sglang_version": "0.5.11", "patch_series": "gb10-0.5.11"})})
    plan = plan_images(prof, env["inv"], ensure_base(env["a"], env["base_tag"], node="spark-a", pull=False))
    with pytest.raises(ImageError, match=r"ERROR series gb10-0.5.11 is for SGLang 0.5.11, the image carries SGLang "
                                         r"0.5.23 \(/sgl-workspace/sglang/python/sglang\)"):
        build_images(plan, env["a"])


def test_cli_plan_build_verify_of_a_replicated_profile(env, tmp_path, monkeypatch, capsys):
    """`replicas: 2` of TP=1 on the two nodes: each replica's images are planned, built on its own rank 0 (as its
    `up` builds them) and verified on its own node; the engine image is one, each replica's launch image its own
    (the launch document carries that replica's --dist-init-addr)."""
    from sparkctl.cli.main import main as cli

    tc = env["cluster"]

    def docker_b(*args: str) -> str:
        return tc.run_on("spark-b", ["docker", "-H", tc.docker_host("spark-b"), *args], check=False).stdout.strip()
    had_base = bool(docker_b("image", "ls", "-q", env["base_tag"]))
    if not had_base:    # replica 1 builds on spark-b: the same base there (as a registry's pull gives every Spark)
        from testrig.engine_image import copy_image
        copy_image(tc.node("spark-a"), tc.node("spark-b"), env["base_tag"])
    profile = tmp_path / "rep-testbase.yml"
    profile.write_text(f"extends: d5\nreplicas: 2\nimage:\n  base_image: {env['base_tag']}\nserver:\n  tp_size: 1\n"
                       f"  watchdog_timeout: {900 + RUN}\n")
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(env["cluster"].inventory_path))
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("SPARKCTL_API_KEY", raising=False)
    assert cli(["image", "plan", "--profile", str(profile), "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["replicas"]
    assert [(p["index"], p["nodes"], p["builder"], p["resolved"]) for p in plans] == \
        [(0, ["spark-a"], "spark-a", True), (1, ["spark-b"], "spark-b", True)]
    engine = {p["engine"]["tag"] for p in plans}
    launch = [p["launch"]["tag"] for p in plans]
    assert len(engine) == 1 and len(set(launch)) == 2, plans
    try:
        assert cli(["image", "build", "--profile", str(profile), "--json"]) == 0
        built = json.loads(capsys.readouterr().out)["replicas"]
        assert [sorted(b["ids"][launch[i]]) for i, b in enumerate(built)] == [["spark-a"], ["spark-b"]]
        assert cli(["image", "verify", "--profile", str(profile), "--json"]) == 0
        ids = json.loads(capsys.readouterr().out)
        assert sorted(ids[next(iter(engine))]) == ["spark-a", "spark-b"]
        assert (sorted(ids[launch[0]]), sorted(ids[launch[1]])) == (["spark-a"], ["spark-b"])
    finally:
        manage.prune_images(env["conns"], keep=set())
        if not had_base:        # the other tests' peer has no base (a cached data root keeps what is left there)
            docker_b("rmi", env["base_tag"])
