"""Where a test run's CPU goes, by kind of process: ``python -m testrig.cpusample OUT.json [PID]``.

Samples every process's CPU time (utime + stime, /proc/PID/stat) once a second until PID ends (or SIGTERM/SIGINT),
and writes to OUT.json every 30 samples and at the end: the machine's busy CPU seconds and busy fraction over the run
(/proc/stat: what the sample misses included), and seconds of CPU by kind (the real SGLang engine, the
emulator, the log pipes, sparkctl's CLI, the pytest workers, the test nodes' dockerd, ...). A process that lived
less than a second between two samples is missed; one that ended counts with its last sample. On a 2-core CI
machine the suite is CPU-bound, so this says what to make cheaper (docs/testing.md quotes its figures)::

    CI=true ./bin/test & python -m testrig.cpusample /tmp/cpu.json $!
"""
from __future__ import annotations

import collections
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

HZ = os.sysconf("SC_CLK_TCK")
# (substring of the command line, kind): the first that matches names the process
BY_ARGV = (
    ("sglang_router", "router"), ("sglang::router", "router"),
    ("sglang.launch_server", "sglang-real"), ("sglang::", "sglang-real"),
    ("multiprocessing.spawn", "sglang-real"),          # SGLang's scheduler/detokenizer before they rename themselves
    ("sglang.benchmark", "sglang-bench"),
    ("sparkctl.sim", "emulator"), ("sparkctl.nodes.logpipe", "logpipe"),
    ("-m sparkctl", "sparkctl-cli"), ("[pytest-xdist ", "pytest-worker"), ("-m pytest", "pytest-main"),
    ("ansible", "ansible"), ("The real-parser driver", "real-parser"), ("-m mypy", "mypy"), ("-m pip", "pip"),
    ("testrig.cpusample", "cpusample"),
)
BY_COMM = {"dockerd": "dockerd", "containerd": "docker", "containerd-shim": "docker",
           "containerd-shim-runc-v2": "docker", "docker": "docker", "runc": "docker", "docker-proxy": "docker",
           "sshd": "ssh", "ssh": "ssh"}


def kind(argv: str, comm: str) -> str:
    """The kind of a process from its command line and its /proc comm: a daemon by its comm first (a test cluster's
    dockerd and sshd name files under pytest's /tmp/pytest-of-* in their command lines), then by its command line."""
    if comm in BY_COMM:
        return BY_COMM[comm]
    for needle, name in BY_ARGV:
        if needle in argv:
            return name
    if comm.startswith("sglang::"):                     # renamed by setproctitle, its command line gone
        return "router" if "router" in comm else "sglang-real"
    return "python-other" if comm.startswith("python") else f"other:{comm.split('/')[0]}"


def sample(proc: Path = Path("/proc")) -> dict[tuple[int, int], tuple[float, str]]:
    """(pid, start time) -> (CPU seconds so far, kind), for every process readable now."""
    seen: dict[tuple[int, int], tuple[float, str]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            close = stat.rindex(")")
            comm, fields = stat[stat.index("(") + 1:close], stat[close + 2:].split()
            cpu = (int(fields[11]) + int(fields[12])) / HZ
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        seen[(int(entry.name), int(fields[19]))] = (cpu, kind(argv, comm))
    return seen


def machine_ticks(stat: Path = Path("/proc/stat")) -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs since boot: what every process spent, those the per-process sample misses
    (alive under a second) included; busy is total less idle and iowait."""
    fields = [int(x) for x in stat.read_text().split("\n", 1)[0].split()[1:9]]
    total = sum(fields)
    return total - fields[3] - fields[4], total


class Tally:
    """CPU by kind over a run: ended processes at their last sample, live ones at their current one, each less what
    it had spent at the first sample (a process older than the run, the machine's init or a kernel thread, counts
    only what it spent during the run: counted whole, a VM's init and its memory monitor once added 420 CPU-s of
    hours before the run to a 9-minute sample)."""

    def __init__(self) -> None:
        self.ended: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.live: dict[tuple[int, int], tuple[float, str]] = {}
        self.before: dict[tuple[int, int], float] | None = None    # CPU at the first sample, by (pid, start time)
        self.started = time.monotonic()
        self.machine0 = machine_ticks()

    def update(self, now: dict[tuple[int, int], tuple[float, str]]) -> None:
        if self.before is None:
            self.before = {key: cpu for key, (cpu, _) in now.items()}
        for key in self.live.keys() - now.keys():
            cpu, name = self.live[key]
            self.ended[name] += self._during(key, cpu)
        self.live = now

    def _during(self, key: tuple[int, int], cpu: float) -> float:
        return cpu - (self.before or {}).get(key, 0.0)

    def totals(self) -> dict[str, float]:
        total = collections.defaultdict(float, self.ended)
        for key, (cpu, name) in self.live.items():
            total[name] += self._during(key, cpu)
        return {k: round(v, 1) for k, v in sorted(total.items(), key=lambda kv: -kv[1])}

    def write(self, out: Path) -> None:
        busy, total = (now - then for now, then in zip(machine_ticks(), self.machine0, strict=True))
        out.write_text(json.dumps({"elapsed_s": round(time.monotonic() - self.started, 1),
                                   "machine_cpu_s": round(busy / HZ, 1),
                                   "machine_busy": round(busy / total, 3) if total else None,
                                   "cpu_s": self.totals()}, indent=1) + "\n")


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__.split("\n")[0], file=sys.stderr)
        return 2
    out, watch = Path(argv[0]), int(argv[1]) if len(argv) == 2 else None
    stop: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.append(signum)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    tally, n = Tally(), 0
    while not stop and (watch is None or os.path.exists(f"/proc/{watch}")):
        tally.update(sample())
        n += 1
        if n % 30 == 0:
            tally.write(out)
        time.sleep(1)
    tally.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
