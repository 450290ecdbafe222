"""The REAL router (sglang-router 0.3.2, the `router` extra) in front of two emulator workers on loopback: requests
flow through; a worker removed gets no new request (an in-flight one finishes: the bounded drain); re-added, it gets
requests again. Plus the parsers, on the captures of that router (tests/fixtures/router-0.3.2)."""
from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import httpx
import pytest

from sparkctl.router.client import RouterClient, Worker, drain, engine_in_flight
from sparkctl.router.metrics import parse_router_metrics
from sparkctl.router.process import RouterProcess
from sparkctl.router.spec import RouterSpec
from testrig.simproc import MODEL, SimProc
from testrig.testenv import free_port, local_server, need_module

need_module("sglang_router", "the router extra (sglang-router) is not installed")
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "router-0.3.2"
FAST = {"BOOT_S": "0.3", "DECODE_TPS": "3000", "PREFILL_TPS": "200000", "TTFT_BASE_S": "0.002"}


def _posts(proc: SimProc) -> int:
    """Generation requests a worker answered (its access lines)."""
    return sum(1 for line in list(proc.lines) if '"POST /' in line and " 200" in line)


def _counts(workers: list[SimProc], before: list[int], total: int) -> list[int]:
    """Each worker's new answers, once their access lines (read by a thread) add up to ``total`` (bounded)."""
    end = time.monotonic() + 10
    while True:
        got = [_posts(w) - b for w, b in zip(workers, before)]
        if sum(got) >= total or time.monotonic() > end:
            return got
        time.sleep(0.05)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    net = f"127.{random.randint(1, 250)}.{random.randint(1, 250)}"
    workers = []
    for i in (2, 3):
        host = f"{net}.{i}"
        port = free_port(host)
        env = {f"SPARKCTL_SIM_{k}": v for k, v in FAST.items()}
        workers.append(SimProc(["--model-path", MODEL, "--host", host, "--port", str(port), "--enable-metrics",
                                "--served-model-name", "glm"], env, host, port))
    router = None
    try:
        for w in workers:
            w.wait_ready()
        host = f"{net}.1"
        spec = RouterSpec(host=host, port=free_port(host), prometheus_port=free_port(host),
                          worker_urls=tuple(w.url("") for w in workers), health_check_interval_s=1)
        router = RouterProcess.start(spec, tmp_path_factory.mktemp("router") / "router.log")
        client = RouterClient(spec.url, metrics_url=spec.metrics_url)
        for w in workers:
            def listed(w: SimProc = w) -> object:
                return (x := client.find(w.url(""))) and x.healthy
            client._until(f"{w.url('')} listed", listed, 30)
        yield router, client, workers
    finally:
        if router is not None:
            router.stop(timeout_s=10)
        for w in workers:
            w.close()


def _generate(url: str, n: int = 8) -> httpx.Response:
    return httpx.post(url + "/generate", json={"text": "Hello there", "sampling_params": {"max_new_tokens": n}},
                      timeout=30, trust_env=False)


