"""What procfs calls dead: a zombie only when its whole thread group has ended. A process whose main thread exited
while another thread runs shows "Z" for its PID, yet that thread holds its open files (a listening socket): seen as
"ports still held" after a SIGKILL stop whose process check had passed (tests/realengine/test_engine_tree_real.py)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from sparkctl.nodes import procfs
from sparkctl.nodes.process import local_port_free

# The main thread listens, starts a thread that lives on, and leaves through pthread_exit: the PID is a zombie
# leader whose thread group (and socket) lives until the thread ends.
LEADER_EXITS = """
import ctypes, socket, sys, threading, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 0)); s.listen()
print(s.getsockname()[1], flush=True)
threading.Thread(target=time.sleep, args=(float(sys.argv[1]),)).start()
ctypes.CDLL(None).pthread_exit(None)
"""


def test_a_zombie_leader_whose_thread_runs_is_running_and_its_port_held_until_the_thread_ends():
    p = subprocess.Popen([sys.executable, "-c", LEADER_EXITS, "3"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        port = int(p.stdout.readline())
        deadline = time.monotonic() + 10
        stat = Path(f"/proc/{p.pid}/stat")
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":      # the leader has exited
            assert time.monotonic() < deadline
            time.sleep(0.01)
        ticks = procfs.start_ticks(p.pid)
        assert procfs.running(p.pid, ticks), procfs.proc_stat(p.pid)      # not dead: its thread holds the socket
        assert not local_port_free("127.0.0.1", port)
        p.wait(timeout=30)
    finally:
        p.kill()
        p.wait()


def test_a_true_zombie_is_dead():
    p = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while (procfs.proc_stat(p.pid) or ("Z",))[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not procfs.running(p.pid, None)
    finally:
        p.wait()
