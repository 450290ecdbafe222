"""A rank killed while `sparkctl bench` measures the deployment fails the run: the card says which rank and when."""
from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from sparkctl.errors import BenchError
from testrig.handles import active, process_handle


@pytest.mark.timeout(120)
def test_rank_killed_during_decode_fails_the_run(cli, embedded_cluster, tmp_path):
    from sparkctl.bench.arms import BenchOptions
    from sparkctl.bench.run import bench_deployment
    from sparkctl.config.inventory import load_inventory
    from sparkctl.deploy.commands import Deployer
    from sparkctl.deploy.progress import Reporter
    from sparkctl.sglang.bounds import Limits

    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
    assert code == 0, err
    deployer = Deployer(load_inventory(embedded_cluster), Reporter(quiet=True))
    record = active(deployer.ledger)
    victim = process_handle(record, 1)
    killed: dict[str, float] = {}

    def progress(message: str) -> None:
        # kill rank 1 (a real process, by its recorded PID) as the first measured decode run is reported
        if "decode code run 1/" in message and not killed:
            os.kill(victim.pid, signal.SIGKILL)
            killed["t"] = time.monotonic()

    opts = BenchOptions(gates=("decode",), runs=6, max_tokens=81, warmup=0, out_dir=tmp_path)
    with pytest.raises(BenchError) as ei:
        bench_deployment(deployer, opts, progress=progress, limits=Limits(read_s=20, idle_s=20, request_s=60))
    detected_after = time.monotonic() - killed["t"]
    e = ei.value
    assert e.exit_code == 4
    assert re.search(r"rank 1 \(\S+\) died during the bench: found dead at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ, "
                     r"[\d.]+ s into the run, during .*decode code run [1-6]/6.*; last seen alive at .*Z",
                     e.message), e.message
    assert e.hint is not None and "logs --rank 1" in e.hint and "marked failed" in e.hint
    assert detected_after < 10, detected_after       # watched every second, not noticed at the end of the run
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "failed"
    death = report["rank_death"]
    assert death["rank"] == 1 and death["deployment"] == record.id and death["at"].endswith("Z")
    assert re.search(r"decode code run [1-6]/6", death["during"]) and death["state"] and death["last_alive"]
    card = Path(tmp_path / "report.md").read_text()
    assert "status **failed**" in card and "rank 1" in card and death["at"] in card
