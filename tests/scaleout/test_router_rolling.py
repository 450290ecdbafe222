"""The rolling-update mechanism at the router, with the real router and emulator replicas: a bounded client loop
(200 requests at concurrency 4) through the router while each replica in turn is detached (removed, drained),
replaced by a new engine process on the same address (killed and restarted: the redeploy), gated (its /health and a
generation answer), and attached again. Zero failed requests; every replica served requests before and after."""
from __future__ import annotations

import random
import time

import httpx

from sparkctl.router.client import RouterClient, attach, detach
from sparkctl.router.process import RouterProcess
from sparkctl.router.spec import RouterSpec
from testrig.simproc import MODEL, SimProc
from testrig.testenv import free_port, need_module
from testrig.traffic import Traffic

need_module("sglang_router", "the router extra (sglang-router) is not installed")
ENV = {"SPARKCTL_SIM_BOOT_S": "0.3", "SPARKCTL_SIM_DECODE_TPS": "2000", "SPARKCTL_SIM_TTFT_BASE_S": "0.002"}


def _engine(host: str, port: int) -> SimProc:
    return SimProc(["--model-path", MODEL, "--host", host, "--port", str(port), "--enable-metrics"], dict(ENV),
                   host, port)


def _gate(url: str) -> None:
    """The replica's own gates before it goes back: /health 200 and one generation."""
    assert httpx.get(url + "/health", timeout=5, trust_env=False).status_code == 200
    r = httpx.post(url + "/generate", json={"text": "gate", "sampling_params": {"max_new_tokens": 4}}, timeout=10,
                   trust_env=False)
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4


def test_rolling_replacement_through_the_router_fails_no_request(tmp_path):
    net = f"127.{random.randint(1, 250)}.{random.randint(1, 250)}"
    addrs = [(f"{net}.{i}", free_port(f"{net}.{i}")) for i in (2, 3)]
    engines = {a: _engine(*a) for a in addrs}
    router = None
    try:
        for e in engines.values():
            e.wait_ready()
        host = f"{net}.1"
        spec = RouterSpec(host, free_port(host), tuple(e.url("") for e in engines.values()),
                          prometheus_port=free_port(host), health_check_interval_s=1)
        router = RouterProcess.start(spec, tmp_path / "router.log")
        rc = RouterClient(spec.url, metrics_url=spec.metrics_url)
        for e in engines.values():
            def listed(e: SimProc = e) -> object:
                return (w := rc.find(e.url(""))) and w.healthy
            rc._until("listed", listed, 30)

        steps: list[tuple[str, str, float]] = []
        at: list[int] = []                              # requests done when each step ended
        # at least 4 x 50 = 200 requests, on until both are replaced; bounded
        with Traffic(spec.url, clients=4, at_least=50, at_most=1000, max_new_tokens=160, exact_tokens=True,
                     join_s=120) as load:
            for addr in addrs:
                url = engines[addr].url("")
                while load.done < 16 * (1 + len(steps) // 3):   # let traffic flow between replicas
                    time.sleep(0.02)
                steps.append((url, "detach", detach(rc, url, drain_s=30)))
                engines[addr].close()                          # the redeploy: old engine gone ...
                engines[addr] = _engine(*addr)                 # ... a new one on the same address
                engines[addr].wait_ready()
                _gate(url)
                steps.append((url, "gate", 0.0))
                attach(rc, url)
                steps.append((url, "attach", 0.0))
                at.append(load.done)
        assert load.failures == [], load.failures[:5]
        assert load.done >= 200
        assert at[-1] < load.done, at                     # both replacements happened under load
        assert [(u, s) for u, s, _ in steps] == [(engines[a].url(""), s) for a in addrs
                                                 for s in ("detach", "gate", "attach")]
        m = rc.metrics()
        assert all(m.workers[e.url("")].healthy for e in engines.values())
    finally:
        if router is not None:
            router.stop(timeout_s=10)
        for e in engines.values():
            e.close()
