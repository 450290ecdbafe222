"""Replicas behind the real router on the embedded cluster: `up` of a profile with replicas: 2 (2 x TP=1 on two
loopback nodes), status per replica, a rolling update under a bounded client loop (concurrency 4 through the router
until the update is over, at most 400 requests: zero failed, every replica's steps in the journal), then down
(router and replicas stopped)."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import httpx
import pytest

from sparkctl.router import strip_colour
from testrig.embedded import (
    stop_cluster_engines,
    write_embedded_inventory,
    write_replicated_profile,
)
from testrig.testenv import need_module
from testrig.traffic import Traffic

need_module("sglang_router", "the router extra (sglang-router) is not installed")
FAST = {"boot_s": 0.3, "decode_tps": 2000, "ttft_base_s": 0.002}


def test_replicated_up_rolling_update_down(tmp_path, monkeypatch, state_dir):
    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy.replicated import ReplicatedDeployer, sub_inventory
    from sparkctl.router.replicas import render_replicas
    from sparkctl.state.replicated import Record

    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    inv_path = write_embedded_inventory(tmp_path / "inventory.yml", FAST, nodes=2)
    inv = load_inventory(inv_path)
    d = ReplicatedDeployer(inv)
    p1 = load_profile(str(write_replicated_profile(tmp_path / "rep.yml", 16)))
    try:
        planned = d.plan_lines(p1)
        assert planned[0].endswith(": start") and planned[-2].split(". ", 1)[1].startswith("router ready with 2")
        assert planned[-1].split(". ", 1)[1].startswith("hand off http")
        assert sum("back into the router" in line for line in planned) == 2
        first = d.up(p1)
        assert first.outcome == "deployed" and first.updated == [0, 1]
        assert first.parallel          # a first up: nothing in the router, both replicas booted at once
        boots = [(e.step, e.phase, e.replica) for e in Record.load(d.ledger.root).doc.journal
                 if e.step == "replica-up"]
        assert boots[:2] == [("replica-up", "intent", 0), ("replica-up", "intent", 1)] or \
            boots[:2] == [("replica-up", "intent", 1), ("replica-up", "intent", 0)], boots
        endpoint = first.endpoint
        st = d.status()
        assert st.healthy and [r.healthy and r.in_router for r in st.replicas] == [True, True]
        assert st.router is not None and st.router.healthy_workers == 2
        assert d.up(p1).outcome == "unchanged"
        assert [line.split(": ", 1)[1][:9] for line in d.plan_lines(p1)[1:3]] == ["unchanged"] * 2

        # a changed profile: a rolling update
        p2 = load_profile(str(write_replicated_profile(tmp_path / "rep.yml", 24)))
        assert sum("out of the router, drain" in line for line in d.plan_lines(p2)) == 2
        # the plan as data: both replicas move, one at a time (they are in the router); the up below runs it
        rolling = d.make_plan(p2, Record.load(d.ledger.root))
        assert [m.replica.index for m in rolling.moves if not m.unchanged] == [0, 1] and not rolling.parallel
        assert rolling.lines() == d.plan_lines(p2)
        # at least 50 requests each and on until the update is over (at most 1000 each)
        with Traffic(endpoint, clients=4, at_least=50, at_most=1000, max_new_tokens=64) as load:
            rolled = d.up(p2)
        assert load.failures == [], load.failures[:5]
        assert load.done >= 200 and load.during > 0, (load.done, load.during)       # the update ran under load
        assert rolled.outcome == "deployed" and rolled.updated == [0, 1]
        assert rolled.parallel is rolling.parallel
        journal = Record.load(d.ledger.root).doc.model_dump(mode="json")["journal"]
        ok = [(e["step"], e["replica"]) for e in journal if e["phase"] == "ok"]
        tail = ok[ok.index(("settle", None), len(ok) - 1 - ok[::-1].index(("settle", None))):]
        assert tail == [("settle", None), ("replica-detach", 0), ("replica-up", 0), ("replica-attach", 0),
                        ("replica-detach", 1), ("replica-up", 1), ("replica-attach", 1), ("router-gates", None),
                        ("hand-off", None)]
        st = d.status()
        assert st.healthy and all(r.in_router for r in st.replicas)
        info = httpx.get(st.replicas[1].url + "/server_info", timeout=5, trust_env=False).json()
        assert info["max_running_requests"] == 24

        down = d.down()
        assert down.stopped == ["router", "replica 0", "replica 1"]
        for url in [endpoint] + [r.url for r in st.replicas]:
            with pytest.raises(httpx.TransportError):
                httpx.get(url + "/health", timeout=2, trust_env=False)
    finally:
        try:
            d.down()
        finally:
            for rep in render_replicas(p1, inv, environ={}):
                stop_cluster_engines(sub_inventory(rep, inv.cluster.name))


def test_two_tp2_replicas_on_four_nodes(tmp_path, monkeypatch, state_dir):
    """2 x TP=2 on four loopback nodes: each replica boots its rank 1 before its rank 0; status names every rank of
    every replica; down stops them all."""
    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy.replicated import ReplicatedDeployer

    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    inv = load_inventory(write_embedded_inventory(tmp_path / "inventory.yml", FAST, nodes=4))
    p = tmp_path / "r2tp2.yml"
    p.write_text("description: 2 x TP=2\nextends: base\nreplicas: 2\nserver:\n  tp_size: 2\n"
                 "router:\n  policy: round_robin\n  health_check_interval_s: 1\nwarmup:\n  requests: 0\n")
    d = ReplicatedDeployer(inv)
    try:
        res = d.up(load_profile(str(p)))
        assert res.updated == [0, 1]
        st = d.status()
        assert st.healthy and st.router is not None and st.router.healthy_workers == 2
        assert [[(x.rank, x.node) for x in r.ranks] for r in st.replicas] == \
            [[(1, "spark-b"), (0, "spark-a")], [(1, "spark-d"), (0, "spark-c")]]      # boot order per group
        r = httpx.post(res.endpoint + "/v1/completions",
                       json={"model": "glm-5.3-flash", "prompt": "hi", "max_tokens": 4}, timeout=30, trust_env=False)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert d.down().stopped == ["router", "replica 0", "replica 1"]
        assert not d.status().healthy
    finally:
        d.down()


def test_a_failing_replica_is_left_serving_alone_while_the_other_updated(tmp_path, monkeypatch, state_dir):
    """The update's preflight fails on replica 1 only (the new rendezvous port is taken on its node): replica 0 runs
    the new profile, replica 1 keeps the old one and is back in the router; no request through it failed."""
    import socket

    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy.replicated import ReplicatedDeployer
    from sparkctl.errors import SparkctlError

    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    inv = load_inventory(write_embedded_inventory(tmp_path / "inventory.yml", FAST, nodes=2))
    d = ReplicatedDeployer(inv)
    p1 = load_profile(str(write_replicated_profile(tmp_path / "p1.yml", 16)))
    p2_path = write_replicated_profile(tmp_path / "p2.yml", 24)
    p2_path.write_text(p2_path.read_text() + "api:\n  dist_port: 25001\n")
    blocker = socket.socket()
    try:
        endpoint = d.up(p1).endpoint
        # replica i rendezvouses on api.dist_port + i: replica 1's new port is 25002
        blocker.bind((inv.nodes[1].fabric_address, 25002))
        blocker.listen(1)
        failures: list[str] = []

        def client() -> None:
            with httpx.Client(timeout=60, trust_env=False) as c:
                for i in range(40):
                    r = c.post(endpoint + "/generate", json={"text": f"{i}", "sampling_params": {"max_new_tokens": 32}})
                    if r.status_code != 200:
                        failures.append(r.text[:200])

        t = threading.Thread(target=client)
        t.start()
        with pytest.raises(SparkctlError) as info:
            d.up(load_profile(str(p2_path)))
        t.join(timeout=120)
        assert "replica 1:" in info.value.message and "replica(s) 0 run p2" in info.value.message
        assert "25002" in info.value.render()
        assert failures == []
        st = d.status()
        assert all(r.in_router and r.healthy for r in st.replicas), st
        mrr = [httpx.get(r.url + "/server_info", timeout=5, trust_env=False).json()["max_running_requests"]
               for r in st.replicas]
        assert mrr == [24, 16]
    finally:
        blocker.close()
        d.down()


def test_cli_up_status_down_of_a_replicated_profile(tmp_path, monkeypatch, cli, state_dir):
    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    inv = write_embedded_inventory(tmp_path / "inventory.yml", FAST, nodes=2)
    prof = write_replicated_profile(tmp_path / "rep.yml", 16)
    try:
        code, out, err = cli("up", "-p", str(prof), "-i", str(inv), "--dry-run", "--json")
        assert code == 0 and _valid("up-replicated", json.loads(out))["outcome"] == "dry-run", err[-3000:]
        code, out, err = cli("up", "-p", str(prof), "-i", str(inv), "--yes", "--json")
        assert code == 0, err[-3000:]
        up = _valid("up-replicated", json.loads(out))
        assert up["outcome"] == "deployed" and up["endpoint"].endswith(":30080")
        code, out, err = cli("status", "-i", str(inv), "--json")
        st = _valid("status-replicated", json.loads(out))
        assert code == 0 and st["replicated"] and [r["in_router"] for r in st["replicas"]] == [True, True]
        code, out, err = cli("status", "-i", str(inv))
        assert "replica 1 [spark-b]" in out and "in the router" in out
        # logs of a replicated deployment: the router's (colour codes stripped) and each replica's ranks
        assert up["next_commands"][0] == f"curl {up['endpoint']}/v1/models" and "sparkctl logs --router" in \
            up["next_commands"]
        code, out, err = cli("logs", "--router", "--tail", "0", "-i", str(inv))
        assert code == 0 and out.strip() and "\x1b[" not in out, err[-2000:]
        rec = json.loads(next(state_dir.rglob("replicated.json")).read_text())
        raw = Path(rec["router"]["log"]).read_text()           # the file as the router wrote it
        # the router is a helper: an allowlisted environment (no API key, token or unknown variable of the caller)
        environ = Path(f"/proc/{rec['router']['pid']}/environ").read_bytes().split(b"\0")
        assert not [e for e in environ if e.startswith((b"SPARKCTL_", b"HF_", b"SGLANG_", b"PYTEST_"))], environ
        assert out.splitlines() == strip_colour(raw).splitlines()
        for index in (0, 1):
            code, out, err = cli("logs", "--replica", str(index), "--rank", "0", "-i", str(inv))
            assert code == 0 and "The server is fired up and ready to roll!" in out, err[-2000:]
        code, out, err = cli("logs", "--replica", "2", "-i", str(inv))
        assert code == 2 and "--replica 2" in err and "replicas 0, 1" in err and "--replica 0" in err
        code, out, err = cli("logs", "--router", "--replica", "0", "-i", str(inv))
        assert code == 2 and "give one of them" in err
        # leaving the replicated deployment for one TP=2 group: the router and replicas stop first
        code, out, err = cli("up", "-p", "base", "-i", str(inv), "--yes", "--json")
        assert code == 0 and json.loads(out)["outcome"] == "deployed", err[-3000:]
        assert "leaving the replicated deployment" in err
        code, out, err = cli("status", "-i", str(inv), "--json")
        st = json.loads(out)
        assert code == 0 and not st.get("replicated") and st["healthy"] and len(st["ranks"]) == 2
        code, out, err = cli("logs", "--router", "-i", str(inv))
        assert code == 2 and "no replicated deployment" in err and "--rank N" in err
        with pytest.raises(httpx.TransportError):
            httpx.get(up["endpoint"] + "/health", timeout=2, trust_env=False)
        code, out, err = cli("rollback", "--to", str(prof), "-i", str(inv), "--yes", "--json")  # and back
        assert code == 0 and _valid("up-replicated", json.loads(out))["outcome"] == "deployed", err[-3000:]
        code, out, err = cli("rollback", "-i", str(inv), "--yes")     # a replicated deployment keeps no history
        assert code == 2 and "replicated deployment" in err and "--to" in err and "in use" not in err
        code, out, err = cli("down", "-i", str(inv), "--yes", "--json")
        assert code == 0 and _valid("down-replicated", json.loads(out))["stopped"] == ["router", "replica 0",
                                                                                       "replica 1"]
        code, out, err = cli("status", "-i", str(inv), "--json")
        assert code == 0 and not json.loads(out).get("replicated")
    finally:
        cli("down", "-i", str(inv), "--yes")


def _valid(kind: str, doc: dict) -> dict:
    """`doc` validates against the schema `sparkctl schema KIND` exports (the model's own JSON schema)."""
    import jsonschema

    from sparkctl.cli.outputs import json_schema
    jsonschema.validate(doc, json_schema(kind))
    return doc


def test_a_foreign_listener_on_the_router_port_is_named_and_nothing_is_left(tmp_path, monkeypatch, cli, state_dir):
    """Something else (here an HTTP server that answers like a live router) listens on the router's port: `up` of a
    replicated profile fails naming who holds the port, registers nothing in it, leaves no engine of ours running,
    and `status` does not call anything healthy."""
    from http.server import BaseHTTPRequestHandler

    from sparkctl.config.inventory import load_inventory

    seen: list[str] = []

    class Foreign(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _answer(self):
            seen.append(f"{self.command} {self.path}")
            body = b"{}"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = do_PUT = _answer

    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    inv = write_embedded_inventory(tmp_path / "inventory.yml", FAST, nodes=2)
    host = load_inventory(inv).nodes[0].api_bind
    port = 30780
    prof = tmp_path / "rep.yml"
    prof.write_text(write_replicated_profile(tmp_path / "two-replicas.yml", 16).read_text()
                    .replace("router:\n", f"router:\n  port: {port}\n  prometheus_port: 30781\n"))
    from http.server import ThreadingHTTPServer
    srv = ThreadingHTTPServer((host, port), Foreign)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        code, out, err = cli("up", "-p", str(prof), "-i", str(inv), "--yes")
        assert code != 0 and code != 70, err[-3000:]
        assert f"{host}:{port} is already held by pid {os.getpid()}" in err, err[-3000:]
        assert not [s for s in seen if "/workers" in s or "add_worker" in s], seen     # nothing registered there
        assert "boot" not in err and "router-start" not in err, err[-3000:]      # refused before anything booted
        code, out, err = cli("status", "-i", str(inv), "--json")
        assert code != 0 or not json.loads(out).get("healthy"), out
        from sparkctl.deploy.cluster import Cluster
        from sparkctl.deploy.observe import process_engines
        assert process_engines(Cluster(load_inventory(inv))) == []
    finally:
        srv.shutdown()
        srv.server_close()
        cli("down", "-i", str(inv), "--yes")


def test_a_replica_already_out_of_the_router_is_drained_before_it_is_stopped(tmp_path, monkeypatch, state_dir):
    """As after a controller killed between a replica's removal and the end of its drain: replica 1 is out of the
    router with a long request in flight; the next (changed) `up` drains it before stopping it: the request ends
    200 with every token."""
    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy.replicated import ReplicatedDeployer
    from sparkctl.router.client import RouterClient, engine_in_flight

    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    inv = load_inventory(write_embedded_inventory(tmp_path / "inventory.yml", FAST, nodes=2))
    d = ReplicatedDeployer(inv)
    p1 = load_profile(str(write_replicated_profile(tmp_path / "p1.yml", 16)))
    p2 = load_profile(str(write_replicated_profile(tmp_path / "p2.yml", 24)))
    try:
        d.up(p1)
        st = d.status()
        url = st.replicas[1].url
        result: dict = {}

        def long_request() -> None:          # ~6 s at the emulator's 2000 tok/s
            try:
                result["r"] = httpx.post(url + "/generate", json={"text": "long", "sampling_params": {
                    "max_new_tokens": 12000, "ignore_eos": True}}, timeout=120, trust_env=False)
            except httpx.HTTPError as exc:
                result["error"] = f"the in-flight request was cut: {exc!r}"

        t = threading.Thread(target=long_request)
        t.start()
        deadline = time.monotonic() + 10
        while (engine_in_flight(url) or 0) == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine_in_flight(url) == 1
        assert st.router is not None
        assert RouterClient(st.router.url).remove_worker(url)        # the killed controller's first move
        d.up(p2)
        t.join(timeout=60)
        assert "r" in result, result
        assert result["r"].status_code == 200, result["r"].text[:300]
        assert result["r"].json()["meta_info"]["completion_tokens"] == 12000, result["r"].json()["meta_info"]
        assert all(r.in_router and r.healthy for r in d.status().replicas)
    finally:
        d.down()
