"""The replicated deployment's record (`replicated.json`) is read only through its model: generated damage to a valid
record (a field replaced by any JSON value, a key deleted, a path-like replica name, a guessed router PID) makes
`status` and `down` either work or raise a sparkctl error naming what is wrong, never an internal error, never a
ledger outside the state root, never a signal to a process that is not a router sparkctl started."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testrig.embedded import write_embedded_inventory

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
                    | st.text(max_size=12)
                    | st.sampled_from(["..", "../../etc", "/", "-rf", "x.r1", "default.r0", "container", "process"]),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=3), max_leaves=6)


def valid_record() -> dict:
    return {"profile": "rep", "endpoint": "http://127.0.0.1:30080", "status": "active",
            "started": "2026-12-02T00:00:00Z", "handed_off": None,
            "replicas": [{"index": i, "url": f"http://127.0.0.{i + 1}:30000", "nodes": [n],
                          "cluster": f"default.r{i}"} for i, n in enumerate(["spark-a", "spark-b"])],
            "router": {"pid": os.getpid(), "ticks": 1, "log": "/nonexistent/router.log",
                       "url": "http://127.0.0.1:1", "metrics_url": "http://127.0.0.1:1/metrics"},
            "journal": [{"step": "hand-off", "phase": "ok", "at": "2026-12-02T00:00:01Z", "what": "x",
                         "replica": None, "detail": None}]}


PATHS = [("profile",), ("endpoint",), ("status",), ("replicas",), ("replicas", 0), ("replicas", 0, "index"),
         ("replicas", 0, "url"), ("replicas", 0, "nodes"), ("replicas", 1, "cluster"), ("router",),
         ("router", "pid"), ("router", "ticks"), ("router", "log"), ("router", "kind"), ("router", "runtime"),
         ("router", "node"), ("router", "container"), ("router", "container_id"), ("journal",),
         ("journal", 0, "replica"), ("journal", 0, "step")]


def container_router() -> dict:
    return {"kind": "container", "node": "spark-a", "container": "sparkctl-default-router",
            "container_id": "f" * 64, "image": "sparkctl-test-engine:1", "url": "http://127.0.0.1:1",
            "metrics_url": "http://127.0.0.1:1/metrics"}


@st.composite
def damaged(draw) -> dict:
    rec = valid_record()
    if draw(st.booleans()):
        rec["router"] = container_router()
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent = rec
        try:
            for key in path[:-1]:
                parent = parent[key]
        except (KeyError, IndexError, TypeError):
            continue
        if not isinstance(parent, (dict, list)):
            continue
        if isinstance(parent, dict) and draw(st.booleans()) and draw(st.booleans()):
            parent.pop(path[-1], None)
        elif isinstance(parent, dict) or (isinstance(path[-1], int) and path[-1] < len(parent)):
            parent[path[-1]] = draw(JSON)
    return rec


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    root = tmp_path_factory.mktemp("replicated-record")
    return write_embedded_inventory(root / "inventory.yml", {"boot_s": 0.3}, nodes=2), root


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damaged())
def test_a_damaged_record_is_read_or_refused_by_its_model(embedded, monkeypatch, record):
    from sparkctl.config.inventory import load_inventory
    from sparkctl.deploy.replicated import ReplicatedDeployer
    from sparkctl.errors import SparkctlError
    from sparkctl.state.ledger import Ledger
    from sparkctl.state.replicated import RECORD

    inv_path, root = embedded
    state = root / "state"
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(state))
    inv = load_inventory(inv_path)
    ledger_root = Ledger.for_cluster(inv.cluster.name).root
    ledger_root.mkdir(parents=True, exist_ok=True)
    (ledger_root / RECORD).write_text(json.dumps(record))
    outside_before = set(root.parent.iterdir())
    signalled: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: signalled.append((pid, sig)))
    monkeypatch.setattr(os, "kill", lambda pid, sig: signalled.append((pid, sig)))
    d = ReplicatedDeployer(inv)
    for call in (d.status, d.down):
        try:
            out = call()
        except SparkctlError as exc:
            text = exc.render()
            assert "replicated" in text or "no node named" in text or "router" in text, text
        else:
            assert out.as_json()          # a typed result
    # the record named our own PID as the router with a wrong start time: never signalled
    assert signalled == []
    assert set(root.parent.iterdir()) == outside_before
    for p in state.rglob("*"):
        assert Path(os.path.realpath(p)).is_relative_to(os.path.realpath(state)), p
