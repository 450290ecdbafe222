"""Each test's CPU, written as it ends: ``SPARKCTL_TEST_CPU_LOG=/tmp/cpu.jsonl ./bin/test``.

One JSON line per test (appended by whichever xdist worker ran it): its node id, wall seconds, the CPU seconds of
the worker itself (in-process CLI runs, Hypothesis, the test's own code) and of the children the worker waited for
(`sparkctl` subprocesses, real-parser drivers, docker and ssh clients: ``RUSAGE_CHILDREN`` counts a child once it
is reaped). Daemons a test starts and another process reaps (a test cluster's dockerd) are not in it:
``testrig.cpusample`` counts those by kind. A child reaped late lands on the test running when it is reaped: an
in-process `up` starts its log pipes as the worker's children (each with its engine's CPU once it has waited for the
engine), and Python's subprocess module reaps finished children at the next Popen, so a worker that ran the real
engine's tests showed 518 CPU-s on a 13-second test of another module. Summed over a run, the children's CPU is
right; per test, trust it for the tests that wait for their own subprocesses. What the sampler cannot say, this does:
which test pays for the worker's and its subprocesses' CPU (docs/testing.md)."""
from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV = "SPARKCTL_TEST_CPU_LOG"


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


@contextmanager
def measured(nodeid: str, path: str | None = None) -> Iterator[None]:
    """Append `nodeid`'s wall, own and reaped children's CPU to `path` (default: $SPARKCTL_TEST_CPU_LOG; nothing when
    neither is set) once the body ends, however it ends."""
    path = path or os.environ.get(ENV)
    if not path:
        yield
        return
    t0, own0, kids0 = time.monotonic(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    try:
        yield
    finally:
        line = json.dumps({"test": nodeid, "wall_s": round(time.monotonic() - t0, 3),
                           "own_cpu_s": round(_cpu(resource.RUSAGE_SELF) - own0, 3),
                           "children_cpu_s": round(_cpu(resource.RUSAGE_CHILDREN) - kids0, 3)})
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())     # one write under O_APPEND: workers' lines never interleave
        finally:
            os.close(fd)


def summarize(path: str, top: int = 30) -> str:
    """The tests that cost the most CPU (own + children), and the sums by file."""
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    by_file: dict[str, float] = {}
    for r in rows:
        f = r["test"].split("::")[0]
        by_file[f] = by_file.get(f, 0.0) + r["own_cpu_s"] + r["children_cpu_s"]
    out = [f"{len(rows)} tests, {sum(r['own_cpu_s'] for r in rows):.0f} CPU-s in the workers, "
           f"{sum(r['children_cpu_s'] for r in rows):.0f} in their reaped children"]
    out += [f"{s:8.1f}  {f}" for f, s in sorted(by_file.items(), key=lambda kv: -kv[1])[:top]]
    out += [f"{r['own_cpu_s'] + r['children_cpu_s']:8.1f}  own {r['own_cpu_s']:.1f} children {r['children_cpu_s']:.1f}"
            f" wall {r['wall_s']:.0f}  {r['test']}"
            for r in sorted(rows, key=lambda r: -(r["own_cpu_s"] + r["children_cpu_s"]))[:top]]
    return "\n".join(out)


if __name__ == "__main__":
    import sys
    print(summarize(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30))
