"""vLLM-shaped log output: ``(APIServer pid=27770) INFO 12-06 19:03:34 [entry.py:140] message``.

vLLM's logger format (vllm/logger.py: ``%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s`` with
``%m-%d %H:%M:%S``) behind the process-name prefix its multiprocessing adds (``APIServer``, ``EngineCore``,
``Worker``, ``Worker_TP0``, a headless rank's ``MainProcess``); uvicorn's own lines (``INFO:     Started server
process [27770]``) and the access lines carry no prefix (tp2-rank0.log, tp1-boot.log). The emulator is one
process: every prefix shows its own pid. Lines are written whole (one lock) and flushed one by one.
"""
from __future__ import annotations

import os
import time
from typing import TextIO

from sparkctl.sim.logfmt import EngineLog

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error"}


class VllmLog(EngineLog):
    """The emulator's log in vLLM's format; an `EngineLog` for the code both dialects share (the scheduler, whose
    SGLang batch lines are off under vLLM: ``Scheduler.batch_lines``)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream, None)
        self.pid = os.getpid()

    def line(self, proc: str, source: str, msg: str, level: str = "INFO") -> None:
        """``(proc pid=N) LEVEL mm-dd HH:MM:SS [source] msg``; `source` is vLLM's ``file.py:line``."""
        stamp = time.strftime("%m-%d %H:%M:%S", time.localtime())
        self._write(f"({proc} pid={self.pid}) {level} {stamp} [{source}] {msg}")

    def raw(self, text: str) -> None:
        """A line without vLLM's prefix (uvicorn, Python's own tracebacks)."""
        self._write(text)

    def access(self, client: str, method: str, path: str, status: int) -> None:
        """uvicorn's access line (tp2-rank0.log: ``INFO:     127.0.0.1:59308 - "GET /health HTTP/1.1" 200 OK``)."""
        self.raw(f'INFO:     {client} - "{method} {path} HTTP/1.1" {status} {_REASONS.get(status, "")}'.rstrip())
