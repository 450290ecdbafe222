"""`sparkctl bench` of a replicated deployment, through the real router (sglang-router 0.3.2) on the embedded cluster.

One module-scoped cluster of two loopback nodes: first a single TP=2 pair of a hybrid model (the seed's mamba ratio:
the state cache caps it to one running request) is benched, so the history holds a single-group card; then the same
model as two TP=1 replicas behind the router, which the tests bench through the router: four levels, the split per
replica summing to each level's requests, the single pair's figures from that card, the JSON valid against
`sparkctl schema bench`. A hostile router (its Prometheus port a local server that hangs, trickles, announces 2 GB,
answers HTML or counters that are not counts) costs at most one bound and leaves a card saying the split is
unavailable, with the aggregate figures intact.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from testrig.embedded import write_embedded_inventory
from testrig.testenv import need_module

need_module("sglang_router", "the router extra (sglang-router) is not installed")

FAST = {"boot_s": 0.3, "decode_tps": 400, "ttft_base_s": 0.002}
BENCH = ["bench", "--gates", "concurrency", "--max-tokens", "40", "--warmup", "0"]
HYBRID = "server:\n  tp_size: {tp}\n  mamba_full_memory_ratio: 2\n  enable_metrics: true\nwarmup:\n  requests: 0\n"
REPLICATED = ("description: two TP=1 replicas, each capped to 1 running request by the mamba state cache\n"
              "extends: base\nreplicas: 2\n" + HYBRID.format(tp=1) +
              "router:\n  policy: round_robin\n  health_check_interval_s: 1\n")
SINGLE = "description: one TP=2 pair capped to 1 running request\nextends: base\n" + HYBRID.format(tp=2)


def _run(*args: str) -> tuple[int, str, str]:
    """The CLI in-process, its output captured (the module fixture has no capsys)."""
    import contextlib
    import io

    from sparkctl.cli.main import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("bench-router")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKCTL_STATE_DIR", str(tmp / "state"))
        for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")] + ["SPARKCTL_API_KEY"]:
            mp.delenv(key, raising=False)
        inv = write_embedded_inventory(tmp / "inventory.yml", FAST, nodes=2)
        mp.setenv("SPARKCTL_INVENTORY", str(inv))
        (tmp / "single.yml").write_text(SINGLE)
        (tmp / "rep.yml").write_text(REPLICATED)
        try:
            code, _, err = _run("up", "-p", str(tmp / "single.yml"), "--yes")
            assert code == 0, err[-3000:]
            code, out, err = _run(*BENCH, "--concurrency", "1,2,4,8", "--json")
            assert code == 0, err[-3000:]
            single = json.loads(out)
            code, _, err = _run("up", "-p", str(tmp / "rep.yml"), "--yes")
            assert code == 0 and "leaving" not in err, err[-3000:]
            yield {"tmp": tmp, "inventory": inv, "single": single}
        finally:
            _run("down", "--yes")


def _schema_valid(doc: dict[str, Any]) -> None:
    import jsonschema

    from sparkctl.cli.outputs import json_schema
    jsonschema.validate(doc, json_schema("bench"))


def test_bench_goes_through_the_router_four_levels_split_per_replica_beside_the_single_pair(deployed):
    code, out, err = _run(*BENCH, "--json")
    assert code == 0, err[-3000:]
    doc = json.loads(out)
    _schema_valid(doc)
    assert doc["mode"] == "replicated" and doc["emulated"] and doc["status"] == "successful"
    r = doc["router"]
    assert r["emulated"] and [x["max_running_requests"] for x in r["replicas"]] == [1, 1]   # the mamba cap, each
    assert [lv["concurrency"] for lv in r["levels"]] == [1, 2, 4, 8]
    levels = {lv["concurrency"]: lv for lv in doc["arms"][0]["results"]["concurrency"]["levels"]}
    for lv in r["levels"]:
        assert lv["split"] == "measured" and lv["split_note"] is None, lv
        assert sum(s["requests"] for s in lv["replicas"]) == lv["requests_sent"] == lv["concurrency"]
        assert sum(s["tokens"] for s in lv["replicas"]) == levels[lv["concurrency"]]["total_completion_tokens"]
        assert lv["aggregate_tok_s"] == levels[lv["concurrency"]]["aggregate_tok_s"]
        if lv["concurrency"] >= 2:       # round robin: each replica its half
            assert [s["requests"] for s in lv["replicas"]] == [lv["concurrency"] / 2] * 2
    # the single pair's figures: the card benched on the single group, nothing else
    single = deployed["single"]
    sp = r["single_pair"]
    assert sp["run_id"] == single["run_id"] and sp["emulated"] and r["single_pair_note"].startswith("measured")
    for lv in r["levels"]:
        want = next(x["aggregate_tok_s"] for x in single["arms"][0]["results"]["concurrency"]["levels"]
                    if x["concurrency"] == lv["concurrency"])
        assert lv["single_pair_tok_s"] == want
    card = Path(doc["files"]["markdown"]).read_text()
    assert "## Through the router (EMULATED)" in card and "single pair tok/s (emulated)" in card
    assert re.search(r"^\| c8 \| [\d.]+ \| 4 \(50%\) \| 4 \(50%\) \|", card, re.M), card
    assert "**EMULATED**" in card


def test_bench_profile_of_replicas_deploys_through_the_replicated_up_and_concurrency_overrides(deployed):
    code, out, err = _run(*BENCH, "-p", str(deployed["tmp"] / "rep.yml"), "--concurrency", "2", "--json")
    assert code == 0, err[-3000:]
    assert "(2 replicas behind the router)" in err and "rep: unchanged" in err
    doc = json.loads(out)
    assert doc["mode"] == "replicated" and [lv["concurrency"] for lv in doc["router"]["levels"]] == [2]
    ser = doc["arms"][0]["results"]["concurrency"]["levels"][0]["serialization"]
    assert not ser["serialized"], ser        # two replicas capped to 1 each run two requests at once


def test_single_pair_is_the_latest_single_group_card_of_the_same_model(deployed, tmp_path):
    """The lookup over the history, fed with the single pair's real card: the same model is found, another model or
    a replicated card is not, and a newer card of the model wins."""
    from sparkctl.bench.router_card import single_pair
    from sparkctl.state.ledger import Ledger
    card = deployed["single"]
    model = card["arms"][0]["config"]["profile_data"]["model"]["path"]
    ledger = Ledger(tmp_path / "cluster")
    assert single_pair(ledger, model, "glm-5.3-flash")[0] is None
    other = json.loads(json.dumps(card))
    other["arms"][0]["config"]["profile_data"]["model"]["path"] = "/models/Other"
    other["run_id"], other["started"] = "29990101T000000Z-bench-other-0001", "2999-01-01T00:00:00Z"
    routed = json.loads(json.dumps(card))
    routed.update(run_id="29990101T000000Z-bench-rep-0002", started="2999-01-01T00:00:01Z", mode="replicated",
                  router={"url": "http://r"})
    for c in (card, other, routed):
        (ledger.run_dir(c["run_id"]) / "report.json").write_text(json.dumps(c))
    found, note = single_pair(ledger, model, "glm-5.3-flash")
    assert found is not None and found.run_id == card["run_id"] and note.startswith("measured") and found.emulated
    assert found.aggregate_tok_s["c2"] == card["arms"][0]["results"]["concurrency"]["levels"][1]["aggregate_tok_s"]
    newer = json.loads(json.dumps(card))
    newer.update(run_id="29990101T000000Z-bench-single-0003", started="2999-01-01T00:00:02Z")
    (ledger.run_dir(newer["run_id"]) / "report.json").write_text(json.dumps(newer))
    newest, _ = single_pair(ledger, model, "glm-5.3-flash")
    assert newest is not None and newest.run_id == newer["run_id"]
    none, why = single_pair(ledger, "/models/Nothing", None)
    assert none is None and why.startswith("none measured: no single-group card of /models/Nothing")


def test_compare_and_log_are_refused_on_a_replicated_deployment(deployed, tmp_path):
    code, _, err = _run(*BENCH, "--compare", "dflash-off")
    assert code == 2 and "measured alone, through its router" in err, err
    log = tmp_path / "rank0.log"
    log.write_text("")
    code, _, err = _run(*BENCH, "--log", str(log))
    assert code == 2 and "read through their own runtimes" in err, err


# --------------------------------------------------------------------------- a hostile router's metrics

class HostileMetrics(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    behaviour = "silent"
    workers: list[str] = []
    stop = threading.Event()
    scrapes = 0

    def log_message(self, *a: Any) -> None:
        pass

    def _send(self, body: bytes, ctype: str = "text/plain; version=0.0.4") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _series(self, value: str) -> bytes:
        return "".join(f'smg_worker_health{{worker="{w}"}} 1\nsmg_worker_cb_outcomes_total{{worker="{w}",'
                       f'outcome="success"}} {value}\n' for w in self.workers).encode()

    def do_GET(self) -> None:
        type(self).scrapes += 1
        try:
            self._answer(self.behaviour)
        except OSError:                   # the bench hung up at its bound: what it should do
            self.close_connection = True

    def _answer(self, b: str) -> None:
        if b == "silent":
            self.stop.wait(60)
            self.close_connection = True
        elif b == "trickle":
            for ch in b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n":
                if self.stop.wait(1.0):
                    break
                self.wfile.write(bytes([ch]))
                self.wfile.flush()
            self.close_connection = True
        elif b == "huge":
            self.send_response(200)
            self.send_header("Content-Length", str(2 * 1024 ** 3))
            self.end_headers()
            self.wfile.write(b"smg_worker_health 1\n" * 64)
            self.stop.wait(60)
            self.close_connection = True
        elif b == "html":
            self._send(b"<html><body>502 Bad Gateway (nginx)</body></html>", "text/html")
        elif b == "other_workers":
            self._send(b'smg_worker_cb_outcomes_total{worker="http://10.9.9.9:30000",outcome="success"} 7\n')
        elif b == "not_counts":
            self._send(self._series("NaN"))
        elif b == "backwards":
            self._send(self._series(str(1000 - type(self).scrapes)))


# behaviour -> (what the card must say, the bound (s) the run may spend on it)
HOSTILE = {"silent": (r"sent nothing for 2 s \(read timeout\)", 2.0),
           "trickle": (r"no complete answer within the request deadline of 3 s", 3.0),
           "huge": (r"announced a 2,147,483,648-byte body, over the 4,194,304-byte cap", 1.0),
           "html": (r"name none of the replicas as a worker \(smg_worker_\* series for: none\)", 1.0),
           "other_workers": (r"name none of the replicas as a worker .*10\.9\.9\.9", 1.0),
           "not_counts": (r"a request counter that is not a count", 1.0),
           "backwards": (r"counters went backwards during the level", 1.0)}
READ_SLACK_S = 5.0        # ten local metrics reads on a loaded 2-core machine, on top of the one bound
SLACK_S = 60.0            # the whole bench (four levels, the CLI's start) on a loaded machine: never a hang


@pytest.fixture()
def hostile_cluster(deployed, tmp_path) -> Iterator[Any]:
    """A second cluster name whose replicated record is the deployment's, its router metrics URL a hostile server."""
    import yaml

    from sparkctl.state.ledger import Ledger
    servers: list[ThreadingHTTPServer] = []
    HostileMetrics.stop = threading.Event()

    def make(behaviour: str) -> tuple[Path, type]:     # the inventory, the handler class (a HostileMetrics)
        inv_doc = yaml.safe_load(Path(deployed["inventory"]).read_text())
        src = Ledger.for_cluster(inv_doc["all"]["vars"]["sparkctl_cluster"]).root / "replicated.json"
        record = json.loads(src.read_text())
        handler = type("H", (HostileMetrics,), {"behaviour": behaviour, "scrapes": 0,
                                                "workers": [r["url"] for r in record["replicas"]]})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(httpd)
        record["router"]["metrics_url"] = f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
        inv_doc["all"]["vars"]["sparkctl_cluster"] += "h"
        inv = tmp_path / "hostile.yml"
        inv.write_text(yaml.safe_dump(inv_doc))
        root = Ledger.for_cluster(inv_doc["all"]["vars"]["sparkctl_cluster"]).root
        root.mkdir(parents=True, exist_ok=True)
        (root / "replicated.json").write_text(json.dumps(record))
        return inv, handler
    try:
        yield make
    finally:
        HostileMetrics.stop.set()
        for s in servers:
            s.shutdown()
            s.server_close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("behaviour", list(HOSTILE))
