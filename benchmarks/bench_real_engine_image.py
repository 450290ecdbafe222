"""Benchmark (not a test): the mission's path on the real engine in containers, against the same work by hand.

On a two-node test cluster (root; testrig.cluster) with the real-engine base on both nodes
(testrig.realengine.base_image: SGLang 0.5.23 on the CPU torch, the stand-in for a Spark's production base), in one
run, printing figures and ratios:

1. The base itself: the archive built once per machine, loaded into each node's daemon at once (what a fresh CI
   machine pays before any real-engine test; the nodes' data roots keep it).
2. First build + copy: by hand, ``docker build`` of the engine and launch contexts sparkctl renders (the same
   Dockerfiles, patch series and launch document) on spark-a, then ``docker save | docker load`` of both images to
   spark-b; against ``sparkctl up``'s image steps (build, distribute, verify) for the same profile on nodes that
   hold neither image.
3. The first ``up``'s steps (torch's kernel cache cold: its boot compiles SGLang's CPU kernels).
4. `up` overhead beyond the engine, as a pair back to back with the kernel cache warm: the first ``up``'s two
   containers (sparkctl's own ``docker run`` arguments, read back with ``docker inspect``) started by hand after
   ``down``, rank 1 then rank 0, polling rank 0's /health every 0.1 s until 200; then ``sparkctl up`` of a profile
   one launch flag apart (the same engine work): its wall time minus image steps, warm-up and verify, minus the
   by-hand time (target: <= 1 s). That ``up``'s image steps are the flag-only change's (only the launch image is
   built; only its layer reaches spark-b).

5. With ``--pairs N``: N-1 more pairs of 4. in ABBA order, the two profiles in turn: the overhead's median and the
   boot step's share of it (one pair carries the engine's own boot noise: the by-hand boot moved 29.4 -> 33.6 s
   between two runs), and each boot split by the containers' own clocks (`engine_phases`): the starts (rank 1
   created -> rank 0 started), the engines (rank 0 started -> its ready line) and the rest of the boot.

Run:  .venv/bin/python benchmarks/bench_real_engine_image.py [--prefix brei] [--net 9] [--skip-boot] [--smoke]
      [--pairs 4]
The cluster: the one testrig.benchrig.bench_cluster names (SPARKCTL_BENCH_CLUSTER_DIR/_PREFIX/_NET: a test session's
real-engine cluster, left up) or one of its own (--prefix/--net), brought up and down around the run.
--smoke: 1 and the by-hand build of 2 only (no engine boot, no `sparkctl up`): the engine and launch contexts
``docker build --no-cache`` on spark-a under the same tags, and no ``docker save | docker load`` of the ~2.7 GB
images (its figure line says so); sparkctl's images on the nodes are not pruned, and the tags the build moved are
put back after (a session's cached engine image stays). Seconds (CI's smoke run: the code path, not the figures).
Real boot figures move with the machine's load (2 shared cores): read the ratios of one run, and ``uptime``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sparkctl.config.inventory import load_inventory  # noqa: E402
from sparkctl.config.profile import load_profile  # noqa: E402
from sparkctl.images import manage, pipeline  # noqa: E402
from sparkctl.images.plan import inspect_base, plan_images  # noqa: E402
from sparkctl.nodes.container import MEMLOCK_ENV  # noqa: E402
from sparkctl.prepare.plays import prepare  # noqa: E402
from testrig.benchrig import bench_cluster, compile_sparkctl  # noqa: E402
from testrig.cluster import TestCluster  # noqa: E402
from testrig.realengine import ensure_real_engine  # noqa: E402
from testrig.realengine.base_image import (  # noqa: E402
    ensure_archive,
    ensure_on_nodes,
    ensure_rootfs,
    write_real_engine_cluster_inventory,
)


def sparkctl(*args: str, env: dict[str, str]) -> tuple[float, dict[str, Any], str]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sparkctl", *args, "--yes", "--json"], capture_output=True,
                          text=True, env=env, timeout=3600)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"sparkctl {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return wall, json.loads(proc.stdout), proc.stderr


def stage_s(result: dict[str, Any], *names: str) -> float:
    return sum(s["elapsed_s"] for s in result.get("steps", []) if s["name"] in names)


def docker(cluster: TestCluster, node: str, *args: str, stdin: Any = None, timeout: float = 1800) -> str:
    proc = subprocess.run(["docker", "-H", cluster.docker_host(node), *args], capture_output=True, text=True,
                          timeout=timeout, input=stdin)
    if proc.returncode:
        raise SystemExit(f"docker {' '.join(args[:3])} on {node} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout


def build_by_hand(cluster: TestCluster, inv_path: Path, profile_name: str, *,
                  smoke: bool = False) -> tuple[float, float | None, list[str]]:
    """``docker build`` of sparkctl's own contexts on spark-a (legacy builder, as sparkctl), then
    ``docker save | docker load`` of both images to spark-b; (build s, copy s, tags). ``smoke``: the build with
    ``--no-cache`` (the nodes were not pruned) and no copy (copy s None)."""
    inv = load_inventory(inv_path)
    profile = load_profile(profile_name)
    conn = pipeline.connections(inv)["spark-a"]
    base = inspect_base(conn, profile.image.base_image)
    assert base is not None
    plan = plan_images(profile, inv, base)
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    t0 = time.monotonic()
    for tag, context in ((plan.engine_tag, plan.engine_context()), (plan.launch_tag, plan.launch_context())):
        subprocess.run(["docker", "-H", cluster.docker_host("spark-a"), "build", "-q",
                        *(["--no-cache"] if smoke else []), "-t", tag, "-"], input=context,
                       check=True, env=env, capture_output=True, timeout=1800)
    t_build = time.monotonic() - t0
    if smoke:
        return t_build, None, [plan.engine_tag, plan.launch_tag]
    t0 = time.monotonic()
    save = subprocess.Popen(["docker", "-H", cluster.docker_host("spark-a"), "save", plan.engine_tag, plan.launch_tag],
                            stdout=subprocess.PIPE)
    subprocess.run(["docker", "-H", cluster.docker_host("spark-b"), "load", "-q"], stdin=save.stdout, check=True,
                   capture_output=True, timeout=1800)
    assert save.stdout is not None
    save.stdout.close()
    assert save.wait() == 0
    return t_build, time.monotonic() - t0, [plan.engine_tag, plan.launch_tag]


def run_args(cluster: TestCluster, node: str, info: dict[str, Any]) -> list[str]:
    """`docker run` arguments that recreate a sparkctl rank container from its inspect (name aside)."""
    hc, cfg = info["HostConfig"], info["Config"]
    image_env = set(json.loads(docker(cluster, node, "image", "inspect", cfg["Image"]))[0]["Config"].get("Env") or [])
    argv = ["run", "--detach", "--network", "host", "--ipc", "host", "--init", "--label", "bench=by-hand"]
    for u in hc.get("Ulimits") or []:
        argv += ["--ulimit", f"{u['Name']}={u['Soft']}:{u['Hard']}"]
    for m in info["Mounts"]:
        argv += ["--mount", f"type=bind,source={m['Source']},target={m['Destination']}" + ("" if m["RW"]
                                                                                         else ",readonly")]
    for e in cfg.get("Env") or []:
        if e not in image_env:
            argv += ["-e", e]
    return [*argv, cfg["Image"], *(cfg.get("Cmd") or [])]


def running(cluster: TestCluster, prefix: str) -> dict[str, list[str]]:
    """{node: `docker run` arguments} of the rank containers the benchmark's `up` runs now (`run_args`)."""
    out = {}
    for node in ("spark-a", "spark-b"):
        (cid,) = docker(cluster, node, "ps", "-q", "--filter", f"label=sparkctl.cluster=bench{prefix}").split()
        out[node] = run_args(cluster, node, json.loads(docker(cluster, node, "inspect", cid))[0])
    return out


