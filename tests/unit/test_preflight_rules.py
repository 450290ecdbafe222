"""Preflight rules (deploy/preflight_rules.py) judged on captured output of real Sparks: pure, no node needed."""
from __future__ import annotations

from pathlib import Path

from sparkctl.config.inventory import load_inventory
from sparkctl.deploy.preflight_rules import evaluate, gpu_checks, gpu_idle_check, hca_check, memory_check
from sparkctl.nodes import facts
from sparkctl.nodes.node_facts import NodeFacts
from sparkctl.nodes.ssh import CommandResult
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.state.records import Severity
from testrig.captures import capture_text

REPO = Path(__file__).resolve().parents[2]
INV = load_inventory(REPO / "inventory" / "sparks.example.yml")


def _out(stdout: str = "", returncode: int = 0, stderr: str = "") -> CommandResult:
    return CommandResult("spark-a", ["x"], returncode, stdout, stderr, 0.0)


def _section(text: str, start: str, end: str | None) -> str:
    body = text.split(start, 1)[1]
    return body.split(end, 1)[0] if end else body


def test_roce_hcas_of_the_cabled_port_pass_and_the_uncabled_twin_fails():
    text = _section(capture_text("spark/ibdev2netdev-two-sparks-port0-up.txt"), "spark-5c2d:~$ ibdev2netdev",
                    "nvidia@spark-bd26")
    node = INV.node("spark-a")                       # roce_hcas: [rocep1s0f0, roceP2p1s0f0]
    check = hca_check(node, _out(text))
    assert check.severity is Severity.OK and "rocep1s0f0 -> enp1s0f0np0 (Up)" in check.seen
    wrong = node.model_copy(update={"roce_hcas": ["rocep1s0f1"]})
    check = hca_check(wrong, _out(text))
    assert check.severity is Severity.FAIL and "rocep1s0f1: enp1s0f1np1 down" in check.seen
    assert hca_check(node, _out(returncode=127)).severity is Severity.WARN    # not verifiable: a warning


def test_gpu_idle_on_captured_nvidia_smi():
    busy = facts.parse_nvidia_smi(capture_text("spark/nvidia-smi-gb10-580.82-processes.txt"))
    check = gpu_idle_check("spark-a", busy, ours_running=False)
    assert check.severity is Severity.FAIL and "pid 214921" in check.seen and "spark-a" in check.fix
    assert gpu_idle_check("spark-a", busy, ours_running=True).severity is Severity.WARN
    idle = facts.parse_nvidia_smi(capture_text("spark/nvidia-smi-gb10-580.95-idle.txt"))
    assert gpu_idle_check("spark-b", idle, ours_running=False).severity is Severity.OK


def test_memory_with_little_available_warns_on_the_captured_meminfo():
    text = _section(capture_text("spark/free-h-meminfo-docker-ps-3-sparks-zh.txt"), "### spark-1", "### spark-2")
    check = memory_check("spark-a", facts.parse_meminfo(text))
    assert check.severity is Severity.WARN and "3.5 GiB available of 121.7 GiB" in check.seen
    assert check.line.startswith("memory: warning: ")
    assert memory_check("spark-a", None).severity is Severity.FAIL


MEMINFO_DEV = REPO / "tests" / "fixtures" / "meminfo" / "dev-host-24g-no-swap.txt"


def test_memory_against_the_fraction_on_a_real_gb10_meminfo_fails_and_names_the_fix():
    # spark-1 of the 3-Spark capture: 3.5 GiB available of 121.7 GiB, 6.3 GiB swapped out (an engine still runs)
    text = _section(capture_text("spark/free-h-meminfo-docker-ps-3-sparks-zh.txt"), "### spark-1", "### spark-2")
    check = memory_check("spark-a", facts.parse_meminfo(text), 0.88)
    assert check.severity is Severity.FAIL and check.node == "spark-a"
    assert "mem_fraction_static 0.88 x 121.7 GiB = 107.1 GiB for the engine" in check.seen
    assert "short even with the page cache dropped" in check.seen and "6.3 GiB of swap in use" in check.seen
    assert "drop_caches" in check.fix and "no smaller fraction would hold a model here" in check.fix
    # sparkctl's own engine holds that memory and is stopped before the boot: not a failure
    assert memory_check("spark-a", facts.parse_meminfo(text), 0.88, ours_running=True).severity is Severity.WARN


def test_swap_in_use_with_enough_memory_warns_with_a_fix_on_a_real_gb10_meminfo():
    # spark-2 of the 3-Spark capture: 4.4 GiB available, 4.2 GiB swapped out; a fraction that fits in what is free
    text = _section(capture_text("spark/free-h-meminfo-docker-ps-3-sparks-zh.txt"), "### spark-2", "### spark-3")
    check = memory_check("spark-b", facts.parse_meminfo(text), 0.03)
    assert check.severity is Severity.WARN and "4.2 GiB of swap in use" in check.seen, check
    assert "swapoff" in check.fix and "spark-b" in check.fix


