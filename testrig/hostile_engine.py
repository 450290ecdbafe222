"""A hostile engine for the process runtime: a tree of processes shaped like the ways a real engine's children
escape a stop (tests/unit/test_engine_tree.py).

It stands in for ``<engine python> -m sglang.launch_server ...`` (`install` writes an executable that ignores those
arguments). What it does comes from HOSTILE_TREE, a comma list:

* children, each a ``python -c`` process carrying HOSTILE_MARK in its argv (so a test finds leftovers by a scan of
  every command line, not through the tracking under test):
  ``group`` (its own process group, as SGLang's workers were seen in CI), ``deaf`` (ignores SIGTERM),
  ``orphan`` (double fork: re-parented away from the engine at once), ``setsid`` (a session of its own: only a cgroup
  holds it), ``shm`` (maps a 1 MiB file in /dev/shm, as SGLang's queues do, named after the mark),
  ``port`` (listens on HOSTILE_ADDR:HOSTILE_PORT, as ``sglang::scheduler_TP0`` held 26000);
* how the main process ends: ``main-exits`` (it exits 1 after starting them: a failed boot), ``main-deaf`` (it
  ignores SIGTERM), else it serves until signalled.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkctl.nodes.handles import ProcessHandle
    from sparkctl.nodes.process import ProcessRuntime

CHILD = {
    "group": "import time\nwhile True: time.sleep(1)",
    "deaf": "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(1)",
    "orphan": ("import os, sys, time\nif os.fork(): os._exit(0)\nos.execv(sys.executable, [sys.executable, '-c', "
               "'import time\\nwhile True: time.sleep(1)', 'orphaned', *sys.argv[1:]])"),
    "setsid": "import os, time\nos.setsid()\nwhile True: time.sleep(1)",
    "shm": ("import mmap, os, sys, time\npath = '/dev/shm/' + sys.argv[1] + '-shm'\n"
            "fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600); os.ftruncate(fd, 1 << 20)\n"
            "m = mmap.mmap(fd, 1 << 20); os.close(fd)\nwhile True: time.sleep(1)"),
    "port": ("import os, socket, time\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
             "s.bind((os.environ.get('HOSTILE_ADDR', '127.0.0.1'), int(os.environ['HOSTILE_PORT'])))\n"
             "s.listen()\nwhile True: time.sleep(1)"),
}
CHILD_KINDS = tuple(CHILD)
MAIN_ENDS = ("main-exits", "main-deaf", "main-serves")


def install(directory: Path) -> Path:
    """An executable standing in for the engine's Python (the process runtime runs it as ``X -m sglang...``)."""
    path = directory / "hostile-python"
    path.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.argv = [{str(Path(__file__))!r}]\n"
                    f"runpy.run_path({str(Path(__file__))!r}, run_name='__main__')\n")
    path.chmod(0o755)
    return path


def kill_pipe(runtime: ProcessRuntime, handle: ProcessHandle, timeout_s: float = 10.0) -> None:
    """SIGKILL a rank's log pipe, as the OOM killer would (its engine dies with it; the engine's children do not),
    and wait until it is gone and reaped. `runtime`: the ProcessRuntime that started `handle`."""
    from sparkctl.nodes import procfs
    pid, ticks = handle.pid, handle.start_ticks
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while procfs.running(pid, ticks):
        if time.monotonic() > deadline:
            raise AssertionError(f"log pipe {pid} still runs {timeout_s:g} s after SIGKILL")
        time.sleep(0.02)
    runtime._reap(handle)


def main() -> int:
    kinds = [k for k in os.environ.get("HOSTILE_TREE", "").split(",") if k]
    mark = os.environ.get("HOSTILE_MARK", "hostile")
    for kind in kinds:
        if kind in CHILD:
            subprocess.Popen([sys.executable, "-c", CHILD[kind], mark], process_group=0 if kind == "group" else None,
                             stdin=subprocess.DEVNULL)
    if "port" in kinds:               # the port is held before the engine says it is up
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex((os.environ.get("HOSTILE_ADDR", "127.0.0.1"), int(os.environ["HOSTILE_PORT"]))) == 0:
                    break
            time.sleep(0.05)
    if "shm" in kinds:                # its shared memory is mapped before the engine says it is up
        deadline = time.monotonic() + 10
        while not os.path.exists(f"/dev/shm/{mark}-shm") and time.monotonic() < deadline:
            time.sleep(0.05)
    print(f"hostile engine {os.getpid()}: children started: {','.join(kinds)}", flush=True)
    if "main-exits" in kinds:
        time.sleep(1)               # its children are up (and the orphan re-parented) when it dies, as at a barrier
        print("ValueError: TP rank 1 could finish the model loading, but there are other ranks that didn't finish "
              "loading. (hostile engine: stands in for a failed boot)", flush=True)
        return 1
    if "main-deaf" in kinds:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
