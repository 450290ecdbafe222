"""The emulator's vLLM dialect held to the real vLLM 0.32.0: the requests whose answers real vLLM gave on this
machine's CPU (tests/fixtures/captures/vllm-0.32.0-cpu/, its README.md says how each was made), sent to the emulator
and compared by status code, header names, JSON keys and value types, and SSE framing; the ``vllm:`` metric names
(and ``cache_config_info``'s labels) sparkctl's gates and card read exist in both, and the emulator invents none;
the emulator's logs, read by `sparkctl.vllm.logparse`, give the same kind of verdicts as the real logs (ready,
capacity parsed, engine config, headless rank ready, failures by cause, a requested shutdown). Every difference is
fixed in the emulator or listed in KNOWN with its reason (also in sparkctl/sim/README.md): a new difference, or a
listed one that went away, fails.
"""
from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from sparkctl.enginelog import follower_for
from sparkctl.sglang.bootwatch import BootState, LogFollower
from sparkctl.sglang.logparse import EventKind
from sparkctl.vllm import answers, measures
from sparkctl.vllm.logparse import parse_line
from testrig.testenv import free_port

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "vllm-0.32.0-cpu"
CHAT = json.loads((CAPTURES / "tp1-chat-request.json").read_text())
CHAT_STREAM = json.loads((CAPTURES / "tp1-chat-stream-request.json").read_text())
TINY = ["--max-model-len", "1024", "--kv-cache-memory-bytes", "64M", "--enforce-eager", "--dtype", "bfloat16"]
NGRAM = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, '
         '"prompt_lookup_min": 2}']

# (capture, method, path, request body): each capture is the real answer to that request
REQUESTS = [
    ("tp1-health.txt", "GET", "/health", None),
    ("tp1-ping.txt", "GET", "/ping", None),
    ("tp1-load.txt", "GET", "/load", None),
    ("tp1-version.txt", "GET", "/version", None),
    ("tp1-v1-models.txt", "GET", "/v1/models", None),
    ("tp1-chat.txt", "POST", "/v1/chat/completions", CHAT),
    ("tp1-chat-stream.raw", "POST", "/v1/chat/completions", CHAT_STREAM),
    ("spec-ngram-chat.json", "POST", "/v1/chat/completions", CHAT),
    ("spec-ngram-completion-1.json", "POST", "/v1/completions",
     {"model": "m", "prompt": "The spark cluster", "max_tokens": 32, "temperature": 0}),
]

_NO_MODEL = ("the emulator loads no model and has no tokenizer's vocabulary: the text is the emulator's own words, "
             "compared by type only")
KNOWN: dict[str, str] = {
    "tp1-version.txt:emulated": "the emulator's own marker (true): sparkctl.engines.emulated reads it to label a "
                                "deployment and a card emulated (the real /version has only 'version')",
}
# Differences outside what an answer's shape shows, each with its reason (kept in sparkctl/sim/README.md too).
NOT_MODELLED = {
    "route table": "the emulator serves 9 of the real server's ~35 routes (/health, /ping, /load, /version, /metrics, "
                   "/v1/models, /v1/chat/completions, /v1/completions) and prints only those in its route table",
    "metric families": "the emulator exports the vllm: families sparkctl's gates, card and dashboards read (checked "
                       "below), not the real server's histograms of queue/prefill/decode time or python_/process_",
    "config line": "core.py:133's line carries the fields sparkctl reads, in the real order, not the compilation, "
                   "observability and structured-output configs",
    "text": _NO_MODEL,
}


def _split(raw: str) -> tuple[int | None, set[str], str]:
    """(status, header names, body) of a `curl -i` capture; a bare body (*.json, *.raw) has no status/headers."""
    if not raw.startswith("HTTP/"):
        return None, set(), raw
    head, _, body = raw.replace("\r\n", "\n").partition("\n\n")
    lines = head.split("\n")
    return int(lines[0].split()[1]), {ln.split(":", 1)[0].lower() for ln in lines[1:] if ":" in ln}, body


def _shape(value: Any, depth: int = 0) -> Any:
    """Keys and value types, three levels down (lists: their first element)."""
    if isinstance(value, dict):
        return {k: (_shape(v, depth + 1) if depth < 3 else type(v).__name__) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0], depth + 1)] if value and depth < 3 else "list"
    return type(value).__name__


def _frames(body: str) -> list[Any]:
    out: list[Any] = []
    for line in body.splitlines():
        if line.startswith("data: "):
            payload = line[6:].strip()
            out.append("[DONE]" if payload == "[DONE]" else json.loads(payload))
    return out


def _diff(name: str, mine: Any, real: Any, out: list[str], where: str = "") -> None:
    a, b = _shape(mine), _shape(real)
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b or (a[key] != b[key] and "NoneType" not in (a[key], b[key])):
                out.append(f"{name}:{where}{key}")
    elif a != b:
        out.append(f"{name}:{where}shape")