def test_requests_flow_through_to_both_workers(pool):
    router, client, workers = pool
    before = [_posts(w) for w in workers]
    with httpx.Client(timeout=30, trust_env=False) as c:
        for i in range(4):
            assert c.post(router.spec.url + "/generate",
                          json={"text": f"q{i}", "sampling_params": {"max_new_tokens": 4}}).status_code == 200
            chat = c.post(router.spec.url + "/v1/chat/completions",
                          json={"model": "glm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 4
            comp = c.post(router.spec.url + "/v1/completions", json={"model": "glm", "prompt": "a", "max_tokens": 3})
            assert comp.status_code == 200 and comp.json()["object"] == "text_completion"
    got = _counts(workers, before, 12)
    assert sum(got) == 12 and all(g > 0 for g in got), got       # round robin: both served
    m = client.metrics()
    assert all(m.workers[w.url("")].healthy for w in workers)
    assert all(m.requests_to(w.url("")) > 0 for w in workers)
    h = client.health()
    assert h.live and h.ready and (h.healthy_workers, h.total_workers) == (2, 2)


def test_removed_worker_gets_nothing_and_readded_gets_requests(pool):
    router, client, (a, b) = pool
    assert client.remove_worker(b.url("")) is True
    assert client.find(b.url("")) is None and client.remove_worker(b.url("")) is False
    before = [_posts(a), _posts(b)]
    for _ in range(10):
        assert _generate(router.spec.url, 2).status_code == 200
    assert _counts([a, b], before, 10) == [10, 0]
    assert client.health().total_workers == 1
    w = client.add_worker(b.url(""))
    assert w.healthy and w.url == b.url("")
    before = [_posts(a), _posts(b)]
    for _ in range(10):
        assert _generate(router.spec.url, 2).status_code == 200
    got = _counts([a, b], before, 10)
    assert sum(got) == 10 and got[1] > 0, got
    assert client.health().total_workers == 2


def test_in_flight_request_finishes_after_removal_and_drain_waits_for_it(pool):
    """A long request through the router; the worker serving it is removed from the router mid-request: the request
    still completes (200, all its tokens), and drain() returns only once that worker's in-flight count is 0."""
    router, client, workers = pool
    result: dict = {}
    body = {"text": "long one", "sampling_params": {"max_new_tokens": 2000}}     # ~0.7 s at 3000 tok/s

    def long_request() -> None:
        result["r"] = httpx.post(router.spec.url + "/generate", json=body, timeout=60, trust_env=False)

    t = threading.Thread(target=long_request)
    t.start()
    busy = client._until("a worker busy", lambda: next(
        (w for w in workers if (engine_in_flight(w.url("")) or 0) > 0), None), 10)
    assert client.remove_worker(busy.url(""))
    waited = drain(lambda: engine_in_flight(busy.url("")), timeout_s=30, what=busy.url(""))
    t.join(timeout=30)
    assert result["r"].status_code == 200 and result["r"].json()["meta_info"]["completion_tokens"] == 2000
    assert waited > 0 and engine_in_flight(busy.url("")) == 0
    client.add_worker(busy.url(""))


def test_drain_is_bounded():
    from sparkctl.router import RouterError
    with pytest.raises(RouterError, match=r"3 request\(s\) still in flight after 0.3s"):
        drain(lambda: 3, timeout_s=0.3, poll_s=0.05, what="w")
    with pytest.raises(RouterError, match="unknown request"):
        drain(lambda: None, timeout_s=0.2, poll_s=0.05, what="w")


# ---- the parsers on the real router's captures ---------------------------------------------------------------------
def test_workers_list_capture():
    two = [Worker.from_json(w) for w in json.loads((FIX / "workers-list-two.json").read_text())["workers"]]
    assert sorted(w.url for w in two) == ["http://127.0.0.21:31001", "http://127.0.0.22:31002"]
    assert all(w.healthy and len(w.id) == 36 for w in two)
    one = json.loads((FIX / "workers-list-one.json").read_text())
    assert one["total"] == 1 and one["workers"][0]["url"] == "http://127.0.0.21:31001"


def test_metrics_capture():
    m = parse_router_metrics((FIX / "metrics.txt").read_text())
    assert set(m.workers) == {"http://127.0.0.21:31001", "http://127.0.0.22:31002"}
    assert all(w.healthy for w in m.workers.values())
    assert m.requests_to("http://127.0.0.21:31001") == 2 and m.requests_to("http://127.0.0.22:31002/") == 1
    assert m.http_requests[("POST", "/workers")] >= 1 and m.responses["200"] > 0
    assert m.pool_size == 2 and m.health_checks["success"] > 0


def test_spec_refuses_what_0_3_2_does_not_have():
    from sparkctl.errors import ConfigError
    with pytest.raises(ConfigError, match="least_load"):
        RouterSpec("127.0.0.1", 30000, policy="least_load")
    with pytest.raises(ConfigError, match="http://"):
        RouterSpec("127.0.0.1", 30000, worker_urls=("10.0.0.1:30000",))
    argv = RouterSpec("::1", 30000, worker_urls=("http://[::1]:1",)).process_argv("python3")
    assert argv[:3] == ["python3", "-m", "sglang_router.launch_router"] and all(isinstance(x, str) for x in argv)


@pytest.mark.parametrize("generate", ["close", "hang", "500", "garbage"])
def test_router_gates_refuse_a_hostile_router_with_a_router_error(generate):
    """A router that is ready and healthy by its captured /readiness and /metrics but whose /generate drops the
    connection, hangs past the bound, answers 500 or garbage: the gate is a RouterError within its bound (never a
    raw transport exception, never a hang)."""
    import socket
    import time
    from http.server import BaseHTTPRequestHandler
    from types import SimpleNamespace

    from sparkctl.deploy.replica_steps import router_gates
    from sparkctl.router import RouterError
    from sparkctl.router.client import RouterClient
    from sparkctl.router.spec import RouterSpec

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "router-0.3.2"
    readiness = (fixtures / "readiness-two.http").read_text().split("\n\n", 1)[1].strip().encode()
    metrics = (fixtures / "metrics.txt").read_bytes()

    class Hostile(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/readiness":
                self._send(200, readiness, "application/json")
            else:
                self._send(200, {"/liveness": b"OK", "/metrics": metrics}.get(self.path, b""))

        def do_POST(self):
            self.rfile.read(int(self.headers.get("content-length", 0)))
            if generate == "close":
                self.connection.shutdown(socket.SHUT_RDWR)
            elif generate == "hang":
                time.sleep(5)
            elif generate == "500":
                self._send(500, b"internal")
            else:
                self.wfile.write(b"\x00\xffnot http at all\r\n\r\n")

    with local_server(Hostile) as port:
        spec = RouterSpec("127.0.0.1", port, prometheus_port=port + 1 if port < 65535 else port - 1)
        client = RouterClient(spec.url, metrics_url=f"http://127.0.0.1:{port}/metrics")
        reps = [SimpleNamespace(url="http://127.0.0.22:31002"), SimpleNamespace(url="http://127.0.0.21:31001")]
        t0 = time.monotonic()
        with pytest.raises(RouterError) as exc:
            # stand-ins for Replica: router_gates reads only their url
            router_gates(client, spec, reps, timeout_s=1.0)  # type: ignore[arg-type]
        assert time.monotonic() - t0 < 4.5
        assert "generation through it" in exc.value.message, exc.value.render()


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b'{"status": "ready", "healthy_workers": "2"}',
                                  b'{"workers": "x"}', b"\xff\xfe"])
def test_router_client_reads_a_hostile_json_body_as_not_ready_or_a_router_error(body):
    """/readiness and /workers answering JSON-typed garbage: health is "not ready" and list_workers a RouterError
    (never a ValueError or AttributeError: exit 70)."""
    from http.server import BaseHTTPRequestHandler

    from sparkctl.router import RouterError
    from sparkctl.router.client import RouterClient

    class Hostile(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with local_server(Hostile) as port:
        client = RouterClient(f"http://127.0.0.1:{port}")
        h = client.health()
        assert h.healthy_workers == 0      # (ready by its status word alone: the gates want every worker healthy)
        with pytest.raises(RouterError):
            client.list_workers()


def test_a_dead_engine_is_drained_at_once_and_a_frozen_one_fails_quickly():
    """Drain by what the engine says: nothing listens (the engine is gone) -> nothing in flight, no wait; a listener
    that never answers (a SIGSTOPped or hung engine) -> a clear failure after two read timeouts, not the whole bound."""
    import socket
    import time as _time

    from sparkctl.router import RouterError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"      # closed again: connections to it are refused
    t0 = _time.monotonic()
    assert drain(lambda: engine_in_flight(dead), timeout_s=30, what="dead") < 1.0
    assert _time.monotonic() - t0 < 2.0
    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen(8)                    # the kernel accepts connections; nobody ever reads or answers
    try:
        url = f"http://127.0.0.1:{frozen.getsockname()[1]}"
        t0 = _time.monotonic()
        with pytest.raises(RouterError, match=r"frozen: .*did not answer within 2s 2 times in a row"):
            drain(lambda: engine_in_flight(url), timeout_s=60, what="frozen")
        assert _time.monotonic() - t0 < 10.0
    finally:
        frozen.close()