READY_LINE = "The server is fired up and ready to roll!"


def _docker_ts(text: str) -> float:
    """A Docker timestamp (RFC 3339, nanoseconds) -> seconds since the epoch."""
    from sparkctl.nodes.docker_logs import _ts_ns
    return _ts_ns(text) / 1e9


def engine_phases(cluster: TestCluster, label: str, boot_s: float) -> dict[str, float]:
    """Where a boot of `boot_s` went, from the two rank containers labelled `label` (Docker's own clocks: the node
    and this machine share one kernel): `spread` rank 1's container created -> rank 0's started (the starts),
    `engine` rank 0 started -> its ready line (the engines' own work), `rest` the boot outside rank 1's creation ->
    the ready line (before the first `docker run`, and from the ready line to the 200 seen)."""
    def one(node: str) -> dict[str, Any]:
        (cid,) = docker(cluster, node, "ps", "-q", "--filter", f"label={label}").split()   # the running one
        return json.loads(docker(cluster, node, "inspect", cid))[0]
    r1, r0 = one("spark-b"), one("spark-a")
    logs = subprocess.run(["docker", "-H", cluster.docker_host("spark-a"), "logs", "--timestamps", r0["Id"]],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120).stdout
    ready = next(_docker_ts(ln.split(" ", 1)[0]) for ln in logs.splitlines() if READY_LINE in ln)
    created1, started0 = _docker_ts(r1["Created"]), _docker_ts(r0["State"]["StartedAt"])
    return {"spread": started0 - created1, "engine": ready - started0, "rest": boot_s - (ready - created1)}


