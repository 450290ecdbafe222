"""Fact parsers fed with REAL captured output (tests/fixtures/captures/spark, byte-identical copies of
real output, each naming its source in its header). Each capture's 3 header lines are stripped by `capture_text`; the
`[...]` cut marks stay in, so every parser must tolerate them. Live-only forms (JSON, ss, ping) use output captured
from iproute2/iputils/docker on the test cluster (marked as such)."""
from __future__ import annotations

import re

import pytest

from sparkctl.nodes import docker_facts, facts
from testrig.captures import capture_text

SPARK = "spark"


def _section(text: str, command: str) -> str:
    """The output printed after the probe script's ``$ command`` echo line, up to the next ``$ `` line."""
    out, inside = [], False
    for ln in text.split("\n"):
        if ln.startswith("$ "):
            inside = ln[2:].startswith(command)
            continue
        if inside:
            out.append(ln)
    assert out, f"no section for {command!r}"
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------ docker


# `docker info --format '{{json .}}'` from the test cluster's daemon (Docker 20.10.24, nvidia -> runc), trimmed to
# the keys sparkctl reads, and the same command with no daemon (CLI 28.2.2 prints empty fields and exits 1).
LIVE_DOCKER_INFO = ('{"ID":"PLKA","Name":"spark-a","ServerVersion":"20.10.24+dfsg1","Architecture":"x86_64",'
                    '"LoggingDriver":"json-file","Runtimes":{"io.containerd.runc.v2":{"path":"runc"},'
                    '"io.containerd.runtime.v1.linux":{"path":"runc"},"nvidia":{"path":"runc"},"runc":{"path":"runc"}},'
                    '"DefaultRuntime":"runc"}')
NO_DAEMON_DOCKER_INFO = ('{"ID":"","Containers":0,"Images":0,"Driver":"","Name":"","ServerVersion":"","Runtimes":null,'
                         '"DefaultRuntime":"","ClientInfo":{"Debug":false,"Version":"28.2.2"}}')


def test_docker_info_json() -> None:
    info = docker_facts.parse_docker_info_json(LIVE_DOCKER_INFO)
    assert info.server_version == "20.10.24+dfsg1" and info.name == "spark-a"
    assert "nvidia" in info.runtimes and info.runtime_is_runc_alias("nvidia")
    real = docker_facts.parse_docker_info_json(
        '{"ServerVersion":"29.2.1","Runtimes":{"nvidia":{"path":"nvidia-container-runtime"},"runc":{"path":"runc"}}}')
    assert not real.runtime_is_runc_alias("nvidia")


def test_docker_info_json_without_daemon_is_not_answering() -> None:
    info = docker_facts.parse_docker_info_json(NO_DAEMON_DOCKER_INFO)
    assert not info.answering and info.runtimes == ()


def test_image_id() -> None:
    digest = "sha256:" + "a" * 64
    assert docker_facts.parse_image_id(digest + "\n") == digest
    assert docker_facts.parse_image_id("") is None
    assert docker_facts.image_id("sglang-gb10:abc").argv == ("docker", "image", "inspect", "--format", "{{.Id}}",
                                                      "sglang-gb10:abc")


# ------------------------------------------------------------------------------------------------ memory


def test_meminfo_from_the_same_capture() -> None:
    text = capture_text(f"{SPARK}/free-h-meminfo-docker-ps-3-sparks-zh.txt")
    blocks = re.split(r"^### spark-\d\n", text, flags=re.M)[1:]
    mem = facts.parse_meminfo(blocks[0])
    assert mem.total == 127600748 * 1024
    assert mem.available == 3659708 * 1024
    assert mem.swap_free == 10196356 * 1024
    assert facts.parse_meminfo(blocks[2]).available == 4598708 * 1024


# ------------------------------------------------------------------------------------------------ network


