"""Emulator processes with known truth for the bench tests (started here, stopped by their own Popen)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from testrig.priority import raise_priority, raised_priority
from testrig.testenv import free_port

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "sglang"


@dataclass
class Sim:
    url: str
    log: Path
    knobs: dict[str, str]
    proc: subprocess.Popen


def start_sim(tmp: Path, name: str, knobs: Mapping[str, object], extra_argv: list[str]) -> Sim:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCTL_SIM_")}
    env.update({f"SPARKCTL_SIM_{k.upper()}": str(v) for k, v in {"boot_s": 0.2, **knobs}.items()})
    env["PYTHONUNBUFFERED"] = "1"
    log = tmp / f"{name}.log"
    argv = [sys.executable, "-m", "sparkctl.sim", "--model-path", "/m", "--served-model-name", "x",
            "--host", "127.0.0.1", "--port", str(port), "--tp-size", "1", "--reasoning-parser", "glm45", *extra_argv]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
        raise_priority(proc.pid)          # before its threads start; they inherit it (testrig/priority.py)
    return Sim(f"http://127.0.0.1:{port}", log, {k: str(v) for k, v in knobs.items()}, proc)


def wait_ready(sim: Sim, timeout: float = 20.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if sim.proc.poll() is not None:
            raise RuntimeError(f"emulator exited {sim.proc.returncode}: {sim.log.read_text()[-2000:]}")
        try:
            if httpx.get(sim.url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"emulator not ready in {timeout}s: {sim.log.read_text()[-2000:]}")


def stop_sim(sim: Sim) -> None:
    if sim.proc.poll() is None:
        sim.proc.terminate()
        try:
            sim.proc.wait(5)
        except subprocess.TimeoutExpired:
            sim.proc.kill()
            sim.proc.wait(5)


SPEC = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "/d",
        "--speculative-num-draft-tokens", "8"]

# Known truth. OFF: 400 tok/s, TTFT = 0.05 s + uncached tokens/20,000, one request at a time, 4,096 window.
# The decode rates keep each timed window >= 0.3 s (240 tokens): a client's timestamps of the first and last
# token move by a few ms on a loaded machine, and the checks allow 2% (at 1,600 tok/s the window was 0.15 s
# and 5-7 ms of delivery jitter failed them).
OFF = {"decode_tps": 400, "ttft_base_s": 0.05, "prefill_tps": 20000}
OFF_ARGV = ["--max-running-requests", "1", "--context-length", "4096", "--decode-log-interval", "4"]
# ON (deterministic): every verify step accepts all 8 drafts: 100 * 8 / 1.0 = 800 tok/s.
ON = {"decode_tps": 100, "verify_cost": 1.0, "accept_len_code": 8, "accept_len_prose": 8,
      "ttft_base_s": 0.05, "prefill_tps": 20000}
# ON with partial acceptance (ranges in the log), one G6 prompt diverging at a known token.
DIVERGE_AT = 5
ACC = {"decode_tps": 400, "accept_len_code": 4.6, "ttft_base_s": 0.02,
       "divergence": f'{{"contains:capital of Australia": {DIVERGE_AT}}}'}


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Sim]]:
    tmp = tmp_path_factory.mktemp("sims")
    started = {"off": start_sim(tmp, "off", OFF, OFF_ARGV),
               "on": start_sim(tmp, "on", ON, SPEC + ["--decode-log-interval", "4"]),
               "acc": start_sim(tmp, "acc", ACC, SPEC + ["--decode-log-interval", "2"])}
    try:
        for s in started.values():
            wait_ready(s)
        with raised_priority():       # the bench (the measuring client) runs in this thread and its workers
            yield started
    finally:
        for s in started.values():
            stop_sim(s)


@pytest.fixture(scope="module")
def truth() -> dict[str, object]:
    """The configured knobs the tests compare measurements against."""
    return {"off": OFF, "on": ON, "acc": ACC, "diverge_at": DIVERGE_AT, "off_window": 4096}


@pytest.fixture
def embedded_cluster(local_cluster: Path, state_dir: Path):
    """The shared embedded two-rank cluster (tests/conftest.py `local_cluster`); `down` first at teardown."""
    yield local_cluster
    from sparkctl.config.inventory import load_inventory
    from sparkctl.deploy.commands import Deployer
    from sparkctl.deploy.progress import Reporter
    with contextlib.suppress(Exception):  # teardown: local_cluster still stops every recorded engine
        Deployer(load_inventory(local_cluster), Reporter(quiet=True)).down()

@pytest.fixture
def hybrid_sim(tmp_path: Path) -> Iterator[Sim]:
    """A hybrid (mamba-state) model whose state cache caps max_running_requests to 1, as the engine warns at boot."""
    sim = start_sim(tmp_path, "hybrid", {"decode_tps": 400, "mamba_slots": 1},
                    ["--mamba-full-memory-ratio", "2", "--decode-log-interval", "4"])
    try:
        wait_ready(sim)
        yield sim
    finally:
        stop_sim(sim)


@pytest.fixture
def fresh_acc_off(tmp_path: Path) -> Iterator[dict[str, Sim]]:
    """The ACC and OFF emulators started for one test, as `sims` starts them: nothing cached, logs empty."""
    started = {"acc": start_sim(tmp_path, "acc", ACC, SPEC + ["--decode-log-interval", "2"]),
               "off": start_sim(tmp_path, "off", OFF, OFF_ARGV)}
    try:
        for s in started.values():
            wait_ready(s)
        with raised_priority():
            yield started
    finally:
        for s in started.values():
            stop_sim(s)
