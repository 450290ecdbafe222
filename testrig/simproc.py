"""Emulator processes for the tests (the `sim` fixture in tests/conftest.py): run them on loopback addresses, wait
for their log lines, parse SSE."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from testrig.priority import raise_priority

REPO = Path(__file__).resolve().parents[1]
MODEL = "/models/GLM-5.3-Flash-NVFP4"


class SimProc:
    """One emulator process; its merged stdout/stderr is collected line by line."""

    def __init__(self, argv: list[str], env: dict[str, str], host: str, port: int) -> None:
        self.host, self.port = host, port
        self.lines: list[str] = []
        self._cv = threading.Condition()
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCTL_SIM_")}
        full_env.update(env)
        full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, "-m", "sparkctl.sim", *argv], env=full_env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(REPO))
        raise_priority(self.proc.pid)      # before its threads start; they inherit it
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                with self._cv:
                    self.lines.append(line.rstrip("\n"))
                    self._cv.notify_all()
        except (ValueError, OSError):      # close() closed the pipe before its end reached us: nothing more to read
            pass
        with self._cv:
            self._cv.notify_all()

    @property
    def text(self) -> str:
        with self._cv:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 10.0, *, since: int = 0) -> str:
        """The first line from line `since` on (`len(self.lines)` before an action: a line the action caused, never
        an older one alike, e.g. the server's own start-up request) that matches `pattern`, waiting for it."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        with self._cv:
            seen = since
            while True:
                for line in self.lines[seen:]:
                    if rx.search(line):
                        return line
                seen = len(self.lines)
                left = end - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"no line matching {pattern!r} within {timeout}s; log:\n" +
                                         "\n".join(line[:300] for line in self.lines[-40:]))
                self._cv.wait(min(left, 0.2))

    def wait_ready(self, timeout: float = 15.0) -> None:
        self.wait_for(r"The server is fired up and ready to roll!", timeout)

    def wait_vllm_up(self, timeout: float = 15.0) -> None:
        """The vLLM dialect's rank 0 is up: uvicorn's start-up line, then its port answering (it binds after)."""
        import httpx
        self.wait_for(r"^INFO:     Application startup complete\.$", timeout)
        end = time.monotonic() + timeout
        while True:
            try:
                httpx.get(self.url("/health"), timeout=1)
                return
            except httpx.TransportError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.02)

    def wait_exit(self, timeout: float) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=2)
        return rc

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}{path}"

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._reader.join(timeout=5)       # the pipe's end arrives once the process is gone; then close it
        if self.proc.stdout:
            self.proc.stdout.close()



def chat_body(content: str, **kw) -> dict:
    body = {"model": "x", "messages": [{"role": "user", "content": content}], "temperature": 0}
    body.update(kw)
    return body


def sse_events(resp) -> list:
    """Parse an httpx streaming response into decoded JSON frames (and the final '[DONE]')."""
    out = []
    for line in resp.iter_lines():
        if not line.startswith("data: "):
            continue
        payload = line[len("data: "):]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out
