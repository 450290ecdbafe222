"""Two ranks over loopback: rank 0 on 127.0.0.2 hosts the store, rank 1 on 127.0.0.3 joins."""
from __future__ import annotations

import re
import time

import httpx
import pytest

from sparkctl.nodes.process import local_port_free
from testrig.testenv import free_port

R0, R1 = "127.0.0.2", "127.0.0.3"


def _argv(store_port: int, rank: int) -> list[str]:
    return ["--tp-size", "2", "--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", f"{R0}:{store_port}"]


def _health(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=1).status_code
    except httpx.TransportError:
        return None


def test_rank0_ready_only_after_rank1_joins(sim):
    store, port = free_port(R0), free_port(R0)
    r0 = sim(_argv(store, 0), host=R0, port=port, knobs={"peer_timeout_s": 3})
    r0.wait_for(r"Init torch distributed begin")
    time.sleep(1.0)                                   # boot_s is 0.3: rank 0 would be ready by now alone
    assert "fired up" not in r0.text and "Load weight begin" not in r0.text
    assert _health(r0.url("/health")) != 200
    r1 = sim(_argv(store, 1), host=R1, port=port, knobs={"peer_timeout_s": 3})
    r0.wait_ready()
    r1.wait_for(rf"Dummy health check server started in background thread at 127\.0\.0\.3:{port}")
    for text, tag in ((r0.text, "TP0"), (r1.text, "TP1")):
        assert f"{tag}] CustomAllreduce is disabled because this process group spans across nodes." in text
        assert "[Gloo] Rank" in text
    assert "max_total_num_tokens=" not in r1.text and "Uvicorn" not in r1.text and "fired up" not in r1.text
    assert httpx.get(r0.url("/health")).status_code == 200
    # rank 1: dummy health server only (two-node-rank0-vs-rank1-http-curl.txt)
    h = httpx.get(r1.url("/health"))
    assert h.status_code == 200 and h.content == b""
    m = httpx.get(r1.url("/v1/models"))
    assert m.status_code == 404 and m.content == b'{"detail":"Not Found"}'
    assert httpx.get(r0.url("/v1/models")).json()["data"][0]["owned_by"] == "sglang"


def test_killing_rank1_fails_rank0_within_peer_timeout(sim):
    store, port = free_port(R0), free_port(R0)
    r0 = sim(_argv(store, 0), host=R0, port=port, knobs={"peer_timeout_s": 2})
    r1 = sim(_argv(store, 1), host=R1, port=port, knobs={"peer_timeout_s": 2})
    r0.wait_ready()
    r1.wait_for("Dummy health check server started")
    r1.kill()
    assert r0.wait_exit(timeout=6) != 0               # the default --dist-timeout would be 600 s
    line = r0.wait_for(r"Watchdog caught collective operation timeout")
    assert "WorkNCCL(SeqNum=" in line and "OpType=ALLREDUCE" in line and "Timeout(ms)=2000" in line
    # The watchdog's own account of how long the collective waited (not the test's wall clock, which also
    # counted the process exiting and its log being read on a loaded machine: 3.1 s seen at load 12).
    m = re.search(r"ran for (\d+) milliseconds before timing out\.", line)
    assert m, line
    ran_ms = int(m.group(1))
    assert 2000 <= ran_ms < 3000, ran_ms
    assert "terminate called after throwing an instance of 'c10::DistBackendError'" in r0.text


def test_killing_rank0_fails_rank1(sim):
    store, port = free_port(R0), free_port(R0)
    r0 = sim(_argv(store, 0), host=R0, port=port, knobs={"peer_timeout_s": 1.5})
    r1 = sim(_argv(store, 1), host=R1, port=port, knobs={"peer_timeout_s": 1.5})
    r0.wait_ready()
    r1.wait_for("Dummy health check server started")
    r0.kill()
    assert r1.wait_exit(timeout=5) != 0
    assert "[Rank 1] Watchdog caught collective operation timeout" in r1.text


def test_rank1_without_store_fails_bounded(sim):
    store, port = free_port(R0), free_port(R1)
    t0 = time.monotonic()
    r1 = sim(_argv(store, 1) + ["--dist-timeout", "2"], host=R1, port=port)
    rc = r1.wait_exit(timeout=10)
    assert rc != 0 and time.monotonic() - t0 < 8
    assert f"NCCL WARN socketPollConnect: connect to 127.0.0.2<{store}> returned Connection refused" in r1.text
    assert "torch.distributed.DistNetworkError: The client socket has timed out after 2s" in r1.text
    assert f"[c10d] The client socket has failed to connect to [127.0.0.2]:{store}" in r1.text


