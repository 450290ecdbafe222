"""SIGINT, SIGTERM and SIGHUP take one path in the CLI (`sparkctl/cli/signals.py`): the same handler raises the same
`Interrupted` for each, and only the name and the exit code differ. The signal matrices rely on it
(`testrig.controller.dealt_signals` deals one of the three to each boundary instead of all three), so it is checked
here for each signal, in a process of its own (a handler that exits at once on a second signal must not run in the
test process)."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from sparkctl.cli import signals
from testrig.controller import HANDLED_SIGNALS, dealt_signals

PROBE = r"""
import json, os, signal, sys
from sparkctl.cli import signals
from sparkctl.errors import Interrupted, interrupt_name
sig = signal.Signals[sys.argv[1]]
before = signal.getsignal(sig)
caught = None
with signals.installed():
    handler = signal.getsignal(sig)
    try:
        os.kill(os.getpid(), sig)
    except Interrupted as e:
        caught = e
print(json.dumps({"type": type(caught).__name__, "signum": caught.signum, "name": interrupt_name(caught),
                  "exit": signals.exit_code(), "said": signals.name(),
                  "handler": handler.__qualname__, "restored": signal.getsignal(sig) == before}))
"""


@pytest.mark.parametrize("name", HANDLED_SIGNALS)
def test_each_handled_signal_takes_the_one_path_and_differs_only_in_name_and_exit_code(name):
    import json
    sig = signal.Signals[f"SIG{name}"]
    r = subprocess.run([sys.executable, "-c", PROBE, sig.name], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got == {"type": "Interrupted", "signum": int(sig), "name": sig.name, "exit": 128 + int(sig),
                   "said": sig.name, "handler": "_handler", "restored": True}
    assert f"sparkctl: {sig.name}: stopping" in r.stderr         # said at once, before any cleanup


def test_the_handled_signals_are_the_ones_the_matrices_deal():
    assert {signal.Signals[f"SIG{s}"] for s in HANDLED_SIGNALS} == set(signals.HANDLED)


def test_dealt_signals_gives_every_point_one_signal_and_every_signal_its_share():
    points = [f"up:step{k}:{w}" for k in range(7) for w in ("before", "after")]
    dealt = dealt_signals(points)
    assert [p for p, _ in dealt] == points
    counts = {s: sum(1 for _, x in dealt if x == s) for s in HANDLED_SIGNALS}
    assert set(counts) == set(HANDLED_SIGNALS) and max(counts.values()) - min(counts.values()) <= 1
    # the two sides of a boundary never meet the same signal
    assert all(dealt[2 * k][1] != dealt[2 * k + 1][1] for k in range(7))
