"""testrig.testenv.free_port hands every caller of a run its own port, outside the kernel's ephemeral range, across
processes (the xdist workers): the class behind an engine's "Address already in use" on a port a test was given."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from testrig.testenv import TEST_PORTS, free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ("import sys; from testrig.testenv import free_port\n"
          "print(' '.join(str(free_port(sys.argv[1])) for _ in range(int(sys.argv[2]))))\n")


def _ephemeral() -> tuple[int, int]:
    lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(lo), int(hi)


def test_concurrent_processes_never_share_a_port_and_none_is_ephemeral():
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, host, "60"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
             for host in ("127.0.0.1", "127.0.0.2", "127.0.0.1", "127.0.0.3")]
    ports = [int(p) for proc in procs for p in proc.communicate(timeout=60)[0].split()]
    assert all(proc.returncode == 0 for proc in procs)
    assert len(ports) == 240 and len(set(ports)) == 240, sorted(ports)
    lo, hi = _ephemeral()
    assert all(TEST_PORTS[0] <= p < TEST_PORTS[1] and not lo <= p <= hi for p in ports)


def test_a_held_port_is_passed_over():
    first = free_port("127.0.0.2")
    holders = []
    try:
        for k in range(1, 4):                       # the next three ports are held by someone else
            s = socket.socket()
            s.bind(("127.0.0.2", first + k))
            holders.append(s)
        nxt = free_port("127.0.0.2")
    finally:
        for s in holders:
            s.close()
    assert nxt not in {first + k for k in range(0, 4)}
    with socket.socket() as s:
        s.bind(("127.0.0.2", nxt))
