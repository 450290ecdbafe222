"""An interrupt at any line of the router's start: no router of the cluster outlives the replicated `up` it cut.

The router's start is an effect followed by its record (`run_router_start`: fork the router, wait until it is
live, write it into replicated.json): Ctrl-C landing in between once left a router running that no record named,
holding the cluster's router port (the next `up` refused: port in use). Generated over the window, with
`testrig.linetrap` (a trace function raises `Interrupted` right before the line, as CPython delivers a signal
handler's exception): every line of `run_router_start` and of `RouterProcess.start`, the first pass of each line
of its wait until live, and the lines of `Popen._execute_child` after the fork. Afterwards the `up` raised it, and
what runs is what the record says: no router writes to the ledger's router log, or the one the record names (an
interrupt after the record was written), never one unrecorded and never a record of one that is gone; the next
`up` converges. The replicas stay up between
points (a replicated record interrupted after its replicas booted keeps them), so each point costs a router start.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from testrig.embedded import write_embedded_inventory, write_replicated_profile
from testrig.linetrap import LineTrap, Target, source_line
from testrig.testenv import need_module

need_module("sglang_router", "the router extra (sglang-router) is not installed")
FAST = {"boot_s": 0.3, "decode_tps": 2000, "ttft_base_s": 0.002}
EXECUTE_CHILD = subprocess.Popen._execute_child  # type: ignore[attr-defined]


def _trap(at: tuple[str, int] | None = None) -> LineTrap:
    from sparkctl.deploy import replica_steps
    from sparkctl.router.process import RouterProcess
    return LineTrap([Target.code(replica_steps.run_router_start.__code__),
                     Target.code(RouterProcess.start.__func__.__code__),        # type: ignore[attr-defined]
                     Target.code(RouterProcess.wait_live.__code__),
                     Target.code(EXECUTE_CHILD.__code__)], at,
                    anchor=Target.code(replica_steps.run_router_start.__code__))


def _window(trail: list[str]) -> list[tuple[str, int]]:
    """From the router's fork to the end of `run_router_start`: each event whose line was not seen before in the
    window (the wait-until-live loop once), plus every event of the step itself after the start returned."""
    fork = f"_execute_child:{source_line(EXECUTE_CHILD, '_fork_exec(')}"
    first = max(i for i, w in enumerate(trail) if w == fork) + 1      # after the fork call (the second event)
    points = []
    for i in range(first, len(trail)):
        nth = trail[:i].count(trail[i])
        if nth == trail[:first].count(trail[i]) or trail[i].startswith("run_router_start:"):
            points.append((trail[i], nth))
    return points


def test_an_interrupt_at_every_line_of_the_router_start_leaves_no_router(tmp_path, monkeypatch, state_dir):
    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy.replicated import ReplicatedDeployer
    from sparkctl.errors import Interrupted
    from sparkctl.router.launch import logged_routers, stop_router
    from sparkctl.state.replicated import Record
    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    inv = load_inventory(write_embedded_inventory(tmp_path / "inventory.yml", FAST, nodes=2))
    profile = load_profile(str(write_replicated_profile(tmp_path / "rep.yml", 16, warmup_requests=0)))
    d = ReplicatedDeployer(inv)
    log = d.ledger.root / "logs" / "router.log"
    try:
        count = _trap()
        with count.armed():
            assert d.up(profile).outcome == "deployed"
        points = _window(count.trail)
        assert len(points) >= 15, count.trail
        assert {where.split(":")[0] for where, _ in points} >= {"_execute_child", "start", "wait_live",
                                                                   "run_router_start"}
        missed = []
        for at in points:
            rec = Record.load(d.ledger.root)         # the router alone goes: the replicas stay up and unchanged
            stop_router(inv, rec.router_entry(), log=log)
            rec.doc.router = None
            rec.save()
            trap = _trap(at)
            with pytest.raises(Interrupted), trap.armed():
                d.up(profile)
            running = [pid for pid, _ in logged_routers(log)]
            named = (Record.load(d.ledger.root).router_entry() or {}).get("pid")
            if running != ([named] if named else []):       # one router at most, and it is the one recorded
                missed.append((trap.where, running, named))
        assert not missed, f"interrupted at these lines, what runs is not what is recorded: {missed}"
        d.up(profile)                                    # and the next `up` converges
        assert d.status().healthy
    finally:
        d.down()