def test_hostile_router_metrics_cost_one_bound_and_the_card_says_the_split_is_unavailable(behaviour,
                                                                                           hostile_cluster):
    inv, handler = hostile_cluster(behaviour)
    pattern, bound = HOSTILE[behaviour]
    t0 = time.monotonic()
    code, out, err = _run(*BENCH, "-i", str(inv), "--read-timeout", "2", "--idle-timeout", "2",
                          "--request-deadline", "3", "--json")
    elapsed = time.monotonic() - t0
    assert code == 0, err[-3000:]
    doc = json.loads(out)
    _schema_valid(doc)
    r = doc["router"]
    # one bound, not one per level: the router's source failed once and was not read again; the replicas' token
    # reads (8 of them, fast) are the rest
    assert r["metrics_read_s"] < bound + READ_SLACK_S, (r["metrics_read_s"], elapsed)
    assert elapsed < bound + SLACK_S, elapsed
    assert re.search(pattern, r["metrics_error"]), r["metrics_error"]
    assert [lv["split"] for lv in r["levels"]] == ["unavailable"] * 4
    assert all(lv["aggregate_tok_s"] for lv in r["levels"])              # the measurement itself stands
    assert all(s["requests"] is None for lv in r["levels"] for s in lv["replicas"])
    assert r["single_pair"] is None and r["single_pair_note"].startswith("none measured")   # this ledger has none
    card = Path(doc["files"]["markdown"]).read_text()
    assert "**Per-replica split unavailable**" in card and "| none measured |" in card
    assert handler.scrapes == (2 if behaviour == "backwards" else 1)     # a failed source is not read again
    assert "Traceback" not in err