def test_hang_at_init_on_rank1_stalls_both_after_gloo(sim):
    store, port = free_port(R0), free_port(R0)
    cfg = {"peer_timeout_s": 5, "ranks": {"1": {"hang_at_init": True}}}
    r0 = sim(_argv(store, 0), host=R0, port=port, config=cfg)
    r1 = sim(_argv(store, 1), host=R1, port=port, config=cfg)
    r1.wait_for(r"\[Gloo\] Rank 1 is connected to 1 peer ranks")
    r0.wait_for(r"sglang is using nccl==")
    time.sleep(1.5)
    for p in (r0, r1):
        assert p.proc.poll() is None
        assert "spans across nodes" not in p.text and "Load weight begin" not in p.text
    assert _health(r0.url("/health")) is None


@pytest.mark.parametrize("rank", [0])
def test_store_port_in_use_fails(sim, rank):
    import socket
    store = free_port(R0)
    blocker = socket.socket()
    blocker.bind((R0, store))
    blocker.listen(1)
    try:
        r0 = sim(_argv(store, rank), host=R0)
        assert r0.wait_exit(timeout=10) != 0
        assert "EADDRINUSE" in r0.text
    finally:
        blocker.close()


# ---- N ranks: four loopback nodes (127.0.0.2 .. 127.0.0.5) through the one "switch" -------------------------------
HOSTS4 = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]


def _argv_n(n: int, store_port: int, rank: int) -> list[str]:
    return ["--tp-size", str(n), "--nnodes", str(n), "--node-rank", str(rank), "--dist-init-addr",
            f"{HOSTS4[0]}:{store_port}"]


def test_four_ranks_boot_when_the_last_joins_and_fail_when_one_dies(sim):
    store, port = free_port(R0), free_port(R0)
    knobs = {"peer_timeout_s": 2}
    r0 = sim(_argv_n(4, store, 0), host=HOSTS4[0], port=port, knobs=knobs)
    workers = [sim(_argv_n(4, store, i), host=HOSTS4[i], port=port, knobs=knobs) for i in (3, 1)]
    for w in workers:
        w.wait_for(r"Init torch distributed begin")
    time.sleep(1.0)                                   # boot_s 0.3: rank 0 would be ready by now with 3 of 4
    assert "fired up" not in r0.text and _health(r0.url("/health")) != 200
    r2 = sim(_argv_n(4, store, 2), host=HOSTS4[2], port=port, knobs=knobs)
    r0.wait_ready()
    for w, i in ((workers[1], 1), (r2, 2), (workers[0], 3)):
        w.wait_for(rf"Dummy health check server started in background thread at {re.escape(HOSTS4[i])}:{port}")
        assert f"[Gloo] Rank {i} is connected to 3 peer ranks. Expected number of connected peer ranks is : 3" in w.text
    assert "TP3] CustomAllreduce is disabled because this process group spans across nodes." in workers[0].text
    info = httpx.get(r0.url("/server_info")).json()
    assert (info["tp_size"], info["nnodes"], info["node_rank"]) == (4, 4, 0)
    # a worker's dummy health server keeps one keep-alive connection usable after its 404s
    with httpx.Client(limits=httpx.Limits(max_connections=1)) as c:
        for _ in range(3):
            assert c.post(workers[0].url("/generate"), json={"text": "x" * 2000}).status_code == 404
            assert c.get(workers[0].url("/health")).status_code == 200
    r2.kill()
    assert r0.wait_exit(timeout=8) != 0
    assert "Watchdog caught collective operation timeout" in r0.text


def test_a_reserved_store_port_fails_rank0_naming_the_knob(sim):
    """`reserved_ports` (every embedded cluster of the suite reserves the real engines' store ports): rank 0 does not
    bind its store there and fails as on EADDRINUSE, naming the knob and the fix."""
    store, port = free_port(R0), free_port(R0)
    r0 = sim(_argv(store, 0), host=R0, port=port, knobs={"peer_timeout_s": 2, "reserved_ports": [store]})
    assert r0.wait_exit(timeout=10) != 0
    line = r0.wait_for(r"DistNetworkError: The server socket has failed to listen")
    assert f"port: {store}," in line and "EADDRINUSE" in line
    assert "reserved_ports" in line and "api.dist_port of its own" in line
    assert local_port_free(R0, store)