def by_hand_after_down(cluster: TestCluster, runs: dict[str, list[str]], endpoint: str, env: dict[str, str],
                       phases: list[dict[str, float]] | None = None) -> float:
    """`sparkctl down`, then `runs` started by hand until /health 200 (`boot_by_hand`), then those containers
    stopped (SIGTERM and the engine's own shutdown, as `down` stops sparkctl's) and removed, so that every boot of
    the pairs follows a graceful stop; the by-hand time. (With `docker rm -f` the `up`s after a killed by-hand pair
    measured +5.0 and +4.0 s over their by-hand boot and those after a `down` +1.2 and +1.3 s; with the stop, the four
    measured +4.2, +3.9, +2.5, +2.4 s: the pattern was not the kill.)"""
    sparkctl("down", env=env)
    took = boot_by_hand(cluster, runs, endpoint)
    if phases is not None:
        phases.append(engine_phases(cluster, "bench=by-hand", took))
    for node in ("spark-a", "spark-b"):
        ids = docker(cluster, node, "ps", "-aq", "--filter", "label=bench=by-hand").split()
        if ids:
            docker(cluster, node, "stop", *ids)
            docker(cluster, node, "rm", *ids)
    return took


def boot_by_hand(cluster: TestCluster, runs: dict[str, list[str]], endpoint: str) -> float:
    t0 = time.monotonic()
    for node in ("spark-b", "spark-a"):                  # rank 1, then rank 0, back to back (as `up` starts them)
        docker(cluster, node, *runs[node])
    deadline = t0 + 1800
    with httpx.Client(trust_env=False, timeout=5) as client:
        while time.monotonic() < deadline:
            try:
                if client.get(endpoint + "/health").status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    raise SystemExit("by-hand boot: /health never answered 200")


