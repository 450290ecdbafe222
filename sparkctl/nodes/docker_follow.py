"""A container's log streamed over one SSH channel while a boot follows it (`docker logs --follow`), instead of a
`docker logs`, `inspect` and `top` per node at every poll.

Why: each poll of the docker runtime is an SSH session and two or three docker CLI runs on the node. Measured on the
two-node test cluster (probe of `read_log` + `liveness` on both nodes, 20 rounds): 150-290 ms of the machine's CPU per
round, i.e. 5-15 % of a 2-core node at one poll a second, taken from the engine while it boots on those cores; the
same two containers started by hand pay none of it. A stream costs the node one `docker logs --follow` that writes
each line once.

The script on the node (`FOLLOW_SCRIPT`) runs `docker logs --follow --timestamps` (stderr into stdout, in the order
Docker stored them, as `DockerRuntime` reads) under `timeout`, and ends it when its stdin reaches EOF: the SSH
channel closed, because the boot ended (`LogStream.stop`) or the sparkctl that opened it died (the connection goes
with the process). So nothing of it outlives the boot, and `timeout` bounds it when neither happens (a link that
neither delivers nor drops). The stream ends by itself when the container stops (`docker logs --follow` returns).

`LogStream` keeps the text as `DockerRuntime.read_log` hands it out (each entry's line without its timestamp; a
line without one joined to the entry before, as `docker_logs.parse_log_lines` does), redacted line by line with the
runtime's secrets, so a byte offset means the same in the stream and in a read of the whole log: once the stream
has ended, for any reason, the runtime reads as before from the same offset. A stream holds at most
`MAX_TEXT_BYTES` of log (a bench's rank watch may follow for hours); past it, it ends itself and reads go to the
node.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sparkctl.nodes.docker_logs import _since_arg, split_line
from sparkctl.nodes.ssh import SSHConnector

log = logging.getLogger("sparkctl.nodes.docker")

# $1 container, $2 bound in seconds, $3 --since (empty: the whole log). fd 3 is the channel's stdin: a background
# job's own stdin is /dev/null (POSIX), so the watcher reads it through fd 3 and kills the follower at its EOF.
FOLLOW_SCRIPT = r"""exec 3<&0
if [ -n "$3" ]; then
  timeout "$2" docker logs --follow --timestamps --since "$3" "$1" 2>&1 3<&- &
else
  timeout "$2" docker logs --follow --timestamps "$1" 2>&1 3<&- &
fi
p=$!
( cat <&3 >/dev/null 2>&1; kill "$p" 2>/dev/null ) >/dev/null 2>&1 &
exec 3<&-
wait "$p"
"""

QUIET_CHECK_S = 5.0    # a streaming rank whose log was quiet this long is asked `inspect` + `top` (stopped? paused?)
MAX_TEXT_BYTES = 64 << 20   # a stream holds at most this much of a log in memory; past it, reads go to the node


class LogStream:
    """One container's log, streamed from `since_ns` (0: its whole log) for at most `bound_s` on a thread of its
    own. `read(offset)` is `read_log`'s answer while `live`; `stop()` closes the channel and joins the thread."""

    def __init__(self, ssh: SSHConnector, container_id: str, since_ns: int, bound_s: float,
                 redact: Callable[[str], str]) -> None:
        self.container_id = container_id
        self._ssh = ssh
        self._argv = ["sh", "-c", FOLLOW_SCRIPT, "sh", container_id, str(max(1, int(bound_s))),
                      _since_arg(since_ns) if since_ns else ""]
        self._bound_s = bound_s
        self._redact = redact
        self._text = bytearray()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ended = threading.Event()
        self.outcome = "streaming"           # then: "ended (exit N)", "stopped", "failed: ..."
        self.last_line_at = time.monotonic()
        self.last_checked_at = time.monotonic()
        self.last_check_alive = True         # the runtime's last `inspect` + `top` of this container said alive
        self._thread = threading.Thread(target=self._run, name=f"log-{container_id[:12]}", daemon=True)
        self._thread.start()

    @property
    def live(self) -> bool:
        """Still streaming: everything the container wrote is on its way, and the container has not stopped."""
        return not self._ended.is_set()

    def read(self, offset: int) -> tuple[str, int]:
        with self._lock:
            data = bytes(self._text[offset:]) if offset < len(self._text) else b""
            return data.decode("utf-8", "replace"), max(offset, len(self._text))

    def stop(self, *, wait: bool = True) -> None:
        """Close the channel (the node's `docker logs` ends at its stdin's EOF); with `wait`, join the thread (it
        sees the stop within one 20 ms select of the connector's loop; 10 s bound for a wedged transport)."""
        self._stop.set()
        if wait:
            self._thread.join(timeout=10.0)

    def _line(self, raw: str) -> None:
        ts, text = split_line(raw)
        with self._lock:
            if ts is None and not (raw and self._text):   # as parse_log_lines: no entry for it to join, or empty
                return
        data = (self._redact(text) + "\n").encode()
        with self._lock:
            self._text += data
            full = len(self._text) > MAX_TEXT_BYTES
        self.last_line_at = time.monotonic()
        if full:       # a log this long (hours of a bench's batch lines): no longer held here; the runtime reads it
            self._stop.set()

    def _run(self) -> None:
        try:
            rc = self._ssh.follow(self._argv, self._line, stop=self._stop, timeout=self._bound_s + 5.0)
            self.outcome = ("stopped" if rc is None else f"ended (exit {rc})") + \
                (f" at {MAX_TEXT_BYTES >> 20} MiB of log" if len(self._text) > MAX_TEXT_BYTES else "")
        except Exception as exc:  # noqa: BLE001 - the runtime falls back to reading the log per poll
            self.outcome = f"failed: {exc}"
        finally:
            log.debug("log stream of %s %s", self.container_id[:12], self.outcome)
            self._ended.set()
