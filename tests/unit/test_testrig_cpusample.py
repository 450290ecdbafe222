"""testrig.cpusample: the kinds it tells apart (command lines as `ps` showed them during a full run) and a busy
process's CPU counted while it lives and after it ends."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from testrig.cpusample import Tally, kind, main, sample


@pytest.mark.parametrize("argv,comm,want", [
    ("sglang::scheduler", "sglang::schedul", "sglang-real"),
    ("/root/.cache/sparkctl/real-engine/x/venv/bin/python -m sglang.launch_server --model-path m", "python",
     "sglang-real"),
    ("/v/bin/python -B -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)", "python",
     "sglang-real"),
    ("/work/main/.venv/bin/python -I -m sparkctl.nodes.logpipe /tmp/x.log /tmp/s --", "python", "logpipe"),
    ("/work/main/.venv/bin/python -m sparkctl.sim --model-path /models/GLM", "python", "emulator"),
    ("/work/main/.venv/bin/python -m sparkctl up --profile dflash-off --yes --json", "python", "sparkctl-cli"),
    ("[pytest-xdist running] tests/lifecycle/test_crash_matrix.py::test_sigkill", "python", "pytest-worker"),
    ("[pytest-xdist idle]", "python", "pytest-worker"),
    # command lines as `ps` showed them during a whole run (a test cluster's daemons name pytest's temp directory)
    ("dockerd --config-file /tmp/pytest-of-root/pytest-122/popen-gw2/real-cluster0/spark-a/daemon.json --data-root "
     "/var/lib/sparkctl-test/spkr-spark-a", "dockerd", "dockerd"),
    ("sshd: /usr/sbin/sshd -D -e -f /tmp/pytest-of-root/pytest-122/popen-gw0/cluster0/spark-a/sshd_config [listener] "
     "0 of 10-100 startups", "sshd", "ssh"),
    ("/work/main/.venv/bin/python -m pytest -n 4 --dist loadgroup -m not timing", "python", "pytest-main"),
    ("/work/main/.venv/bin/python -I -m sparkctl.nodes.logpipe /tmp/pytest-of-root/pytest-122/popen-gw3/real0/state/"
     "r135x8/logs/20261206T105714Z-cpu.log", "python", "logpipe"),
    ('/root/.cache/sparkctl/sglang-venvs/0.5.23/bin/python -c """The real-parser driver: runs with a version\'s venv '
     'python (it never imports sparkctl', "python", "real-parser"),
    ("[kworker/1:1H-kblockd]", "kworker/1:1H-kblockd", "other:kworker"),
    ("", "sglang::schedul", "sglang-real"), ("", "sglang::router", "router"),
])
def test_kind(argv, comm, want):
    assert kind(argv, comm) == want


def test_a_busy_process_is_counted_while_it_lives_and_after_it_ends(tmp_path):
    tally = Tally()
    tally.update(sample())               # the run's first sample: before the process starts
    p = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                          "while time.process_time() - t < 0.5: pass\ntime.sleep(30)"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            tally.update(sample())
            mine = [cpu for (pid, _), (cpu, _) in tally.live.items() if pid == p.pid]
            if mine and mine[0] >= 0.5:
                break
            time.sleep(0.1)
        assert mine and mine[0] >= 0.5, mine
    finally:
        p.kill()
        p.wait()
    tally.update(sample())
    assert tally.ended["python-other"] >= 0.5
    out = tmp_path / "cpu.json"
    tally.write(out)
    assert json.loads(out.read_text())["cpu_s"]["python-other"] >= 0.5


def test_main_ends_with_the_watched_process_and_writes_its_tally(tmp_path):
    out = tmp_path / "cpu.json"
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert main([str(out), str(p.pid)]) == 0
    written = json.loads(out.read_text())
    assert set(written) == {"elapsed_s", "machine_cpu_s", "machine_busy", "cpu_s"}
    assert written["machine_cpu_s"] >= 0 and (written["machine_busy"] is None or 0 <= written["machine_busy"] <= 1)
    assert main([]) == 2


def test_what_a_process_spent_before_the_first_sample_is_not_counted():
    """A process older than the run (the machine's init, a kernel thread, a daemon) counts only what it spends after
    the first sample; one that ends during the run, only what it spent in it."""
    tally = Tally()
    tally.update({(1, 5): (400.0, "other:init"), (7, 9): (3.0, "dockerd")})
    tally.update({(1, 5): (401.5, "other:init"), (7, 9): (3.5, "dockerd"), (20, 30): (2.0, "emulator")})
    assert tally.totals() == {"emulator": 2.0, "other:init": 1.5, "dockerd": 0.5}
    tally.update({(1, 5): (402.0, "other:init")})          # dockerd and the emulator ended at their last sample
    assert tally.totals() == {"emulator": 2.0, "other:init": 2.0, "dockerd": 0.5}


def test_machine_ticks_are_busy_and_total_of_the_first_line(tmp_path):
    from testrig.cpusample import machine_ticks

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 800 40 3 2 10 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    assert machine_ticks(stat) == (170, 1010)          # user nice system irq softirq steal; idle and iowait out
