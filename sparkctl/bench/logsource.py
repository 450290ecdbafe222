"""Where the bench reads scheduler lines: a rank's log through its runtime, or a captured log file.

The bench marks the log before a measurement and reads what was appended after it, so accept
len/rate, the gen-throughput gauge and ``#running-req`` come from the lines printed *during* that
measurement (``window``). A captured file that does not grow (``--log`` on a saved capture) has no
such window: ``whole()`` analyses all of it, and the report says so.

Example::

    src = FileLog(Path("rank0.log"))
    m = src.mark(); ...run requests...; lines = src.since(m)
    scheduler_summary(lines)["decode"]["accept_len"]     # (min, max) during active decode
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from sparkctl.jsontypes import JSONObject
from sparkctl.nodes.handles import Handle
from sparkctl.sglang.bootwatch import LogFollower
from sparkctl.sglang.logparse import EventKind, decode_stats, parse_line

if TYPE_CHECKING:
    from sparkctl.nodes.runtime import Runtime

__all__ = ["LogSource", "FileLog", "RuntimeLog", "scheduler_summary", "prefill_events", "capacity_from_log",
           "concurrency_cap_from_log"]

Reader = Callable[[int], "tuple[str, int]"]


class LogSource:
    """Buffered, offset-following reader over ``reader(offset) -> (complete-lines text, next offset)``."""

    def __init__(self, reader: Reader, label: str, *, settle_s: float = 0.3) -> None:
        self._reader = reader
        self.label = label
        self.settle_s = settle_s
        self._offset = 0
        self._lines: list[str] = []

    def _pull(self) -> None:
        text, self._offset = self._reader(self._offset)
        if text:
            self._lines.extend(text.splitlines())

    def mark(self) -> int:
        """Read everything printed so far; the returned mark is the line count."""
        self._pull()
        return len(self._lines)

    def since(self, mark: int, *, settle: bool = True) -> list[str]:
        """Lines appended after ``mark``. Waits briefly (``settle_s``) for the engine to flush its last lines."""
        if settle and self.settle_s:
            time.sleep(self.settle_s)
        self._pull()
        return self._lines[mark:]

    def whole(self) -> list[str]:
        self._pull()
        return list(self._lines)


class FileLog(LogSource):
    """A log file (a capture, or a file an engine is still writing): only complete lines are read."""

    def __init__(self, path: Path, *, settle_s: float = 0.3) -> None:
        self.path = Path(path)

        def read(offset: int) -> tuple[str, int]:
            with open(self.path, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
            cut = data.rfind(b"\n") + 1
            return data[:cut].decode("utf-8", "replace"), offset + cut
        super().__init__(read, f"captured log {self.path}", settle_s=settle_s)

    def whole(self) -> list[str]:
        """Every line of the file, a last line without its newline included."""
        return self.path.read_text(encoding="utf-8", errors="replace").splitlines()


class RuntimeLog(LogSource):
    """Rank N's engine log of a deployment, through its runtime's ``read_log(handle, offset)``."""

    def __init__(self, runtime: Runtime, handle: Handle, *, settle_s: float = 0.5) -> None:
        super().__init__(lambda off: runtime.read_log(handle, off),
                         f"rank {handle.rank} log of deployment {handle.deployment} [{handle.node}]",
                         settle_s=settle_s)


def prefill_events(lines: Iterable[str]) -> list[JSONObject]:
    """Fields of every ``Prefill batch`` line (new/cached tokens, input throughput gauge...)."""
    out = []
    for line in lines:
        ev = parse_line(line)
        if ev is not None and ev.kind is EventKind.PREFILL_BATCH:
            out.append({k: v for k, v in ev.fields.items() if k != "raw"})
    return out


def scheduler_summary(lines: Iterable[str]) -> JSONObject:
    """Decode stats (accept len/rate ranges during active decode, gauge peak, max #running-req) and
    prefill totals for a window of lines."""
    lines = list(lines)
    pre = prefill_events(lines)
    return {"decode": decode_stats(lines), "prefill_batches": len(pre),
            "prefill_new_tokens": sum(int(p.get("new_token") or 0) for p in pre),
            "prefill_cached_tokens": sum(int(p.get("cached_token") or 0) for p in pre),
            "prefill_max_running_req": max((int(p["running_req"]) for p in pre
                                            if isinstance(p.get("running_req"), int)), default=None)}


def capacity_from_log(lines: Iterable[str]) -> JSONObject:
    """Resolved capacity as the engine printed it at boot (``max_total_num_tokens=...`` line, the mamba
    cap warning) and the server_args it started with."""
    f = LogFollower()
    for line in lines:
        f.feed(line)
    out: JSONObject = dict(f.capacity or {})
    if f.mamba_cap is not None:
        out["mamba_capped_max_running_requests"] = f.mamba_cap
    if f.server_args:
        out["server_args"] = {k: f.server_args.get(k) for k in ("speculative_algorithm", "speculative_num_draft_tokens",
                                                                "max_running_requests", "context_length", "tp_size")
                              if k in f.server_args}
    return out


def concurrency_cap_from_log(lines: Iterable[str]) -> JSONObject | None:
    """The engine's own reason for capping max_running_requests, as it printed it at boot, and the setting that
    would change it; None when the log printed no cap.

    SGLang (0.5.23 ``kv_cache_configurator``) warns ``max_running_requests is capped to N by the mamba state cache
    (max_mamba_cache_size=M, S state slots per request)`` on hybrid models; ``--max-mamba-cache-size`` raises
    the cap (M // S concurrent requests), as does a larger ``--mamba-full-memory-ratio``.
    """
    for line in lines:
        ev = parse_line(line)
        if ev is None or ev.kind is not EventKind.MAMBA_CAP_WARNING:
            continue
        f = ev.fields
        cap, size = f.get("max_running_requests"), f.get("max_mamba_cache_size")
        slots = f.get("state_slots_per_request")
        fix = "raise --max-mamba-cache-size"
        if isinstance(size, int) and isinstance(slots, int) and slots > 0:
            fix += (f" (now {size}: {size // slots} request(s) at {slots} state slots each; 2 concurrent requests "
                    f"need at least {2 * slots})")
        fix += " or --mamba-full-memory-ratio (more memory for the mamba state cache)"
        return {"max_running_requests": cap, "reason": ev.message, "source": "engine log at boot",
                "setting": "--max-mamba-cache-size", "fix": fix}
    return None
