"""SSH connector, facts and the docker runtime against the real two-node test cluster (real sshd + dockerd).

Uses the session fixture `test_cluster` (tests/cluster/conftest.py): skipped when this machine cannot run it,
FAILED under CI=true.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sparkctl.config.inventory import Inventory, load_inventory
from sparkctl.deploy.preflight_rules import evaluate
from sparkctl.errors import NodeError
from sparkctl.nodes.container import MEMLOCK_ENV
from sparkctl.nodes.docker_runtime import DockerRuntime
from sparkctl.nodes.fanout import run_all
from sparkctl.nodes.handles import DockerHandle
from sparkctl.nodes.ssh import SESSIONS, SSHConnector
from sparkctl.sglang.launch import LaunchSpec, Mount
from sparkctl.state.records import CheckResult, Severity
from testrig.cluster import TestCluster

pytestmark = pytest.mark.cluster

NODES = ("spark-a", "spark-b")
SECRET = "hf_cluster_test_SECRET_token"


@pytest.fixture(scope="module")
def inv(test_cluster: TestCluster) -> Inventory:
    return load_inventory(test_cluster.inventory_path)


def _fresh(inv: Inventory, node: str, **cluster_update: object) -> SSHConnector:
    """A new connector (not the shared pool), so fault tests see a fresh connection attempt."""
    cluster = inv.cluster.model_copy(update=cluster_update) if cluster_update else inv.cluster
    return SSHConnector(inv.node(node), cluster)


def _environ() -> dict[str, str]:
    """This sandbox's dockerd cannot raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE): pass its hard limit instead."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    return {} if hard == resource.RLIM_INFINITY else {MEMLOCK_ENV: str(hard)}


# ------------------------------------------------------------------------------------------------ SSH
def test_run_on_both_nodes_in_parallel(inv: Inventory) -> None:
    conns = {n: _fresh(inv, n) for n in NODES}
    t0 = time.monotonic()
    res = run_all(inv.nodes, lambda n: conns[n.name].run(["hostname"], check=True).stdout.strip())
    assert dict(res) == {"spark-a": "spark-a", "spark-b": "spark-b"}
    assert res.failed == {} and time.monotonic() - t0 < 10
    for c in conns.values():
        c.close()


