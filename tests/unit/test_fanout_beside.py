"""`fanout.beside`: two independent reads as one round trip (preflight's node facts with the cross-node facts and the
needed paths, settle's look for engines with its secret sweep)."""
from __future__ import annotations

import threading

import pytest

from sparkctl.errors import NodeError
from sparkctl.nodes.fanout import beside


def test_both_run_at_the_same_time_and_the_main_value_comes_back():
    """Each call waits for the other to have started: only calls that run at once both finish (a bounded wait, so
    calls made one after the other fail instead of hanging)."""
    started = {"main": threading.Event(), "side": threading.Event()}
    seen: list[str] = []

    def call(me: str, other: str) -> str:
        started[me].set()
        assert started[other].wait(10), f"{other} did not run while {me} did"
        seen.append(me)
        return me
    assert beside(lambda: call("main", "side"), lambda: call("side", "main")) == "main"
    assert sorted(seen) == ["main", "side"]


def test_an_error_is_raised_after_both_finished_the_main_ones_first():
    done = threading.Event()

    def side_slow() -> None:
        done.wait(0.2)
        done.set()

    def fails(what: str):
        def raise_it() -> None:
            raise NodeError(what)
        return raise_it
    with pytest.raises(NodeError, match="main"):
        beside(fails("main"), side_slow)
    assert done.is_set()                                  # the side call ran to its end first
    with pytest.raises(NodeError, match="main"):
        beside(fails("main"), fails("side"))
    with pytest.raises(NodeError, match="side"):
        beside(lambda: 1, fails("side"))
