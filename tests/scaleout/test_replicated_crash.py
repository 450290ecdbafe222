"""A controller SIGKILLed at every boundary of a replicated `up` (a rolling update from p1 to p2; points from
`deploy.steps.REPLICATED_STEPS`): the router keeps serving, and the next `up` converges (every replica on p2, in the
router, healthy)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sparkctl.deploy.steps import CRASH_ENV, replicated_crash_points
from testrig.embedded import write_replicated_profile
from testrig.testenv import need_module

need_module("sglang_router", "the router extra (sglang-router) is not installed")
REPO = Path(__file__).resolve().parents[2]
FAST = {"boot_s": 0.3, "decode_tps": 4000, "ttft_base_s": 0.002}
# Every boundary of the replicated steps, and the lifecycle's own boundaries inside a replica's `up` (the replica's
# boot and hand-off: a kill -9 there is the crash matrix's point, in the middle of a rolling update).
POINTS = list(replicated_crash_points()) + [("up", "boot", "after"), ("up", "hand-off", "before")]


def _profile(path: Path, mrr: int) -> Path:
    return write_replicated_profile(path, mrr, drain_timeout_s=30, warmup_requests=0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from sparkctl.config.inventory import load_inventory
    from sparkctl.deploy.replicated import ReplicatedDeployer
    from testrig.embedded import write_embedded_inventory
    tmp = tmp_path_factory.mktemp("crash")
    env = {"SPARKCTL_STATE_DIR": str(tmp / "state")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    inv_path = write_embedded_inventory(tmp / "inventory.yml", FAST, nodes=2)
    d = ReplicatedDeployer(load_inventory(inv_path))
    try:
        yield d, inv_path, (_profile(tmp / "p1.yml", 16), _profile(tmp / "p2.yml", 24)), []
    finally:
        d.down()
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def _controller(inv: Path, profile: Path, crash: str) -> int:
    code = ("import sys; from sparkctl.config.inventory import load_inventory; "
            "from sparkctl.config.profile import load_profile; "
            "from sparkctl.deploy.replicated import ReplicatedDeployer; "
            "ReplicatedDeployer(load_inventory(sys.argv[1])).up(load_profile(sys.argv[2]))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCTL_SIM_")}
    env.update({CRASH_ENV: crash, "PYTHONPATH": str(REPO)})
    return subprocess.run([sys.executable, "-c", code, str(inv), str(profile)], env=env, cwd=str(REPO),
                          capture_output=True, timeout=120).returncode


def _assert_status_truthful(st, code: int, step: str, when: str) -> None:
    """After the kill, `status` says the `up` was interrupted (its controller gone) and is not healthy, up to the
    hand-off's own record write (killed after it, the deployment was handed off)."""
    if code == -9 and (step, when) != ("hand-off", "after"):
        assert (st.progress or "").startswith("interrupted: ") and not st.healthy, (step, when, st)


# settle.settle_replicated, as the next `up` runs it: killed with replica 0 out of the router and serving what
# it ran (its detach done, its own `up` done, its attach not yet), replica 0 goes back in first; killed inside
# replica 0's own `up` (its replica-up begun, never ended: its engines may be new and never verified), it is left
# to that `up`'s own settle.
SETTLED = {("replica-detach", "after"): [0], ("replica-up", "after"): [0], ("replica-attach", "before"): [0],
           ("replica-up", "before"): [], ("boot", "after"): [], ("replica-detach", "before"): []}


def _settled_by_last_up(d) -> list[int]:
    """The replicas the last `up`'s settle step put back into the router (from its journal)."""
    from sparkctl.state.replicated import Record
    journal = Record.load(d.ledger.root).doc.model_dump(mode="json")["journal"]
    start = max(i for i, e in enumerate(journal) if e["step"] == "settle" and e["phase"] == "intent")
    end = next(i for i in range(start, len(journal)) if journal[i]["step"] == "settle"
               and journal[i]["phase"] != "intent")
    return [e["replica"] for e in journal[start:end] if e["step"] == "replica-attach" and e["phase"] == "ok"]


@pytest.mark.parametrize("command,step,when", POINTS, ids=[":".join(p) for p in POINTS])
def test_sigkill_at_every_replicated_boundary(cluster, command, step, when):
    from sparkctl.config.profile import load_profile
    d, inv, profiles, current = cluster
    if not current:
        d.up(load_profile(str(profiles[0])))
        current.append(0)
    src = current[-1]
    dst, mrr = 1 - src, (16, 24)[1 - src]       # each point rolls to the other profile (no setup redeploy)
    code = _controller(inv, profiles[dst], f"{command}:{step}:{when}")
    if code != -9:
        assert step == "router-start", f"{step}:{when} never reached (exit {code})"   # the router already runs
    st = d.status()
    if st.router:
        assert st.router.live, st              # the router outlives its controller
    _assert_status_truthful(st, code, step, when)
    res = d.up(load_profile(str(profiles[dst])))
    assert res.endpoint
    current.append(dst)
    if (step, when) in SETTLED:        # the next up's settle step settled what the dead one left
        assert _settled_by_last_up(d) == SETTLED[step, when], (step, when)
    st = d.status()
    assert st.healthy and all(r.in_router and r.healthy for r in st.replicas), st
    for r in st.replicas:
        info = httpx.get(r.url + "/server_info", timeout=5, trust_env=False).json()
        assert info["max_running_requests"] == mrr, (step, when, r)


# A first `up` (nothing in the router: every replica's own `up` at once, in threads) has its own path through the
# same steps; every boundary it reaches is killed too (replica-detach: nothing to detach on a first up).
FIRST_UP = [p for p in replicated_crash_points() if p[1] != "replica-detach"]


@pytest.mark.parametrize("command,step,when", FIRST_UP, ids=[":".join(p) for p in FIRST_UP])
def test_sigkill_at_every_boundary_of_a_first_up(cluster, command, step, when):
    from sparkctl.config.profile import load_profile
    d, inv, profiles, current = cluster
    d.down()                                            # nothing runs: the next up is a first one
    code = _controller(inv, profiles[0], f"{command}:{step}:{when}")
    assert code == -9, f"{step}:{when} never reached on a first up (exit {code})"
    _assert_status_truthful(d.status(), code, step, when)
    if (step, when) == ("replica-up", "after"):         # killed as the first replica finished: both had started
        from sparkctl.state.replicated import Record
        started = {e["replica"] for e in Record.load(d.ledger.root).doc.model_dump(mode="json")["journal"][-6:]
                   if e["step"] == "replica-up" and e["phase"] == "intent"}
        assert started == {0, 1}, started
    res = d.up(load_profile(str(profiles[0])))         # converges from whatever the kill left
    assert res.endpoint and res.outcome in ("deployed", "unchanged")
    current[:] = [0]
    st = d.status()
    assert st.healthy and all(r.in_router and r.healthy for r in st.replicas), st
    for r in st.replicas:
        info = httpx.get(r.url + "/server_info", timeout=5, trust_env=False).json()
        assert info["max_running_requests"] == 16, (step, when, r)