def test_argv_values_survive_the_remote_shell(inv: Inventory) -> None:
    tricky = ["glm; rm -rf /tmp/nope", "$(id)", "`id`", "a b", "'single'", '"double"', "*", "ünï 漢字", "",
              "line1\nline2", "--served-model-name=x y", "\\back", "~root", "$HOME"]
    with _fresh(inv, "spark-a") as ssh:
        res = ssh.run(["python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *tricky], check=True)
    assert json.loads(res.stdout) == tricky


def test_command_failure_carries_argv_code_and_redacted_tail(inv: Inventory) -> None:
    with _fresh(inv, "spark-b") as ssh, pytest.raises(NodeError) as err:
        ssh.run(["sh", "-c", f"echo token={SECRET}; echo oops >&2; exit 3"], check=True, secrets=[SECRET])
    text = err.value.render()
    assert "exited 3" in text and "oops" in text and "[spark-b]" in text
    assert SECRET not in text and "***" in text


def test_output_lines_arrive_as_the_command_writes_them_redacted(inv: Inventory) -> None:
    """``on_line`` (docker push/pull progress): each stdout line while the command runs, a multi-byte character
    split across writes intact, the unterminated rest at the end, secrets hidden."""
    got: list[tuple[float, str]] = []
    script = (f"echo first; sleep 2; printf 'k\\303'; sleep 0.2; printf '\\251 token={SECRET}\\nlast'")
    with _fresh(inv, "spark-a") as ssh:
        t0 = time.monotonic()
        res = ssh.run(["sh", "-c", script], check=True, secrets=[SECRET],
                      on_line=lambda line: got.append((time.monotonic() - t0, line)))
        done = time.monotonic() - t0
    assert [line for _, line in got] == ["first", "k\u00e9 token=***", "last"]
    assert got[0][0] < done - 1.0          # the first line came while the command still had 2 s of sleeping to do
    assert res.stdout == "first\nk\u00e9 token=***\nlast"


def test_one_node_failing_still_reports_the_other(inv: Inventory) -> None:
    conns = {n: _fresh(inv, n) for n in NODES}
    res = run_all(inv.nodes, lambda n: conns[n.name].run(["sh", "-c", "test $(hostname) = spark-a"], check=True))
    assert set(res.succeeded) == {"spark-a"} and set(res.failed) == {"spark-b"}
    with pytest.raises(NodeError, match="spark-b"):
        res.raise_for_failures()


def test_changed_host_key_is_refused(test_cluster: TestCluster, inv: Inventory) -> None:
    before = test_cluster.known_hosts_path.read_text()
    test_cluster.rotate_host_key("spark-b")
    try:
        with pytest.raises(NodeError) as err:
            _fresh(inv, "spark-b").connect()
        text = err.value.render()
        host = inv.node("spark-b").ssh.host
        assert "CHANGED" in text and "[spark-b]" in text and host in text
        assert f"ssh-keygen -R {host}" in text and "SHA256:" in text
        # accept-new never "accepts" a changed key: known_hosts is untouched
        assert test_cluster.known_hosts_path.read_text() == before
    finally:
        test_cluster.restore_host_keys()
    _fresh(inv, "spark-b").run(["true"], check=True)


def test_unknown_host_pinned_refused_accept_new_added(inv: Inventory, tmp_path: Path) -> None:
    host_a = inv.node("spark-a").ssh.host
    lines = Path(inv.cluster.known_hosts or "").read_text().splitlines()
    kh = tmp_path / "known_hosts"
    kh.write_text("\n".join(ln for ln in lines if ln.split()[0] == host_a) + "\n")
    with pytest.raises(NodeError, match="not in .*'pinned'"):
        _fresh(inv, "spark-b", known_hosts=str(kh), host_key_policy="pinned").connect()
    assert _fresh(inv, "spark-a", known_hosts=str(kh), host_key_policy="pinned").run(["true"]).ok
    ssh = _fresh(inv, "spark-b", known_hosts=str(kh), host_key_policy="accept-new")
    assert ssh.run(["true"]).ok
    assert any(ln.startswith(inv.node("spark-b").ssh.host + " ") for ln in kh.read_text().splitlines())


def test_ssh_down_is_a_named_fast_failure(test_cluster: TestCluster, inv: Inventory) -> None:
    test_cluster.stop_sshd("spark-b")
    try:
        t0 = time.monotonic()
        with pytest.raises(NodeError) as err:
            _fresh(inv, "spark-b").connect()
        elapsed = time.monotonic() - t0
        text = err.value.render()
        assert "spark-b" in text and inv.node("spark-b").ssh.host in text
        assert elapsed < 6.5, elapsed
        res = run_all(inv.nodes, lambda n: _fresh(inv, n.name).run(["true"], check=True))
        assert set(res.failed) == {"spark-b"} and set(res.succeeded) == {"spark-a"}
        rt = DockerRuntime(inv, inv.node("spark-b"), cluster=inv.cluster.name, connector=_fresh(inv, "spark-b"))
        checks = _preflight(inv, rt, _spec(inv, "spark-b", port=30000, image=None), set())
        assert [(c.name, c.ok) for c in checks] == [("ssh", False)]
    finally:
        test_cluster.start_sshd("spark-b")


def test_many_short_commands_at_once_share_one_connection(inv: Inventory) -> None:
    """Commands that end at once, many in parallel on one connection (as preflight runs them): none may lose the
    connection. Sending each command's stdin EOF as a message raced paramiko's answer to the server's CLOSE, and
    OpenSSH then dropped the whole connection ("ieof packet referred to nonexistent channel"; CI, stop 12)."""
    ssh = _fresh(inv, "spark-a")
    try:
        conn = ssh.connect()
        with ThreadPoolExecutor(max_workers=8) as pool:   # under sshd's MaxSessions (10) per connection
            results = list(pool.map(lambda _: ssh.run(["cat", "/proc/loadavg"], check=True).ok, range(320)))
        assert all(results)
        assert ssh.connect() is conn                   # the same connection throughout: never dropped
    finally:
        ssh.close()


def test_more_commands_at_once_than_sshd_allows_wait_for_a_session(inv: Inventory,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Independent reads run beside each other (preflight: up to 14 commands at once on one node): the connector
    keeps at most SESSIONS commands in flight on its connection (sshd's MaxSessions is 10), each runs once and
    succeeds, and every session is given back. Without the bound the test cluster's sshd refused 17-19 channels in
    each `up` (asked again after a wait); how many it refuses now is printed, not asserted (sshd frees a session a
    little after its command ended, later on a loaded machine)."""
    ssh = _fresh(inv, "spark-a")
    inner = ssh._exec_started
    lock, flight, most = threading.Lock(), [0], [0]

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        with lock:
            flight[0] += 1
            most[0] = max(most[0], flight[0])
        try:
            return inner(*args, **kwargs)
        finally:
            with lock:
                flight[0] -= 1
    ssh._exec_started = counted  # type: ignore[method-assign]
    try:
        ssh.connect()
        with caplog.at_level(logging.DEBUG, logger="sparkctl.nodes.ssh"), ThreadPoolExecutor(max_workers=24) as pool:
            results = list(pool.map(lambda i: ssh.run(["sh", "-c", f"sleep 0.3; echo {i}"], check=True).stdout,
                                    range(48)))
        assert results == [f"{i}\n" for i in range(48)]
        assert most[0] == SESSIONS, most                          # bounded, and the bound is reached
        assert ssh._sessions.acquire(blocking=False)             # every session given back
        ssh._sessions.release()
        refused = sum("channel refused" in r.getMessage() for r in caplog.records)
        print(f"\nFIGURE ssh sessions: 48 commands from 24 threads, {SESSIONS} in flight at most, sshd refused "
              f"{refused} channel(s)")
    finally:
        ssh.close()


# The first sshd among the command's ancestors: the session process that serves our connection on the node.
_SSHD_ANCESTOR = ("import os\np = os.getppid()\nwhile open(f'/proc/{p}/comm').read().strip() != 'sshd':\n"
                  "    p = int(open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[1])\n")


def test_a_session_the_node_hung_up_on_is_reopened_but_a_started_command_never_reruns(
        test_cluster: TestCluster, inv: Inventory) -> None:
    """The node's sshd process for our connection dies between commands (sshd restarted, a link flap): the next
    command runs on a new connection. A command that had started when the session died is reported, not re-run."""
    ssh = _fresh(inv, "spark-b")
    try:
        session = int(ssh.run(["python3", "-c", _SSHD_ANCESTOR + "print(p)"], check=True).stdout)
        old = ssh.connect()
        test_cluster.run_in_root("spark-b", ["kill", "-9", str(session)])
        deadline = time.monotonic() + 10
        while old.is_connected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not old.is_connected
        assert ssh.run(["true"]).ok and ssh.connect() is not old

        marker = "/root/started-once"
        test_cluster.run_in_root("spark-b", ["rm", "-f", marker])
        kill_mid_command = (_SSHD_ANCESTOR + f"open('{marker}', 'a').write('run\\n')\n"
                            "os.kill(p, 9)\nimport time\ntime.sleep(5)")
        with pytest.raises(NodeError, match="SSH session to .* failed running .*closed during the command"):
            ssh.run(["python3", "-c", kill_mid_command], timeout=20)
        assert test_cluster.run_in_root("spark-b", ["cat", marker]).stdout == "run\n"
        assert ssh.run(["true"]).ok
    finally:
        ssh.close()


# ------------------------------------------------------------------------------------------------ preflight
def _spec(inv: Inventory, node: str, *, port: int, image: str | None, rank: int = 0) -> LaunchSpec:
    n = inv.node(node)
    Path(n.host_paths.models, "emulated").mkdir(parents=True, exist_ok=True)  # /models/emulated on the node
    return LaunchSpec(rank=rank, node=node,
                      argv=["python3", "-m", "sglang.launch_server", "--model-path", "/models/emulated",
                            "--served-model-name", "emu; name with spaces", "--tp-size", "1", "--nnodes", "1",
                            "--host", "127.0.0.1", "--port", str(port)],
                      env={"SPARKCTL_SIM_BOOT_S": "1", "HF_TOKEN": SECRET,
                           "SGLANG_HOST_IP": n.fabric_address, "NCCL_SOCKET_IFNAME": n.fabric_interface},
                      sglang_version="0.5.23", image=image,
                      mounts=[Mount(source=n.host_paths.models, target="/models", read_only=True),
                              Mount(source=n.host_paths.cache, target="/root/.cache", read_only=False)],
                      secret_values=frozenset({SECRET}))


def _runtime(inv: Inventory, node: str, tmp: Path | None = None) -> DockerRuntime:
    return DockerRuntime(inv, inv.node(node), cluster=inv.cluster.name, connector=_fresh(inv, node),
                         log_dir=tmp, environ=_environ())


def _preflight(inv: Inventory, rt: DockerRuntime, spec: LaunchSpec, own: set) -> list[CheckResult]:
    """What `up` does per node: the runtime gathers, deploy judges."""
    return evaluate(inv, spec, rt.gather(spec), own)


def test_preflight_healthy_cluster(test_cluster: TestCluster, inv: Inventory) -> None:
    res = run_all(inv.nodes, lambda n: _preflight(
        inv, _runtime(inv, n.name), _spec(inv, n.name, port=30000, image=test_cluster.engine_image), set()))
    res.raise_for_failures()
    for node, checks in res.succeeded.items():     # every node's (none failed)
        failed = [c for c in checks if not c.ok]
        assert failed == [], failed
        names = {c.name for c in checks}
        assert {"ssh", "docker", "gpu runtime", "gpu", "fabric interface", "fabric mtu", "port 30000",
                "memory"} <= names
        peer = "spark-b" if node == "spark-a" else "spark-a"
        assert f"fabric peer {peer}" in names
        by = {c.name: c for c in checks}
        assert "mtu 9000" in by["fabric mtu"].seen and "9000-byte packets pass" in by[f"fabric peer {peer}"].seen
        assert by["gpu"].severity is Severity.WARN and by["gpu"].seen.startswith("no nvidia-smi")  # a test node
        assert by["model"].seen.startswith("/models/emulated present")


def test_preflight_wrong_fabric_interface_name(test_cluster: TestCluster, inv: Inventory) -> None:
    node = inv.node("spark-a").model_copy(update={"fabric_interface": "enp9s9f9np9"})
    nodes = [node if n.name == "spark-a" else n for n in inv.nodes]
    bad = inv.model_copy(update={"nodes": nodes})
    rt = DockerRuntime(bad, node, cluster=inv.cluster.name, connector=SSHConnector(node, inv.cluster))
    checks = _preflight(bad, rt, _spec(inv, "spark-a", port=30000, image=None), set())
    failed = [c for c in checks if not c.ok]
    assert [c.name for c in failed] == ["fabric interface"]
    assert "enp9s9f9np9" in failed[0].seen and "spark-a" in failed[0].seen
    assert "enp1s0f0np0" in failed[0].seen                            # lists what is there
    assert "fabric_interface" in failed[0].fix


def test_preflight_detects_a_downed_fabric_link(test_cluster: TestCluster, inv: Inventory) -> None:
    test_cluster.link_down("spark-b")
    try:
        res = run_all(inv.nodes, lambda n: _preflight(inv, _runtime(inv, n.name),
                                                      _spec(inv, n.name, port=30000, image=None), set()))
        failed = {node: {c.name: c for c in checks if not c.ok}
                  for node, checks in res.raise_for_failures().succeeded.items()}
        assert "fabric interface" in failed["spark-b"] and "DOWN" in failed["spark-b"]["fabric interface"].seen
        assert "fabric peer spark-b" in failed["spark-a"]                # the peer does not answer over the fabric
        assert "198.18." in failed["spark-a"]["fabric peer spark-b"].seen
    finally:
        test_cluster.link_up("spark-b")


def test_preflight_port_in_use(test_cluster: TestCluster, inv: Inventory) -> None:
    """Something listening on the node (sshd on the management address, port 22) makes the port check fail;
    the same port held by our own deployment passes."""
    host = inv.node("spark-a").ssh.host
    spec = _spec(inv, "spark-a", port=22, image=None)
    spec = dataclasses.replace(spec, argv=[a if a != "127.0.0.1" else host for a in spec.argv])
    checks = {c.name: c for c in _preflight(inv, _runtime(inv, "spark-a"), spec, set())}
    assert not checks["port 22"].ok and "in use" in checks["port 22"].seen
    checks = {c.name: c for c in _preflight(inv, _runtime(inv, "spark-a"), spec, {(host, 22)})}
    assert checks["port 22"].ok


# ------------------------------------------------------------------------------------------------ docker runtime
def _wait_log(rt: DockerRuntime, handle: DockerHandle, needle: str, offset: int,
              timeout: float = 90.0) -> tuple[str, int]:
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text, offset = rt.read_log(handle, offset)
        seen += text
        if needle in seen:
            return seen, offset
        live = rt.liveness(handle)
        assert live.alive, f"{live.detail}\n{seen[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} not seen within {timeout}s:\n{seen[-3000:]}")


def test_image_id(test_cluster: TestCluster, inv: Inventory) -> None:
    rt = _runtime(inv, "spark-b")
    assert test_cluster.engine_image is not None                       # the test_cluster fixture built it
    assert rt.image_id(test_cluster.engine_image) == test_cluster.engine_image_id
    assert rt.image_id("sparkctl-test-engine:absent") is None


def test_engine_container_lifecycle(test_cluster: TestCluster, inv: Inventory, tmp_path: Path) -> None:
    node = "spark-a"
    rt = _runtime(inv, node, tmp_path / "logs")
    spec = _spec(inv, node, port=30007, image=test_cluster.engine_image)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    handle = rt.start(spec, "cluster-test-lifecycle")
    timings["start"] = time.monotonic() - t0
    try:
        assert handle.runtime == "docker" and handle.node == node and handle.rank == 0
        assert handle.container.startswith(f"sparkctl-{inv.cluster.name}-rank0-")
        assert SECRET not in handle.model_dump_json()
        followed, offset = _wait_log(rt, handle, "fired up and ready", 0)
        timings["ready"] = time.monotonic() - t0
        assert "sparkctl SGLang emulator" in followed
        assert "emu; name with spaces" in followed                       # one argv element, unsplit
        assert rt.liveness(handle).alive
        # a paused container holds its port and answers nothing: not running, with how to resume it
        test_cluster.run_on(node, ["docker", "pause", handle.container_id])
        try:
            live = rt.liveness(handle)
            assert not live.alive and "paused" in live.detail and "docker unpause" in live.detail, live
        finally:
            test_cluster.run_on(node, ["docker", "unpause", handle.container_id])
        assert rt.liveness(handle).alive
        full, end = rt.read_log(handle, 0)
        assert full.startswith(followed) and end >= offset               # following lost and duplicated nothing
        # stop keeps the container: start() of the same deployment again reuses it (rollback's fast path)
        t1 = time.monotonic()
        rt.stop(handle, timeout_s=10)
        timings["stop"] = time.monotonic() - t1
        live = rt.liveness(handle)
        assert not live.alive and live.exit_code is not None and "exited" in live.detail
        t2 = time.monotonic()
        handle2 = rt.start(spec, "cluster-test-lifecycle")
        timings["restart"] = time.monotonic() - t2
        assert handle2.container_id == handle.container_id and handle2.log_since
        again, _ = _wait_log(rt, handle2, "fired up and ready", 0)
        timings["restart_ready"] = time.monotonic() - t2
        assert again.count("sparkctl SGLang emulator") == 1             # the new run's log only
        # the env reached the container, and the JIT cache dirs exist on the host
        env = test_cluster.run_on(node, ["docker", "exec", handle.container_id, "printenv", "HF_TOKEN"]).stdout
        assert env.strip() == SECRET
        cache = Path(inv.node(node).host_paths.cache)
        assert (cache / "tilelang").is_dir() and (cache / "triton").is_dir()
    finally:
        rt.stop(handle, timeout_s=5)
        rt.remove(handle)
    assert "gone" in rt.liveness(handle).detail
    archived = list((tmp_path / "logs").glob("rank0-*.log"))
    assert archived and "fired up" in archived[0].read_text() and SECRET not in archived[0].read_text()
    print("docker runtime timings (s):", {k: round(v, 2) for k, v in timings.items()})


def test_engine_that_dies_reports_exit_code(test_cluster: TestCluster, inv: Inventory) -> None:
    rt = _runtime(inv, "spark-b")
    spec = _spec(inv, "spark-b", port=30008, image=test_cluster.engine_image)
    spec = dataclasses.replace(spec, argv=["python3", "-c", "import sys; print('bye'); sys.exit(3)"])
    handle = rt.start(spec, "cluster-test-dies")
    try:
        deadline = time.monotonic() + 30
        while rt.liveness(handle).alive and time.monotonic() < deadline:
            time.sleep(0.2)
        live = rt.liveness(handle)
        assert not live.alive and live.exit_code == 3 and "(3)" in live.detail
        assert rt.read_log(handle, 0)[0] == "bye\n"
    finally:
        rt.remove(handle)


# ------------------------------------------------------------------------------------------------ following a boot
_TALKER = ("import sys, time\n"
           "for i in range(40):\n"
           "    print(f'line {i} token=" + SECRET + " ünï 漢字', flush=True)\n"
           "    if i % 7 == 0: print(f'err {i}', file=sys.stderr, flush=True)\n"
           "    time.sleep(0.02)\n"
           "print('quiet now', flush=True)\n"
           "time.sleep(600)\n")


def _followers(test_cluster: TestCluster, node: str, cid: str) -> list[str]:
    """The node's processes of a log stream of container `cid` (docker_follow.FOLLOW_SCRIPT's)."""
    ps = test_cluster.run_on(node, ["ps", "-ww", "-eo", "pid=,args="]).stdout.splitlines()   # -ww: never cut
    return [ln for ln in ps if cid in ln and "docker logs" in ln]


def test_a_followed_log_streams_what_a_read_gives_and_nothing_outlives_it(test_cluster: TestCluster,
                                                                           inv: Inventory) -> None:
    """`follow` (a boot): the log comes over one stream, read from memory at the same offsets as a read of the
    whole log (redacted the same), liveness asks the node only after a quiet spell (and then sees a SIGSTOP), the
    stream ends with the container, and `unfollow` leaves no `docker logs` on the node."""
    from sparkctl.nodes.docker_follow import QUIET_CHECK_S
    node = "spark-b"
    rt = _runtime(inv, node)
    spec = dataclasses.replace(_spec(inv, node, port=30011, image=test_cluster.engine_image),
                               argv=["python3", "-c", _TALKER])
    handle = rt.start(spec, "cluster-test-follow")
    try:
        rt.follow(handle, 120)
        assert rt.poll_interval_s == DockerRuntime.STREAM_POLL_S
        streamed, offset = _wait_log(rt, handle, "quiet now", 0)
        assert _followers(test_cluster, node, handle.container_id)        # the stream on the node
        assert SECRET not in streamed and streamed.count("line ") == 40 and "err 35" in streamed
        plain = _runtime(inv, node)                          # no stream: `docker logs` of the whole log
        plain.secret_values = {SECRET}
        whole, end = plain.read_log(handle, 0)
        assert whole == streamed and end == offset
        assert plain.read_log(handle, offset // 2)[0] == whole.encode()[offset // 2:].decode("utf-8", "replace")
        # quiet and stopped: seen within a quiet spell and a check
        test_cluster.run_on(node, ["docker", "kill", "--signal", "STOP", handle.container_id])
        deadline = time.monotonic() + 2 * QUIET_CHECK_S + 10
        while rt.liveness(handle).alive and time.monotonic() < deadline:
            time.sleep(0.2)
        live = rt.liveness(handle)
        assert not live.alive and "stopped" in live.detail, live
        test_cluster.run_on(node, ["docker", "kill", "--signal", "CONT", handle.container_id])
        # the container ends: so does its stream, and the runtime asks the node again
        test_cluster.run_on(node, ["docker", "kill", handle.container_id])
        deadline = time.monotonic() + 20
        while rt.poll_interval_s == DockerRuntime.STREAM_POLL_S and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rt.poll_interval_s == DockerRuntime.POLL_S
        live = rt.liveness(handle)
        assert not live.alive and "exited" in live.detail, live
        assert rt.read_log(handle, offset) == ("", offset)
        assert _followers(test_cluster, node, handle.container_id) == []
    finally:
        rt.unfollow()
        rt.remove(handle)


def test_a_log_stream_ends_on_the_node_when_its_follower_ends_or_is_killed(test_cluster: TestCluster,
                                                                            inv: Inventory) -> None:
    """The stream's `docker logs --follow` on the node ends when `unfollow` closes the channel, and when the process
    that opened it is SIGKILLed (its connection dies with it): a boot's end, a Ctrl-C or a kill -9 of `up`."""
    import os
    import signal
    import subprocess
    import sys
    node = "spark-a"
    rt = _runtime(inv, node)
    spec = dataclasses.replace(_spec(inv, node, port=30012, image=test_cluster.engine_image),
                               argv=["python3", "-c", _TALKER])
    handle = rt.start(spec, "cluster-test-follow-end")
    cid = handle.container_id

    def gone(within: float) -> list[str]:
        deadline = time.monotonic() + within
        while (left := _followers(test_cluster, node, cid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    try:
        rt.follow(handle, 120)
        _wait_log(rt, handle, "quiet now", 0)
        assert _followers(test_cluster, node, cid)
        rt.unfollow()
        assert gone(10) == []
        script = ("import sys, time\n"
                  "from sparkctl.config.inventory import load_inventory\n"
                  "from sparkctl.nodes.docker_runtime import DockerRuntime\n"
                  "from sparkctl.nodes.handles import DockerHandle\n"
                  "inv = load_inventory(sys.argv[1])\n"
                  "rt = DockerRuntime(inv, inv.node(sys.argv[2]), cluster=inv.cluster.name)\n"
                  "h = DockerHandle.model_validate_json(sys.argv[3])\n"
                  "rt.follow(h, 120)\n"
                  "while 'quiet now' not in rt.read_log(h, 0)[0]: time.sleep(0.1)\n"
                  "print('following', flush=True)\n"
                  "time.sleep(600)\n")
        repo = Path(__file__).resolve().parents[2]
        proc = subprocess.Popen([sys.executable, "-c", script, str(test_cluster.inventory_path), node,
                                 handle.model_dump_json()], stdout=subprocess.PIPE, text=True, cwd=repo,
                                env={**os.environ, "PYTHONPATH": str(repo)})
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "following"
            assert _followers(test_cluster, node, cid)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        assert gone(10) == []
    finally:
        rt.unfollow()
        rt.remove(handle)
