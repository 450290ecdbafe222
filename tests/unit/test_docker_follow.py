"""docker_follow.LogStream hands out the same text at the same offsets as a read of the whole log
(`docker_logs.parse_log_lines` of `docker logs --timestamps`), whatever the lines: Hypothesis over logs with and
without timestamps, secrets, multi-byte text and empty lines. The node side (the stream, its end) is proved against
a real sshd and dockerd in tests/cluster/test_ssh_docker.py."""
from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.nodes.docker_follow import FOLLOW_SCRIPT, LogStream
from sparkctl.nodes.docker_logs import parse_log_lines
from sparkctl.redaction import redact

SECRET = "sk-follow-SECRET"


class _Lines:
    """A stand-in for the connector's `follow`: hands `lines` to on_line, then ends as the command would."""

    def __init__(self, lines: list[str], rc: int | None = 0) -> None:
        self.lines, self.rc, self.argv = lines, rc, None

    def follow(self, argv, on_line, *, stop: threading.Event, timeout: float):
        self.argv = argv
        for ln in self.lines:
            on_line(ln)
        return self.rc


stamp = st.builds(lambda s, ns: f"2026-12-07T09:{s // 60:02d}:{s % 60:02d}.{ns:09d}Z",
                  st.integers(0, 3599), st.integers(0, 999_999_999))
text = st.text(st.characters(blacklist_categories=("Cs", "Co"), blacklist_characters="\n\r"), max_size=40)
line = st.one_of(st.builds(lambda ts, t: f"{ts} {t}", stamp, text),
                 st.builds(lambda ts, t: f"{ts} {t} {SECRET} {t}", stamp, text),
                 text, st.just(""))


def _stream(lines: list[str], rc: int | None = 0) -> LogStream:
    s = LogStream(_Lines(lines, rc), "c" * 64, 0, 60, lambda t: redact(t, {SECRET}))  # type: ignore[arg-type]
    s._thread.join(5)
    return s


@settings(max_examples=300, deadline=None)
@given(st.lists(line, max_size=30), st.integers(0, 400))
def test_streamed_text_and_offsets_match_a_whole_read(lines: list[str], cut: int) -> None:
    whole = "".join(e.text for e in parse_log_lines(redact("\n".join(lines) + "\n", {SECRET})))
    s = _stream(lines)
    got, end = s.read(0)
    assert got == whole and end == len(whole.encode())
    cut = min(cut, end)
    assert s.read(cut) == (whole.encode()[cut:].decode("utf-8", "replace"), end)
    assert s.read(end) == ("", end) and SECRET not in got
    assert not s.live and s.outcome == "ended (exit 0)"


def test_the_node_script_takes_values_as_arguments_only() -> None:
    fake = _Lines([])
    LogStream(fake, "abc123", 1_765_000_000_123_456_789, 90.4, str)._thread.join(5)  # type: ignore[arg-type]
    assert fake.argv == ["sh", "-c", FOLLOW_SCRIPT, "sh", "abc123", "90", "1765000000.123456789"]
    assert "$1" in FOLLOW_SCRIPT and "abc123" not in FOLLOW_SCRIPT


def test_a_stream_that_fails_or_is_stopped_says_so_and_is_no_longer_live() -> None:
    class _Broken(_Lines):
        def follow(self, argv, on_line, *, stop, timeout):
            on_line("2026-12-07T09:00:00.000000001Z first")
            raise OSError("link down")
    s = LogStream(_Broken([]), "d" * 64, 0, 60, str)  # type: ignore[arg-type]
    s._thread.join(5)
    assert not s.live and s.outcome.startswith("failed: ") and "link down" in s.outcome
    assert s.read(0) == ("first\n", 6)
    stopped = _stream([], rc=None)
    assert not stopped.live and stopped.outcome == "stopped"


def test_a_stream_past_its_memory_cap_ends_and_the_runtime_reads_the_node(monkeypatch) -> None:
    from sparkctl.nodes import docker_follow
    monkeypatch.setattr(docker_follow, "MAX_TEXT_BYTES", 1000)
    stops: list[bool] = []

    class _Endless(_Lines):
        def follow(self, argv, on_line, *, stop, timeout):
            for i in range(10_000):
                if stop.is_set():
                    stops.append(True)
                    return None
                on_line(f"2026-12-07T09:00:00.{i:09d}Z batch line {i}")
            return 0
    s = LogStream(_Endless([]), "e" * 64, 0, 60, str)  # type: ignore[arg-type]
    s._thread.join(5)
    assert stops and not s.live and s.outcome == "stopped at 0 MiB of log"
    assert 1000 < len(s.read(0)[0]) < 1100