def _sse_diff(name: str, body: str, real_body: str, out: list[str]) -> None:
    """SSE framing: a role-only opener, content deltas, the finish reason on the last content frame, a usage frame
    with no choices, [DONE]; and each kind of frame shaped as the real one."""
    ours, theirs = _frames(body), _frames(real_body)
    kinds = [_kind(f) for f in ours]
    real_kinds = [_kind(f) for f in theirs]
    if _squash(kinds) != _squash(real_kinds):
        out.append(f"{name}:sse-framing {_squash(kinds)} (real {_squash(real_kinds)})")
    for kind in ("opener", "delta", "finish", "usage"):
        mine = next((f for f, k in zip(ours, kinds) if k == kind), None)
        real = next((f for f, k in zip(theirs, real_kinds) if k == kind), None)
        if mine is not None and real is not None:
            _diff(name, mine, real, out, f"{kind}.")


def _kind(frame: Any) -> str:
    if frame == "[DONE]":
        return "[DONE]"
    if not frame["choices"]:
        return "usage"
    choice = frame["choices"][0]
    if choice.get("finish_reason"):
        return "finish"
    return "opener" if choice["delta"].get("role") else "delta"


def _squash(kinds: list[str]) -> list[str]:
    return [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]


def test_emulator_answers_like_the_real_vllm(vllm_sim):
    p = vllm_sim(TINY)
    p.wait_vllm_up()
    found: list[str] = []
    with httpx.Client(base_url=f"http://{p.host}:{p.port}", timeout=30) as client:
        for name, method, path, body in REQUESTS:
            real_code, real_headers, real_body = _split((CAPTURES / name).read_text(encoding="utf-8"))
            stream = name.endswith(".raw")
            res = client.request(method, path, json=body)
            if real_code is not None and res.status_code != real_code:
                found.append(f"{name}:status {res.status_code} (real {real_code})")
            if real_headers and set(res.headers) - {"content-length"} != real_headers - {"content-length"}:
                found.append(f"{name}:headers {sorted(set(res.headers) ^ real_headers)}")
            if stream:
                _sse_diff(name, res.text, real_body, found)
                headers = _split((CAPTURES / "tp1-chat-stream-headers.txt").read_text())[1]
                if set(res.headers) != headers:
                    found.append(f"{name}:headers {sorted(set(res.headers) ^ headers)}")
            elif real_body.strip():
                _diff(name, res.json(), json.loads(real_body), found)
            elif res.content:
                found.append(f"{name}:body (real: empty)")
    new = [d for d in found if d not in KNOWN]
    gone = [d for d in KNOWN if d not in found]
    assert not new and not gone, "\n".join(["new differences (fix the emulator or list them in KNOWN and "
                                            "sim/README.md):", *new, "listed but gone:", *gone])


def _families(text: str) -> set[str]:
    return {re.sub(r"_(bucket|sum|count|created|total)$", "", line.split("{", 1)[0].split(" ", 1)[0])
            for line in text.splitlines() if line.startswith("vllm:")}


# What sparkctl reads from /metrics: the card's counters (sparkctl.vllm.measures), the gates' cache_config_info
# (sparkctl.vllm.answers), and the load gauges and TTFT histogram of its dashboards.
READ_BY_SPARKCTL = {*(re.sub(r"_total$", "", n) for n in measures.COUNTERS.values()), "vllm:cache_config_info",
                    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                    "vllm:time_to_first_token_seconds", "vllm:request_success"}
CACHE_LABELS_READ = ("cache_dtype", "gpu_memory_utilization", "kv_cache_size_tokens", "kv_cache_max_concurrency",
                     "num_gpu_blocks", "block_size")


def test_metrics_sparkctl_reads_are_real_and_the_emulator_invents_none(vllm_sim):
    p = vllm_sim([*TINY, *NGRAM])
    p.wait_vllm_up()
    httpx.post(p.url("/v1/chat/completions"), json=CHAT, timeout=30)
    text = httpx.get(p.url("/metrics"), timeout=30).text
    real_text = _split((CAPTURES / "spec-ngram-metrics.txt").read_text())[2]
    real, ours = _families(real_text), _families(text)
    assert sorted(READ_BY_SPARKCTL - real) == [] and sorted(READ_BY_SPARKCTL - ours) == []
    assert sorted(ours - real) == [], "the emulator exports vllm: names the real 0.32.0 does not"
    assert set(answers.cache_config(text)) == set(answers.cache_config(real_text))
    assert all(answers.cache_config(text)[k] for k in CACHE_LABELS_READ)
    assert set(measures.counters(text)) == set(measures.counters(real_text))
    for line in text.splitlines():         # every HELP/TYPE line is the real one
        if line.startswith("# ") and line.split(" ", 3)[2] in {ln.split(" ", 3)[2] for ln in
                                                                 real_text.splitlines() if ln.startswith("# ")}:
            assert line in real_text.splitlines(), line


def _follow(lines: list[str]) -> LogFollower:
    f = follower_for("vllm")
    for line in lines:
        f.feed(line)
    return f