def test_memory_free_cache_and_swap_on_a_real_meminfo():
    mem = facts.parse_meminfo(MEMINFO_DEV.read_text())
    assert (mem.free, mem.cached, mem.shmem) == (21130744 * 1024, 2026412 * 1024, 9828 * 1024)
    assert mem.evictable_cache == (2026412 - 9828) * 1024 and mem.swap_used == 0
    ok = memory_check("dev", mem, 0.80)                 # 18.8 GiB wanted, 20.2 GiB free
    assert ok.severity is Severity.OK and "20.2 GiB free, 1.9 GiB more in droppable page cache" in ok.seen
    cache = memory_check("dev", mem, 0.90)              # 21.2 GiB wanted: free only once the page cache goes
    assert cache.severity is Severity.WARN and "echo 3 | sudo tee /proc/sys/vm/drop_caches" in cache.fix
    assert "`sparkctl watch` does it before its restarts where `prepare_drop_caches: true`" in cache.fix
    assert "enough only once 1.0 GiB of page cache is evicted" in cache.seen
    short = memory_check("dev", mem, 0.97)              # 22.8 GiB wanted: 22.1 GiB even with the cache dropped
    assert short.severity is Severity.FAIL and "0.8 GiB short" in short.seen and "0.91 or less" in short.fix
    # the embedded cluster's emulator takes none of it: the same shortfall only warns, and says why
    emb = memory_check("local", mem, 0.97, embedded=True)
    assert emb.severity is Severity.WARN and "embedded cluster" in emb.seen
    assert emb.fix == short.fix.replace("dev", "local")


def test_memory_fraction_is_read_from_the_rendered_argv():
    from sparkctl.deploy.preflight_rules import mem_fraction_of
    assert mem_fraction_of(["python3", "-m", "sglang.launch_server", "--mem-fraction-static", "0.88"]) == 0.88
    assert mem_fraction_of(["--mem-fraction-static=0.7"]) == 0.7
    assert mem_fraction_of(["--tp-size", "2"]) is None and mem_fraction_of(["--mem-fraction-static"]) is None


def test_embedded_node_reads_this_machines_meminfo():
    from sparkctl.nodes.process import read_local_meminfo
    spec = LaunchSpec(rank=0, node="local-a", sglang_version="0.5.23", env={},
                      argv=["python3", "-m", "sglang.launch_server", "--mem-fraction-static", "0.5"])
    nf = NodeFacts("local-a", "process", ports_free={("127.0.0.1", 30000): True},
                   outputs={"mem": read_local_meminfo("local-a")})
    mem = [c for c in evaluate(INV, spec, nf, set()) if c.name == "memory"]
    assert len(mem) == 1 and mem[0].severity is not Severity.FAIL and "mem_fraction_static 0.5" in mem[0].seen
    missing = read_local_meminfo("local-a", "/nonexistent/meminfo")
    assert missing.returncode == 1 and "/nonexistent/meminfo" in missing.stderr


def test_no_nvidia_smi_fails_a_real_node_and_warns_without_a_gpu_runtime():
    node = INV.node("spark-a")
    missing = _out(returncode=127, stderr="bash: nvidia-smi: command not found")
    docker = _out('{"ServerVersion": "28.0", "Runtimes": {"runc": {"path": "runc"}}, "DefaultRuntime": "runc"}')
    assert [c.severity for c in gpu_checks(node, missing, docker)] == [Severity.FAIL]
    none = node.model_copy(update={"gpu_runtime": "none"})
    assert [c.severity for c in gpu_checks(none, missing, docker)] == [Severity.WARN]


def test_unreachable_node_is_one_failed_ssh_check():
    from sparkctl.errors import NodeError
    spec = LaunchSpec(rank=1, node="spark-b", argv=["python3", "-m", "sglang.launch_server"], env={},
                      sglang_version="0.5.23")
    nf = NodeFacts("spark-b", "docker", unreachable=NodeError("cannot reach spark-b over SSH", hint="check sshd"))
    checks = evaluate(INV, spec, nf, set())
    assert [(c.name, c.severity, c.fix) for c in checks] == [("ssh", Severity.FAIL, "check sshd")]


def test_process_node_ports_busy_fail_unless_ours():
    spec = LaunchSpec(rank=0, node="spark-a", sglang_version="0.5.23", env={},
                      argv=["python3", "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", "30000",
                            "--dist-init-addr", "127.0.0.1:20000"])
    nf = NodeFacts("spark-a", "process", ports_free={("127.0.0.1", 30000): False, ("127.0.0.1", 20000): True})
    by = {c.name: c for c in evaluate(INV, spec, nf, set())}
    assert by["port 30000"].severity is Severity.FAIL and "already in use" in by["port 30000"].seen
    assert by["port 20000"].ok and by["engine"].ok
    by = {c.name: c for c in evaluate(INV, spec, nf, {("127.0.0.1", 30000)})}
    assert by["port 30000"].ok and "held by the active deployment" in by["port 30000"].seen