# `ip -j addr show` on the test cluster's spark-a (iproute2 6.1), loopback and mgmt0 dropped.
LIVE_IP_JSON = ('[{"ifindex":3,"link_index":3,"ifname":"enp1s0f0np0","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],'
                '"mtu":9000,"qdisc":"noqueue","operstate":"UP","group":"default","txqlen":1000,"link_type":"ether",'
                '"address":"da:d2:9a:cd:b8:c3","broadcast":"ff:ff:ff:ff:ff:ff","link_netnsid":0,"addr_info":[{"family":'
                '"inet","local":"198.18.7.1","prefixlen":24,"scope":"global","label":"enp1s0f0np0","valid_life_time":'
                '4294967295,"preferred_life_time":4294967295},{"family":"inet6","local":"fe80::d8d2:9aff:fecd:b8c3",'
                '"prefixlen":64,"scope":"link","valid_life_time":4294967295,"preferred_life_time":4294967295}]}]')


def test_ip_json() -> None:
    ifaces = facts.parse_ip_addr_json(LIVE_IP_JSON)
    f = ifaces["enp1s0f0np0"]
    assert f.up and f.mtu == 9000 and f.ipv4 == ("198.18.7.1",)
    assert facts.parse_ip_addr_json("") == {}
    down = facts.parse_ip_addr_json(LIVE_IP_JSON.replace('"operstate":"UP"', '"operstate":"LOWERLAYERDOWN"'))
    assert not down["enp1s0f0np0"].up


# iputils ping on the test cluster: a reply; don't-fragment larger than the MTU (stderr line included); no reply.
PING_OK = ("PING 198.18.7.2 (198.18.7.2) 8972(9000) bytes of data.\n8980 bytes from 198.18.7.2: icmp_seq=1 ttl=64 "
           "time=0.030 ms\n\n--- 198.18.7.2 ping statistics ---\n1 packets transmitted, 1 received, 0% packet loss, "
           "time 0ms\nrtt min/avg/max/mdev = 0.030/0.030/0.030/0.000 ms\n")
PING_TOO_BIG = ("PING 198.18.7.2 (198.18.7.2) 9000(9028) bytes of data.\n\n"
                "--- 198.18.7.2 ping statistics ---\n1 packets "
                "transmitted, 0 received, +1 errors, 100% packet loss, time 0ms\n\nping: local error: message too "
                "long, mtu=9000\n")
PING_LOST = ("PING 198.18.7.99 (198.18.7.99) 56(84) bytes of data.\n\n--- 198.18.7.99 ping statistics ---\n1 packets "
             "transmitted, 0 received, 100% packet loss, time 0ms\n\n")


def test_ping() -> None:
    ok = facts.parse_ping(PING_OK)
    assert ok.ok and ok.rtt_ms == 0.03
    big = facts.parse_ping(PING_TOO_BIG)
    assert not big.ok and big.error == "message too long, mtu=9000"
    assert not facts.parse_ping(PING_LOST).ok and facts.parse_ping(PING_LOST).error is None
    assert facts.ping("198.18.0.2", size=8972).argv == ("ping", "-n", "-c1", "-W1", "-M", "do", "-s", "8972",
                                                        "198.18.0.2")


def test_ss_listen_and_port_conflicts() -> None:
    text = ("LISTEN 0      128    198.19.7.1:22 0.0.0.0:*\n"
            "LISTEN 0      4096   127.0.0.53%lo:53        0.0.0.0:*\n"
            "LISTEN 0      511             [::]:8080           [::]:*\n")
    listeners = facts.parse_ss_listen(text)
    assert facts.Listener("127.0.0.53", 53) in listeners and facts.Listener("::", 8080) in listeners
    assert facts.port_conflict(listeners, "0.0.0.0", 22) is not None       # wildcard bind overlaps
    assert facts.port_conflict(listeners, "198.18.7.1", 22) is None        # another address, same port: fine
    assert facts.port_conflict(listeners, "127.0.0.1", 8080) is not None   # [::] listener holds every address
    assert facts.port_conflict(listeners, "0.0.0.0", 30000) is None


