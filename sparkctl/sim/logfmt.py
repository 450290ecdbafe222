"""SGLang-shaped log output: ``[YYYY-mm-dd HH:MM:SS TP0] message`` lines, flushed one by one.

Engine (scheduler/model) lines carry the ``TPn`` tag when SGLang would print it (tp_size > 1, or
any TP0 line of the 0.5.3-era dialect); launcher/HTTP lines (Uvicorn, ``fired up``, the dummy
health server) have only the timestamp, as in the captures. Raw lines (Gloo, NCCL, tracebacks)
are written as-is. One lock keeps lines from different threads whole.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import TextIO


class EngineLog:
    def __init__(self, stream: TextIO | None = None, tp_tag: str | None = "TP0") -> None:
        self._stream = stream or sys.stdout
        self._lock = threading.RLock()   # re-entrant: a signal handler may log while main thread writes
        self.tp_tag = tp_tag

    @staticmethod
    def stamp() -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())

    def _write(self, text: str) -> None:
        with self._lock:
            try:
                self._stream.write(text if text.endswith("\n") else text + "\n")
                self._stream.flush()
            except (ValueError, OSError):
                pass  # stream closed during shutdown

    def tp(self, msg: str) -> None:
        """An engine line: ``[ts TP0] msg`` (or ``[ts] msg`` when SGLang prints no TP tag)."""
        tag = f" {self.tp_tag}" if self.tp_tag else ""
        self._write(f"[{self.stamp()}{tag}] {msg}")

    def main(self, msg: str) -> None:
        """A launcher/HTTP line: ``[ts] msg``."""
        self._write(f"[{self.stamp()}] {msg}")

    def raw(self, text: str) -> None:
        """Lines printed without SGLang's prefix (Gloo, NCCL, C++ warnings, tracebacks)."""
        self._write(text)

    def access(self, client: str, method: str, path: str, status: int) -> None:
        reason = _REASONS.get(status, "")
        self.main(f'INFO:     {client} - "{method} {path} HTTP/1.1" {status} {reason}'.rstrip())


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 500: "Internal Server Error", 503: "Service Unavailable"}


def c10d_stamp() -> str:
    """The glog-style stamp c10d/ProcessGroupNCCL prints: ``E223 11:14:34.991762039``-like (MDD)."""
    t = time.time()
    lt = time.localtime(t)
    nanos = int((t % 1) * 1e9)
    return f"{lt.tm_mon}{lt.tm_mday:02d} {time.strftime('%H:%M:%S', lt)}.{nanos:09d}"
