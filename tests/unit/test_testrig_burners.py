"""testrig.burners: the busy machine the real-engine tier can run beside (SPARKCTL_TEST_CPU_BURNERS). The burners
spin, and none outlives the block, nor the test process when it is SIGKILLed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testrig.burners import ENV, MAX_BURNERS, BurnerSettingError, burners_requested, cpu_burners


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":            # a zombie of a parent that is not us: it no longer runs
            return True
        time.sleep(0.05)
    return False


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])        # utime + stime


@pytest.mark.parametrize("raw,want", [("", 0), ("0", 0), ("2", 2), (" 3 ", 3), (str(MAX_BURNERS), MAX_BURNERS)])
def test_the_requested_count(raw, want):
    assert burners_requested({ENV: raw}) == want
    assert burners_requested({}) == 0


@pytest.mark.parametrize("raw", ["-1", "two", "2.5", "1e3", str(MAX_BURNERS + 1), "99999999999", "2; rm -rf /"])
def test_a_bad_count_is_an_error_naming_the_variable(raw):
    with pytest.raises(BurnerSettingError, match=ENV):
        burners_requested({ENV: raw})


def test_burners_spin_and_are_reaped_when_the_block_ends():
    with cpu_burners(2) as procs:
        pids = [p.pid for p in procs]
        assert len(set(pids)) == 2
        before = [_cpu_ticks(pid) for pid in pids]
        time.sleep(1.0)
        assert all(_cpu_ticks(pid) > b for pid, b in zip(pids, before))     # each one is burning CPU
    assert all(p.returncode is not None for p in procs)                      # killed and reaped
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids)


def test_burners_end_on_an_exception_in_the_block():
    with pytest.raises(RuntimeError), cpu_burners(1) as procs:
        raise RuntimeError("the tier failed")
    assert procs[0].returncode is not None


def test_burners_die_with_a_sigkilled_test_process():
    code = ("import sys, time; from testrig.burners import cpu_burners\n"
            "with cpu_burners(2) as procs:\n"
            "    print(' '.join(str(p.pid) for p in procs), flush=True); time.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    assert holder.stdout is not None                 # a pipe
    try:
        pids = [int(x) for x in holder.stdout.readline().split()]
        assert len(pids) == 2 and all(Path(f"/proc/{pid}").exists() for pid in pids)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        assert all(_gone(pid) for pid in pids), pids
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)