def smoke_build(cluster: TestCluster, inv: Path) -> None:
    """The smoke run's by-hand build: on spark-a without pruning it, the tags the build moved put back after (an
    engine image a test session cached stays) and this build's images removed; prints the figure line."""
    def image_id(tag: str) -> str | None:
        proc = subprocess.run(["docker", "-H", cluster.docker_host("spark-a"), "image", "inspect", "--format",
                               "{{.Id}}", tag], capture_output=True, text=True, timeout=60)
        return proc.stdout.strip() if proc.returncode == 0 else None

    profile = load_profile("bi1")
    conn = pipeline.connections(load_inventory(inv))["spark-a"]
    base = inspect_base(conn, profile.image.base_image)
    assert base is not None
    plan = plan_images(profile, load_inventory(inv), base)
    before = {t: image_id(t) for t in (plan.engine_tag, plan.launch_tag)}
    try:
        hb, _, tags = build_by_hand(cluster, inv, "bi1", smoke=True)
    finally:
        built = {t: image_id(t) for t in before}
        for tag, old in before.items():
            if old:
                docker(cluster, "spark-a", "tag", old, tag)
        # this build's images, children first (the launch image is the engine's); removing the launch image takes
        # its engine along when that is untagged by now
        for new in reversed([i for t, i in built.items() if i and i != before[t]]):
            if image_id(new):
                docker(cluster, "spark-a", "rmi", new)
    assert tags == list(before)
    print(f"first build + copy by hand: docker build {hb:.1f} s + docker save | docker load skipped in smoke mode "
          f"(the ~2.7 GB copy)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--prefix", default=os.environ.get("SPARKCTL_TEST_CLUSTER_PREFIX", "brei"))
    ap.add_argument("--net", type=int, default=int(os.environ.get("SPARKCTL_TEST_CLUSTER_NET", "9")))
    ap.add_argument("--skip-boot", action="store_true", help="measure the images only (no engine boots)")
    ap.add_argument("--smoke", action="store_true", help="the images' code path in seconds (CI's smoke run)")
    ap.add_argument("--pairs", type=int, default=1, help="by-hand/up pairs of the overhead, in ABBA order (each up "
                                                        "a flag-only change)")
    args = ap.parse_args()
    print(compile_sparkctl())
    run = int(time.time()) % 100_000     # watchdog_timeout 600 + 2 * run + i stays under its 604,800 s limit
    engine = ensure_real_engine(with_drafter=False)
    with tempfile.TemporaryDirectory(prefix="sparkctl-bench-rei-") as tmp:
        root = Path(tmp)
        with bench_cluster(root / "cluster", args.prefix, args.net, build_image=False) as (cluster, _attached):
            t0 = time.monotonic()
            archive = ensure_archive(rootfs=ensure_rootfs())
            t_archive = time.monotonic() - t0
            loads = ensure_on_nodes(archive, cluster.nodes.values())
            info = archive.info
            print(f"base {archive.tag}: engine layer {int(info['engine_layer_bytes']) / 1e9:.2f} GB of "
                  f"{int(info['site_packages_bytes']) / 1e9:.2f} GB site-packages, rootfs "
                  f"{int(info['rootfs_bytes']) / 1e9:.2f} GB; archive {t_archive:.1f} s "
                  f"({'cached' if t_archive < 5 else 'built'}), loads {loads or 'none (already on both nodes)'}")
            inv = write_real_engine_cluster_inventory(cluster, root / "inv.yml", engine, name=f"bench{args.prefix}")
            profiles = root / "profiles"
            profiles.mkdir()
            for i in (1, 2):
                (profiles / f"bi{i}.yml").write_text(
                    f"extends: cpu-tiny\nimage:\n  base_image: {archive.tag}\nserver:\n"
                    f"  watchdog_timeout: {600 + 2 * run + i}\n")
            env = {**os.environ, "SPARKCTL_INVENTORY": str(inv), "SPARKCTL_STATE_DIR": str(root / "state"),
                   "SPARKCTL_PROFILES_DIR": str(profiles), "PYTHONPATH": str(REPO)}
            env.pop("SPARKCTL_API_KEY", None)
            hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
            if hard != resource.RLIM_INFINITY:
                env[MEMLOCK_ENV] = str(hard)
            os.environ.update({k: env[k] for k in ("SPARKCTL_PROFILES_DIR", "SPARKCTL_INVENTORY")})
            inventory = load_inventory(inv)
            conns = pipeline.connections(inventory)
            if args.smoke:
                smoke_build(cluster, inv)
                return
            prepare(inventory, tags=["fabric-ssh"])   # as a user's `sparkctl prepare`: the copy streams over the fabric
            manage.prune_images(conns, keep=set())            # neither node holds an engine or launch image
            hb, hc, tags = build_by_hand(cluster, inv, "bi1")
            assert hc is not None
            for node in ("spark-a", "spark-b"):
                docker(cluster, node, "rmi", *tags)
            print(f"first build + copy by hand: docker build {hb:.1f} s + docker save | docker load {hc:.1f} s "
                  f"= {hb + hc:.1f} s")
            if args.skip_boot:
                return
            wall, res, _ = sparkctl("up", "--profile", "bi1", env=env)
            sb = stage_s(res, "image-build")
            sd = stage_s(res, "image-distribute", "image-verify")
            print(f"first build + copy by sparkctl up: build {sb:.1f} s + copy/verify {sd:.1f} s = {sb + sd:.1f} s "
                  f"({(sb + sd) / (hb + hc):.2f}x by hand)")
            ups = {"wall": wall, "image": sb + sd, "warmup": stage_s(res, "warm-up"), "verify": stage_s(res, "verify"),
                   "boot": stage_s(res, "boot")}
            hand = by_hand_after_down(cluster, running(cluster, args.prefix), res["endpoint"], env)
            print(f"first up (kernel cache cold): wall {ups['wall']:.1f} s = image {ups['image']:.1f} + boot "
                  f"{ups['boot']:.1f} + warm-up {ups['warmup']:.1f} + verify {ups['verify']:.1f} + rest "
                  f"{ups['wall'] - ups['image'] - ups['boot'] - ups['warmup'] - ups['verify']:.1f}")
            # the pair, back to back and both with the kernel cache the first boot filled: the same containers by
            # hand, then `up` of the profile one flag apart (the same engine work)
            wall2, res2, err2 = sparkctl("up", "--profile", "bi2", env=env)
            fb, fd = stage_s(res2, "image-build"), stage_s(res2, "image-distribute", "image-verify")
            engine_part = wall2 - fb - fd - stage_s(res2, "warm-up") - stage_s(res2, "verify")
            print(f"by hand, the same containers to /health 200: {hand:.1f} s; up (flag-only change) wall "
                  f"{wall2:.1f} s: sparkctl's overhead beyond the engine (wall - image - warm-up - verify - by hand): "
                  f"{engine_part - hand:+.1f} s (target <= 1 s)")
            steps = ", ".join(f"{x['name']} {x['elapsed_s']:.1f}" for x in res2.get("steps", []))
            print(f"up (flag-only change) steps, s: {steps}; outside the steps "
                  f"{wall2 - sum(x['elapsed_s'] for x in res2.get('steps', [])):.1f} (the CLI's start, plan, ...)")
            sent = [ln.split("<-", 1)[1].strip() for ln in err2.splitlines()
                    if " <- " in ln and any(w in ln for w in ("layers sent", "streamed whole", "assembled by"))]
            print(f"flag-only change: build {fb:.1f} s + copy/verify {fd:.1f} s ({(fb + fd) / (sb + sd):.3f}x the "
                  f"first); copied: {sent}")
            if args.pairs > 1:
                more_pairs(cluster, args, env, res2, hand, engine_part)
            sparkctl("down", env=env)
            manage.prune_images(conns, keep=set())