@pytest.mark.parametrize("name,expected", [
    ("ibdev2netdev-two-sparks-port0-up.txt",
     [("rocep1s0f0", "enp1s0f0np0", True), ("rocep1s0f1", "enp1s0f1np1", False),
      ("roceP2p1s0f0", "enP2p1s0f0np0", True), ("roceP2p1s0f1", "enP2p1s0f1np1", False)] * 2),
    ("ibdev2netdev-port1-up.txt",
     [("roceP2p1s0f0", "enP2p1s0f0np0", False), ("roceP2p1s0f1", "enP2p1s0f1np1", True),
      ("rocep1s0f0", "enp1s0f0np0", False), ("rocep1s0f1", "enp1s0f1np1", True)]),
    ("ibdev2netdev-all-four-up.txt",
     [("rocep1s0f0", "enp1s0f0np0", True), ("rocep1s0f1", "enp1s0f1np1", True),
      ("roceP2p1s0f0", "enP2p1s0f0np0", True), ("roceP2p1s0f1", "enP2p1s0f1np1", True)]),
])
def test_ibdev2netdev_captures(name: str, expected: list[tuple[str, str, bool]]) -> None:
    links = facts.parse_ibdev2netdev(capture_text(f"{SPARK}/{name}"))
    assert [(ln.hca, ln.netdev, ln.up) for ln in links] == expected
    assert all(ln.port == 1 for ln in links)


# ------------------------------------------------------------------------------------------------ GPU
def test_gpu_query_capture_name_only() -> None:
    text = capture_text(f"{SPARK}/dev-nvidia-ls-and-query-gpu-name-noheader.txt")
    answer = text.split("E. nvidia-smi works on host?\n", 1)[1]
    gpus = facts.parse_gpu_query(answer)
    assert gpus == [facts.Gpu("NVIDIA GB10")] and gpus[0].is_gb10


def test_gpu_query_with_driver() -> None:
    assert facts.parse_gpu_query("NVIDIA GB10, 580.95.05\n") == [facts.Gpu("NVIDIA GB10", "580.95.05")]


@pytest.mark.parametrize("name,driver,persist,procs,compute", [
    ("nvidia-smi-gb10-580.82-processes.txt", "580.82.09", None,
     [(3405, "G", "/usr/lib/xorg/Xorg", 242), (3562, "G", "/usr/bin/gnome-shell", 53),
      (214921, "C", ".../envs/rapids-25.10/bin/python", 196)], 1),
    ("nvidia-smi-gb10-580.95-idle.txt", "580.95.05", None, [], 0),
])
def test_nvidia_smi_table_captures(name: str, driver: str, persist: object, procs: list[tuple[int, str, str, int]],
                                   compute: int) -> None:
    smi = facts.parse_nvidia_smi(capture_text(f"{SPARK}/{name}"))
    assert smi.driver_version == driver and smi.cuda_version == "13.0"
    assert smi.gpus == [(0, "NVIDIA GB10", "0000000F:01:00.0")]
    assert [(p.pid, p.type, p.name, p.memory_mib) for p in smi.processes] == procs
    assert len(smi.compute_processes) == compute


def test_nvidia_smi_table_in_probe_dump() -> None:
    smi = facts.parse_nvidia_smi(capture_text(f"{SPARK}/gb10-probe-free-nvidia-smi-topo-m.txt"))
    assert smi.driver_version == "580.142"
    assert smi.gpus == [(0, "NVIDIA GB10", "0000000F:01:00.0")]
    assert [p.pid for p in smi.processes] == [2747, 2911] and smi.compute_processes == []


def test_container_inspect() -> None:
    text = ('{"Id":"abc","Name":"/sparkctl-desk-rank0-1","Image":"sha256:ff",'
            '"State":{"Status":"exited","Running":false,'
            '"OOMKilled":true,"ExitCode":137,"Error":"","StartedAt":"2026-01-01T00:00:00.1Z",'
            '"FinishedAt":"2026-01-01T00:01:00Z"},"Config":{"Labels":{"sparkctl.rank":"0"},"Env":["A=1"],'
            '"Cmd":["python3","-m","sglang.launch_server"]}}')
    st = docker_facts.parse_container_inspect(text)
    assert st is not None and st.name == "sparkctl-desk-rank0-1" and st.exit_code == 137 and st.oom_killed
    assert st.describe() == "container exited (137) (OOM-killed)"
    assert docker_facts.parse_container_inspect("") is None


# `docker top CONTAINER -o pid,stat,comm` on the test cluster's spark-b daemon (Docker 20.10.24, over SSH), a
# container started with --init running python3 with a `sleep` child: the child SIGSTOPped from the node (state T),
# then the container paused (the freezer: every process in D).
LIVE_DOCKER_TOP_STOPPED = ("PID                 STAT                COMMAND\n"
                           "1542                Ss                  docker-init\n"
                           "1555                S                   python3\n"
                           "1557                T                   sleep\n")
