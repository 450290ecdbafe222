"""What the watcher says to the outside: Prometheus metrics (scraped and parsed with prometheus_client's own parser)
and the webhook (received by a local HTTP server), with the API key and the HF token searched for and absent."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler

import httpx

from sparkctl.state.watchfile import load_watch
from testrig.handles import pid_of
from testrig.testenv import local_server, need_module
from testrig.watchrig import ledger_of, up, wait_until, watch_state

parser = need_module("prometheus_client.parser", "the watcher's metrics (the `watch` extra)")

API_KEY = "sk-watch-3c1f9e0d7a5b"
HF_TOKEN = "hf_WATCHtoken9876543210"
URL_PASSWORD = "hookpw-77a1"
URL_TOKEN = "qtoken-55b2"


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url, timeout=5).text
    out = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples: dict, name: str, **labels: str) -> float | None:
    for (n, lbl), v in samples.items():
        if n == name and all(dict(lbl).get(k) == val for k, val in labels.items()):
            return v
    return None


def test_metrics_endpoint_scraped_and_parsed(cli, local_cluster, watcher):
    dep = up(cli)["deployment"]
    root = ledger_of(local_cluster).root
    run = watcher("--metrics-port", "0")
    url = wait_until(lambda: (st := load_watch(root)) and st.metrics, "the metrics address")
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    # the node gauges are set after the health gauges in a check (a command per node; swap last): wait for both
    samples = wait_until(lambda: (s := _scrape(url)) and _value(s, "sparkctl_deployment_healthy") is not None
                         and _value(s, "sparkctl_node_swap_free_bytes", node="spark-b") is not None and s,
                         "a first check in the metrics")
    assert _value(samples, "sparkctl_up") == 1
    assert _value(samples, "sparkctl_deployment_healthy", desired=dep, profile="d5") == 1
    assert _value(samples, "sparkctl_rank_alive", rank="1", node="spark-b") == 1
    assert {_value(samples, "sparkctl_gate_passed", gate=g) for g in
            ("health", "models", "settings", "capacity", "workers", "smoke")} == {1}
    with open("/proc/meminfo") as f:
        meminfo = {k: int(v) * 1024 for k, v in re.findall(r"^(\w+):\s+(\d+) kB$", f.read(), re.M)}
    # this machine's /proc/meminfo (the embedded nodes are this host), read by the watcher at its last check: the
    # same figures give or take what the other processes on this shared machine did since (a tenth of its memory)
    slack = max(2 ** 30, meminfo["MemTotal"] // 10)
    for node in ("spark-a", "spark-b"):
        avail = _value(samples, "sparkctl_node_memory_available_bytes", node=node)
        assert avail is not None and 0 < avail <= meminfo["MemTotal"] and abs(avail - meminfo["MemAvailable"]) < slack
        cached = _value(samples, "sparkctl_node_memory_cached_bytes", node=node)
        assert cached is not None and 0 < cached <= meminfo["MemTotal"]
        swap = _value(samples, "sparkctl_node_swap_free_bytes", node=node)
        assert swap is not None and 0 <= swap <= meminfo["SwapTotal"] and abs(swap - meminfo["SwapFree"]) < slack
    assert not [k for k in samples if k[0].startswith("sparkctl_gpu_")]      # no GPU here: no value made up
    os.kill(pid_of(ledger_of(local_cluster).load(dep), 1), signal.SIGKILL)
    detected = run.wait_for(rf"detected: {re.escape(dep)} ")
    m = re.search(r"is not serving \(([a-z-]+)\)", detected)
    assert m, detected
    reason = m.group(1)
    assert reason in ("rank-dead", "engines-gone")     # rank 0 follows its peer within the emulator's peer timeout
    run.wait_for(rf"restarted {re.escape(dep)} as ", timeout=90)

    def recovered() -> dict | None:
        s = _scrape(url)
        return s if _value(s, "sparkctl_watch_time_to_recover_seconds_count") == 1 else None
    samples = wait_until(recovered, "the recovery in the metrics")
    assert _value(samples, "sparkctl_watch_restarts_total", reason=reason, outcome="ok") == 1
    recover_s = _value(samples, "sparkctl_watch_time_to_recover_seconds_sum")
    assert recover_s is not None and 0 < recover_s < 60
    assert _value(samples, "sparkctl_deployment_healthy", profile="d5") == 1
    assert _value(samples, "sparkctl_watch_gave_up") == 0


def test_metrics_without_prometheus_client_name_the_extra():
    code = ("import sys; sys.modules['prometheus_client'] = None\n"
            "from sparkctl.cli.main import main\n"
            "sys.exit(main(['watch', '--metrics-port', '0']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "needs the optional `watch` extra (prometheus_client), which is not installed" in done.stderr
    assert "pip install 'sparkctl[watch]'" in done.stderr


def test_webhook_gets_restarts_and_carries_no_secret(cli, local_cluster, watcher, monkeypatch):
    monkeypatch.setenv("SPARKCTL_API_KEY", API_KEY)        # d5's api_key_env: the engine enforces it
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    got: list[tuple[dict, str]] = []
    arrived = threading.Event()

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["content-length"]))
            got.append((json.loads(body), body.decode() + "\n" + str(self.headers)))
            self.send_response(204)
            self.end_headers()
            arrived.set()

        def log_message(self, *args: object) -> None:
            pass

    dep = up(cli)["deployment"]
    with local_server(Hook) as port:
        hook = f"http://watch:{URL_PASSWORD}@127.0.0.1:{port}/hook?token={URL_TOKEN}"
        monkeypatch.setenv("WATCH_HOOK_URL", hook)        # a URL with credentials: never in an argv
        run = watcher("--notify-env", "WATCH_HOOK_URL")
        os.kill(pid_of(ledger_of(local_cluster).load(dep), 1), signal.SIGKILL)
        run.wait_for(rf"restarted {re.escape(dep)} as ", timeout=90)
        assert arrived.wait(30), run.stderr
    event, raw = got[0]
    assert event["event"] == "restart" and event["outcome"] == "ok" and event["reason"] in ("rank-dead", "engines-gone")
    assert "rank 1 not running" in event["detail"]
    assert event["cluster"] == ledger_of(local_cluster).root.name and event["restarts"] == 1
    assert event["deployment"] != dep and event["seconds"] > 0
    root = ledger_of(local_cluster).root
    texts = [raw, run.stderr, cli("status", "--json")[1], *(p.read_text(errors="replace")
                                                              for p in root.rglob("*") if p.is_file())]
    for text in texts:
        assert API_KEY not in text and HF_TOKEN not in text
    for text in texts[1:]:                      # the hook's address is never logged with its credentials or query
        assert URL_PASSWORD not in text and URL_TOKEN not in text
    assert "watch.log" in {p.name for p in root.iterdir()}


def test_webhook_that_hangs_is_bounded_and_never_stops_the_watcher(cli, local_cluster, watcher):
    release = threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            release.wait(30)

        def log_message(self, *args: object) -> None:
            pass

    dep = up(cli)["deployment"]
    with local_server(Slow) as port:
        run = watcher("--notify", f"http://127.0.0.1:{port}/hook")
        os.kill(pid_of(ledger_of(local_cluster).load(dep), 1), signal.SIGKILL)
        run.wait_for(rf"notify: http://127.0.0.1:{port}/hook failed \(no complete answer within the 5 s deadline\); "
                     "the watcher goes on", timeout=90)
        release.set()
    assert watch_state(ledger_of(local_cluster).root).healthy


def test_grafana_dashboard_names_only_metrics_that_exist():
    """Every `sglang:` series the shipped dashboard queries is one the real SGLang 0.5.23 exported (its captured
    /metrics), every `sparkctl_` series one the watcher exports."""
    from pathlib import Path

    from sparkctl.resources import shipped
    from sparkctl.watch.metrics import WatchMetrics

    repo = Path(__file__).resolve().parents[2]
    dash = json.loads(shipped("grafana", "sparkctl.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"\b(sglang:[a-z_]+|sparkctl_[a-z_]+)", e)}
    real = set(re.findall(r"^(sglang:[a-z_]+)", (repo / "tests/fixtures/real-engine/0.5.23/tp2/metrics.http")
                          .read_text(), re.M))
    metrics = WatchMetrics(0, cluster="c")
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    try:
        ours = {fam.name + sfx for fam in metrics.registry.collect() for sfx in suffixes[fam.type]}
    finally:
        metrics.close()
    assert {m for m in used if m.startswith("sglang:")} <= real, {m for m in used if m.startswith("sglang:")} - real
    assert {m for m in used if m.startswith("sparkctl_")} <= {n for n in ours if n.startswith("sparkctl_")}
    assert len([m for m in used if m.startswith("sglang:")]) >= 10 and "sparkctl_watch_restarts_total" in used


def test_quiet_silences_stderr_never_the_watch_log(local_cluster, watcher):
    root = ledger_of(local_cluster).root
    run = watcher("-q", ready=False)
    log = root / "watch.log"
    wait_until(lambda: log.exists() and "watching cluster" in log.read_text(), "the watch log's first line")
    run.kill(signal.SIGTERM)
    assert run.wait(timeout=30) == 143
    assert "watch      " not in run.stderr and "watcher stopped" in log.read_text()
    assert oct(log.stat().st_mode & 0o777) == "0o600"
    first = log.read_text().splitlines()[0]
    assert re.match(r"^20\d\d-\d\d-\d\dT[\d:.]+Z \[ +[\d.]+s\] watch +watching cluster ", first), first