def more_pairs(cluster: TestCluster, args: argparse.Namespace, env: dict[str, str], last: dict[str, Any],
               hand: float, engine_part: float) -> None:
    """``--pairs N``: N-1 more by-hand/up pairs after the first (which was by hand, then up), in ABBA order, the
    two profiles one flag apart in turn (each `up` a flag-only change, its images already on the nodes; by hand: the
    containers of the `up` before it, from `docker inspect`): the overhead's spread and the boot step's share of it,
    with a load that drifts falling on both sides."""
    endpoint = last["endpoint"]

    label = f"sparkctl.cluster=bench{args.prefix}"
    up_phases: list[dict[str, float]] = []
    hand_phases: list[dict[str, float]] = []
    outside_boot: list[tuple[float, float]] = []      # each up's (wall - image steps - warm-up - verify, its boot)

    def up(profile: str) -> tuple[float, float]:
        sparkctl("down", env=env)      # from nothing running, as the by-hand side (no stop-old step in the figure)
        wall, res, _ = sparkctl("up", "--profile", profile, env=env)
        steps = ("image-build", "image-distribute", "image-verify", "warm-up", "verify")
        up_phases.append(engine_phases(cluster, label, stage_s(res, "boot")))
        outside_boot.append((wall - stage_s(res, *steps), stage_s(res, "boot")))
        return wall - stage_s(res, *steps), stage_s(res, "boot")

    rows = [(engine_part - hand, stage_s(last, "boot") - hand, hand)]
    runs = running(cluster, args.prefix)
    for i in range(1, args.pairs):
        profile = "bi1" if i % 2 else "bi2"
        if i % 2:                                    # up, then by hand (ABBA)
            part, boot = up(profile)
            runs = running(cluster, args.prefix)
            took = by_hand_after_down(cluster, runs, endpoint, env, hand_phases)
        else:
            took = by_hand_after_down(cluster, runs, endpoint, env, hand_phases)
            part, boot = up(profile)
            runs = running(cluster, args.prefix)
        rows.append((part - took, boot - took, took))
    each = ", ".join(f"{o:+.1f} (boot {b:+.1f}, by hand {h:.1f})" for o, b, h in rows)
    print(f"up overhead on the container path over {len(rows)} pairs (ABBA): median "
          f"{statistics.median(o for o, _, _ in rows):+.1f} s, the boot step's share median "
          f"{statistics.median(b for _, b, _ in rows):+.1f} s (target <= 1 s); each: {each}")
    # what no engine noise reaches: each up's time outside its boot (the CLI's start, settle, plan, preflight,
    # hand-off, exit: the by-hand side does none of it) plus its boot outside the engine's own phase, against the
    # by-hand boot outside the same phase (the pairs' differences carry the engine's boot, +-5 s here)
    outside = [p - b for p, b in outside_boot]
    around = [u["spread"] + u["rest"] for u in up_phases]
    around_hand = statistics.median(h["spread"] + h["rest"] for h in hand_phases)
    own = [o + a - around_hand for o, a in zip(outside, around, strict=True)]
    print(f"sparkctl's own time within each up (outside its boot + its boot outside the engine's phase - the same "
          f"of the by-hand boot, median {around_hand:.2f} s): median {statistics.median(own):.2f} s (target <= 1 s); "
          f"outside the boot median {statistics.median(outside):.2f} s; each: "
          f"{', '.join(f'{x:.2f}' for x in own)}")
    for key, what in (("spread", "rank 1 created -> rank 0 started"), ("engine", "rank 0 started -> ready line"),
                      ("rest", "the boot outside rank 1 created -> ready line")):
        u = [p[key] for p in up_phases]
        h = [p[key] for p in hand_phases]
        print(f"  {what}: up median {statistics.median(u):.2f} s, by hand {statistics.median(h):.2f} s "
              f"(up: {', '.join(f'{x:.2f}' for x in u)}; by hand: {', '.join(f'{x:.2f}' for x in h)})")


if __name__ == "__main__":
    main()
