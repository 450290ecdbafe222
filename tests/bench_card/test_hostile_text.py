"""One hostile piece of text from an endpoint is bounded in every output (sparkctl/untrusted.py `excerpt`, applied
where an endpoint error is made: sglang/responses.py): a 100 kB chunk-size line, a 100 kB header, a 100 kB error
body full of terminal escapes, on every endpoint the bench reads -> stderr, the card (report.md) and the ledger's
report.json stay small, and no raw escape reaches any of them."""
from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest

from tests.bench_card.test_hostile import ENDPOINTS, FLAGS, WORKLOAD, Hostile, hostile  # noqa: F401 (fixture)

BIG = 100_000
POISON = "\x1b[2J\x1b]0;owned\x07\u202e"


def _hostile_chunk_line(self: Hostile, ep: str) -> None:
    self.send_response(200)
    self.send_header("Content-Type", "text/event-stream" if ep == "chat-stream" else "application/json")
    self.send_header("Transfer-Encoding", "chunked")
    self.end_headers()
    try:
        self.wfile.write(b"f" * BIG + b"\r\n")          # a chunk-size line of 100 kB
        self.wfile.flush()
    except OSError:
        pass
    self.close_connection = True


def _hostile_header(self: Hostile, ep: str) -> None:
    try:
        self._send(200, b"{}", extra={"X-Huge": "h" * BIG})
    except OSError:             # the client stopped reading at its bound
        self.close_connection = True


def _hostile_error(self: Hostile, ep: str) -> None:
    try:
        self._send(500, (json.dumps({"detail": (POISON + "e" * 64) * (BIG // 80)}) + POISON).encode("utf-8"))
    except OSError:
        self.close_connection = True


class TextHostile(Hostile):
    def handle(self) -> None:
        with contextlib.suppress(OSError):   # the client hung up at its bound: not the server's error to print
            super().handle()

    _chunk_line = _hostile_chunk_line
    _header = _hostile_header
    _error = _hostile_error


BEHAVIOURS = ("chunk_line", "header", "error")
CASES = [(b, ep) for b in BEHAVIOURS for ep in ENDPOINTS if ep != "health" or b == "header"]
STDERR_MAX, FILE_MAX = 16_000, 64_000       # a run's whole stderr; one card or report.json


@pytest.fixture()
def text_hostile(hostile, monkeypatch):  # noqa: F811 (the fixture imported above)
    import tests.bench_card.test_hostile as th
    monkeypatch.setattr(th, "Hostile", TextHostile)

    def start(plan: dict[str, str]) -> str:
        return hostile(plan)
    return start


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("behaviour", "endpoint"), CASES, ids=[f"{b}-{e}" for b, e in CASES])
def test_one_hostile_line_is_bounded_in_every_output(behaviour, endpoint, text_hostile, cli, state_dir, tmp_path,
                                                     monkeypatch: Any):
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    url = text_hostile({endpoint: behaviour})
    code, out, err = cli("bench", "--endpoint", url, *WORKLOAD, *FLAGS, "--out", str(tmp_path))
    assert code in (0, 4), err[-3000:]
    assert "Traceback" not in err
    outputs = {"stderr": err, "stdout": out}
    for name in ("report.md", "report.json"):
        if (tmp_path / name).exists():
            outputs[name] = (tmp_path / name).read_text()
    for name, text in outputs.items():
        limit = STDERR_MAX if name in ("stderr", "stdout") else FILE_MAX
        assert len(text) < limit, f"{behaviour} x {endpoint}: {name} is {len(text):,} characters"
        assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text, f"{name}: a raw escape"
