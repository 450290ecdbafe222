"""Every `bench --compare` boundary (`deploy.steps.COMPARE_STEPS`, before and after), each with one of SIGINT, SIGTERM
and SIGHUP dealt in turn (the three take one handler: `testrig.controller.dealt_signals`), each followed by `status`
(truthful) and the next command (converges, what ran before the comparison restored).
Its SIGKILL points are in tests/lifecycle/test_crash_matrix.py (`bench-compare:*`).

One embedded cluster on a short emulator boot is shared by the points of a worker (the converging `up` of one point
is the setup of the next, as in the crash matrix). Each point starts from d5 deployed, runs `bench --compare
dflash-off` (the cold gate only) signalled at its boundary, then checks:

- the signal is acted on within 2 s of the boundary (its "stopping" line), and the CLI exits 128 + signal;
- `status` exits 0 only when d5 (what ran before the comparison) is active and serves with its settings in force;
  while the comparison's arm is left active it exits 8 and names the unfinished comparison;
- the next command (`up --profile d5`, what a user runs) exits 0 and converges: d5 active and serving, no
  unfinished comparison, and a plain `rollback` would never go to the arm.
"""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from sparkctl.deploy.steps import COMPARE_COMMAND, COMPARE_STEPS, crash_points
from testrig.controller import HANDLED_SIGNALS, SignalRig, SignalTimes, dealt_signals, run_at_boundary

FAST = {"boot_s": 0.3, "decode_tps": 6000, "ttft_base_s": 0.01}
KEY = "sk-compare-signals-secret"
BENCH = ["bench", "--compare", "dflash-off", "--gates", "cold", "--warmup", "0", "--json"]
POINTS = dealt_signals([f"{c}:{s}:{w}" for c, s, w in crash_points() if c == COMPARE_COMMAND])
TIMES = SignalTimes("compare signals")


class CompareRig(SignalRig):
    def __init__(self, root: Path) -> None:
        super().__init__(root, FAST, prefix="cs", SPARKCTL_API_KEY=KEY)
        self.converged = False          # the last point ended with d5 active and healthy (checked by status)

    @property
    def ledger(self):
        from sparkctl.config.inventory import load_inventory
        from sparkctl.state.ledger import Ledger
        return Ledger(self.state / load_inventory(self.inv).cluster.name)

    def serves(self, endpoint: str | None, spec: str) -> bool:
        from sparkctl.sglang.client import SGLangAPIError, SGLangClient
        if not endpoint:
            return False
        try:
            with SGLangClient(endpoint, api_key=KEY, timeout=5) as c:
                return c.health() == 200 and c.server_info().get("speculative_algorithm") == spec
        except SGLangAPIError:
            return False


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    r = CompareRig(tmp_path_factory.mktemp("compare-signals"))
    try:
        yield r
    finally:
        r.stop_engines()
        if line := TIMES.summary():
            print("\n" + line)


@pytest.mark.parametrize("point,sig", POINTS, ids=[f"{p}:{s}" for p, s in POINTS])
def test_a_signal_at_every_compare_boundary(rig, point, sig):
    if not rig.converged:
        code, out, err = rig.run("up", "--profile", "d5", "--yes", "--json")
        assert code == 0, err[-3000:]
    rig.converged = False
    original = rig.ledger.active_id()
    r = run_at_boundary(BENCH, point, sig, rig.env, timeout=180)
    assert r.reached, f"{point} never reached (exit {r.code}):\n{r.stderr[-3000:]}"
    TIMES.add(point, sig, r)
    signum = signal.Signals[f"SIG{sig}"]
    assert r.code == 128 + signum, f"{point}:{sig}: exit {r.code}\n{r.stderr[-3000:]}"
    assert r.to_stop_s is not None and r.to_stop_s < 2.0, f"{point}:{sig}: acted on after {r.to_stop_s}"
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr[-3000:]

    # status: exit 0 only when d5, what ran before the comparison, is active and serves it
    code, out, err = rig.run("status", "--json")
    assert code in (0, 8), f"{point}:{sig}: status exit {code}: {err[-2000:]}"
    st = json.loads(out)
    if code == 0:
        assert st["profile"] == "d5" and st["healthy"] and rig.serves(st["endpoint"], "DFLASH"), f"{point}: {out}"
        assert st["unfinished_compare"] is None, out
    elif st.get("active") and st["profile"] != "d5":
        assert st["unfinished_compare"] and "did not finish" in st["unfinished_compare"], f"{point}:{sig}: {out}"
    if st.get("active") and not rig.serves(st["endpoint"], "DFLASH" if st["profile"] == "d5" else None):
        assert code == 8 and not st["healthy"], f"{point}:{sig}: healthy while nothing serves: {out}"
    ledger = rig.ledger
    target = ledger.known_good(exclude=ledger.active_id(), rollback=True)
    assert target is None or target.command != COMPARE_COMMAND, f"{point}:{sig}: rollback would go to the arm"

    # the next command converges: what ran before (d5) active and serving, the comparison settled
    code, out, err = rig.run("up", "--profile", "d5", "--yes", "--json")
    assert code == 0, f"{point}:{sig}: the next up exited {code}:\n{err[-3000:]}"
    res = json.loads(out)
    assert res["outcome"] in ("deployed", "unchanged") and rig.serves(res["endpoint"], "DFLASH"), f"{point}: {out}"
    code, out, err = rig.run("status", "--json")
    st = json.loads(out)
    assert code == 0 and st["healthy"] and st["profile"] == "d5", f"{point}:{sig}: not converged: {out}"
    assert st["unfinished_compare"] is None, out
    assert not (ledger.root / "compare.json").exists(), f"{point}:{sig}: the comparison's marker is left"
    if res["outcome"] == "unchanged":      # the interrupted bench restored it itself (or it never left)
        assert ledger.load(ledger.active_id()).profile == "d5" and original is not None
    rig.converged = True


def test_the_compare_matrix_covers_every_compare_step():
    assert {p.split(":")[1] for p, _ in POINTS} == set(COMPARE_STEPS) and {s for _, s in POINTS} == set(HANDLED_SIGNALS)
    assert len(POINTS) == len(COMPARE_STEPS) * 2