LIVE_DOCKER_TOP_PAUSED = ("PID                 STAT                COMMAND\n"
                          "1542                Ds                  docker-init\n"
                          "1555                D                   python3\n"
                          "1557                D                   sleep\n")


def test_docker_top() -> None:
    assert docker_facts.container_processes("abc").argv == ("docker", "top", "abc", "-o", "pid,stat,comm")
    procs = docker_facts.parse_docker_top(LIVE_DOCKER_TOP_STOPPED)
    assert [(p.pid, p.state, p.command) for p in procs] == [(1542, "S", "docker-init"), (1555, "S", "python3"),
                                                             (1557, "T", "sleep")]
    assert {p.state for p in docker_facts.parse_docker_top(LIVE_DOCKER_TOP_PAUSED)} == {"D"}
    assert docker_facts.parse_docker_top("") == [] and docker_facts.parse_docker_top("[...]\n") == []


def _liveness_script_run(tmp_path, inspect_rc: int, inspect_out: str, top_rc: int, top_out: str):
    """The liveness argv run by a real `sh`, with a `docker` on PATH answering as the real one did (the captured
    outputs above): what the node's shell does between the two answers (order, mark, exit status)."""
    import os
    import stat
    import subprocess
    (tmp_path / "inspect.out").write_text(inspect_out)
    (tmp_path / "top.out").write_text(top_out)
    docker = tmp_path / "docker"
    docker.write_text("#!/bin/sh\n"
                      f'if [ "$1" = container ]; then cat {tmp_path}/inspect.out; '
                      f'[ {inspect_rc} = 0 ] || echo "Error: No such container: $5" >&2; exit {inspect_rc}; fi\n'
                      f'if [ "$1" = top ]; then cat {tmp_path}/top.out; exit {top_rc}; fi\nexit 99\n')
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    argv = list(docker_facts.container_liveness("c" * 64).argv)
    return subprocess.run(argv, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})


def test_container_liveness_is_one_argv_read_by_both_parsers(tmp_path) -> None:
    """Liveness asks `docker inspect` and `docker top` in one remote argv (one SSH round trip); the container
    reaches the script as $1, never spliced into its text; each answer goes to its own parser."""
    fact = docker_facts.container_liveness("c" * 64)
    assert fact.argv[:2] == ("sh", "-c") and fact.argv[3:] == ("sh", "c" * 64) and "c" * 64 not in fact.argv[2]
    running = ('{"Id":"' + "c" * 64 + '","Name":"/sparkctl-desk-rank1-1","Image":"sha256:ff","State":{"Status":'
               '"running","Running":true,"Paused":false,"OOMKilled":false,"ExitCode":0,"Error":"","StartedAt":'
               '"2026-01-01T00:00:00.1Z","FinishedAt":"0001-01-01T00:00:00Z"},"Config":{"Labels":{}}}\n')
    res = _liveness_script_run(tmp_path, 0, running, 0, LIVE_DOCKER_TOP_STOPPED)
    assert res.returncode == 0, res.stderr
    seen = fact.parse(res.stdout)
    assert seen.state is not None and seen.state.running and seen.state.name == "sparkctl-desk-rank1-1"
    assert seen.state == docker_facts.parse_container_inspect(running)
    assert seen.processes == docker_facts.parse_docker_top(LIVE_DOCKER_TOP_STOPPED)
    assert [p.pid for p in seen.processes if p.state == "T"] == [1557]
    # a container that is not running: `docker top` fails, the answer is the state and no process list
    exited = running.replace('"running","Running":true', '"exited","Running":false')
    res = _liveness_script_run(tmp_path, 0, exited, 1, "")
    seen = fact.parse(res.stdout)
    assert res.returncode == 0 and seen.state is not None and seen.state.status == "exited" and seen.processes == []
    # no such container: inspect's exit status and message are the command's (the runtime reads "no such")
    res = _liveness_script_run(tmp_path, 1, "", 0, LIVE_DOCKER_TOP_STOPPED)
    assert res.returncode == 1 and "No such container" in res.stderr and docker_facts.LIVENESS_MARK not in res.stdout
    assert fact.parse(res.stdout) == docker_facts.ContainerLiveness(None, [])
