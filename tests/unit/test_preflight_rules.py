"""Preflight rules (deploy/preflight_rules.py) judged on captured output of real Sparks: pure, no node needed."""
from __future__ import annotations

from pathlib import Path

from tests.sglang_captures import capture_text

from sparkctl.config.inventory import load_inventory
from sparkctl.deploy.preflight import Severity
from sparkctl.deploy.preflight_rules import evaluate, gpu_checks, gpu_idle_check, hca_check, memory_check
from sparkctl.nodes import facts
from sparkctl.nodes.node_facts import NodeFacts
from sparkctl.nodes.results import CommandResult
from sparkctl.sglang.launch import LaunchSpec

REPO = Path(__file__).resolve().parents[2]
INV = load_inventory(REPO / "sparkctl" / "data" / "inventory" / "sparks.example.yml")


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