def _real_lines(name: str) -> list[str]:
    return [ln for ln in (CAPTURES / name).read_text(encoding="utf-8").split("\n") if not ln.startswith("# ")]


def _verdict(lines: list[str]) -> dict[str, Any]:
    """What sparkctl concludes from a log: the boot state, the capacity keys, the engine config's keys, the
    failures by kind and cause, the speculative lines, a requested shutdown."""
    f = _follow(lines)
    evs = [ev for ev in (parse_line(ln) for ln in lines) if ev is not None]
    return {"state": f.classify().state, "capacity": sorted(f.capacity or {}),
            "config": sorted(f.engine_config or {}),
            "failures": sorted({(ev.kind.value, str(ev.fields.get("cause"))) for ev in evs
                                if ev.kind in (EventKind.MEMORY_BUDGET, EventKind.CONFIG_ERROR)}),
            "spec_lines": bool(measures.log_window(lines)["spec_lines"]),
            "stats_lines": bool(measures.log_window(lines)["stats_lines"]),
            "shutdown": bool(f.shutdown and f.shutdown.fields.get("requested"))}


def _upto(lines: list[str], fragment: str) -> list[str]:
    return lines[:next(i for i, ln in enumerate(lines) if fragment in ln)]


def test_the_boot_logs_read_like_the_real_ones(vllm_sim):
    """TP=1 with ngram served and stopped (spec-ngram-boot.log, tp1-sigterm-shutdown.log), its state before the
    shutdown (tp1-boot.log); the two failures of a too small KV cache and a too long max-model-len."""
    p = vllm_sim([*TINY, *NGRAM], knobs={"vllm_stats_interval_s": 0.3})
    p.wait_vllm_up()
    httpx.post(p.url("/v1/chat/completions"), json=CHAT, timeout=30)
    p.wait_for("SpecDecoding metrics: ", timeout=5)
    up = list(p.lines)
    p.kill(signal.SIGTERM)
    assert p.wait_exit(10) == 0
    real_up = _upto(_real_lines("spec-ngram-boot.log"), "[shutdown] API server: shutdown triggered")
    assert _verdict(up) == _verdict(real_up) and _verdict(up)["state"] is BootState.READY
    assert _verdict(p.lines) == _verdict(_real_lines("spec-ngram-boot.log")) and _verdict(p.lines)["shutdown"]
    failing = [(["--max-model-len", "1024", "--kv-cache-memory-bytes", "256K"], {},
                "fail-kv-cache-below-max-model-len.log"),
               (["--max-model-len", "1024", "--kv-cache-memory-bytes", "32K"], {}, "fail-kv-cache-too-small.log"),
               (["--max-model-len", "4096"], {"model_context_length": 1024}, "fail-max-model-len.log")]
    for argv, knobs, real in failing:
        q = vllm_sim(argv, knobs=knobs)
        assert q.wait_exit(10) == 1
        mine, theirs = _verdict(q.lines), _verdict(_real_lines(real))
        assert mine["state"] is theirs["state"] is BootState.FAILED, real
        assert mine["failures"] == theirs["failures"], real


def test_tp2_logs_read_like_the_real_ones(vllm_sim):
    """tp2-rank0.log / tp2-rank1.log: rank 0 ready with its capacity and TP=2 config and serving, the headless rank
    ready as a worker; both read up to rank 0's shutdown."""
    r0h, r1h = "127.0.0.2", "127.0.0.3"
    master = free_port(r0h)
    common = [*TINY, "--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", r0h, "--master-port",
              str(master)]
    r0 = vllm_sim([*common, "--node-rank", "0"], host=r0h, knobs={"vllm_stats_interval_s": 0.3})
    r1 = vllm_sim([*common, "--node-rank", "1", "--headless"], host=r1h)
    r0.wait_vllm_up()
    r1.wait_for(r"GiB for KV cache on node 0\.")
    httpx.post(r0.url("/v1/chat/completions"), json=CHAT, timeout=30)      # the real rank 0 served chats too
    r0.wait_for("Engine 000: ", timeout=5)
    real0 = _upto(_real_lines("tp2-rank0.log"), "[shutdown]")
    real1 = _upto(_real_lines("tp2-rank1.log"), "[shutdown]")
    assert _verdict(list(r0.lines)) == _verdict(real0)
    mine0, theirs0 = _follow(list(r0.lines)).engine_config, _follow(real0).engine_config
    assert mine0 is not None and theirs0 is not None
    assert mine0["tensor_parallel_size"] == theirs0["tensor_parallel_size"] == 2
    mine1, theirs1 = _follow(list(r1.lines)), _follow(real1)
    assert mine1.classify(final=False).state is theirs1.classify(final=False).state is BootState.WORKER_READY
    assert {k for k in mine1.milestones} == {k for k in theirs1.milestones}


@pytest.mark.parametrize("name", [r[0] for r in REQUESTS])
def test_every_capture_compared_is_there(name):
    assert (CAPTURES / name).is_file() and (CAPTURES / name).stat().st_size > 0
