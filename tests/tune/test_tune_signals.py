"""Every tune boundary (`deploy.steps.tune_crash_points`) with SIGKILL, and again with one of SIGINT, SIGTERM and
SIGHUP dealt in turn (the three take one handler: `testrig.controller.dealt_signals`), each followed by `status`
(truthful) and the next command (converges).

One embedded cluster with the planted optimum (tests/tune/conftest.py) is shared by every point, in order (one
xdist group): each point starts from t5-off deployed, runs a small tune (baseline + one candidate, one A/B round)
signalled at its boundary, then checks:

- a handled signal is acted on within 2 s of the boundary (its "stopping" line), and the CLI exits 128 + signal;
- the journal is never "finished" with a trial pending or the confirmation short, and never left "running" by a
  handled signal; a handled signal before the restore ended leaves it resumable ("interrupted");
- `status` exits 0 only when what runs is what ran before the tune (t5-off, serving); while a trial arm runs it
  exits 8 and names the unfinished transaction;
- the next command (`tune --resume RUN`, or the same tune again when nothing was journaled) exits 0 and
  converges: every trial decided, journal "finished", the marker gone, t5-off active and healthy.
"""
from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from sparkctl.deploy.steps import tune_crash_points
from testrig.controller import HANDLED_SIGNALS, SignalRig, SignalTimes, dealt_signals, run_at_boundary


def _tune_conftest():
    """The planted-optimum knobs and fast profiles of this directory's conftest (not importable by name)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("tune_conftest", Path(__file__).with_name("conftest.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_C = _tune_conftest()
PLANTED, FAST_D5, FAST_OFF = _C.PLANTED, _C.FAST_D5, _C.FAST_OFF

TUNE = ["tune", "--profile", "t5", "--vary", "speculative.num_draft_tokens=6", "--runs", "1", "--max-tokens", "64",
        "--warmup", "0", "--confirm-rounds", "1", "--force", "--json"]
BOUNDARIES = [f"{c}:{s}:{w}" for c, s, w in tune_crash_points()]
POINTS = [pair for dealt in dealt_signals(BOUNDARIES) for pair in ((dealt[0], "KILL"), dealt)]
TIMES = SignalTimes("tune signals")


class TuneRig(SignalRig):
    def __init__(self, root: Path) -> None:
        super().__init__(root, PLANTED, prefix="ts")
        (self.profiles_dir / "t5.yml").write_text(FAST_D5)
        (self.profiles_dir / "t5-off.yml").write_text(FAST_OFF)

    def journals(self) -> dict[str, dict]:
        return {p.parent.name: json.loads(p.read_text()) for p in self.state.glob("*/runs/*/tune.json")}

    def marker(self) -> dict | None:
        found = list(self.state.glob("*/tune.json"))
        return json.loads(found[0].read_text()) if found else None


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    r = TuneRig(tmp_path_factory.mktemp("tune-signals"))
    code, out, err = r.run("up", "--profile", "t5-off", "--yes", "--json")
    assert code == 0, err[-3000:]
    try:
        yield r
    finally:
        r.stop_engines()
        if line := TIMES.summary():
            print("\n" + line)


def _check_journal(j: dict, point: str) -> None:
    pending = [t["index"] for t in j["trials"] if t["status"] == "pending"]
    conf = j.get("confirmation") or {}
    if j["state"] == "finished":
        assert not pending, f"{point}: finished with trials {pending} pending"
        assert j["restore"]["ok"], f"{point}: finished without its restore: {j['restore']}"
        if conf and conf.get("verdict") != "failed":
            assert len(conf["order"]) == 2 * j["options"]["confirm_rounds"], f"{point}: finished mid-confirmation"


@pytest.mark.parametrize("point,sig", POINTS, ids=[f"{p}:{s}" for p, s in POINTS])
def test_a_signal_at_every_tune_boundary(rig, point, sig):
    before = set(rig.journals())
    r = run_at_boundary(TUNE, point, sig, rig.env)
    assert r.reached, f"{point} never reached (exit {r.code}):\n{r.stderr[-3000:]}"
    TIMES.add(point, sig, r)
    signum = signal.Signals[f"SIG{sig}"]
    if sig == "KILL":
        assert r.code == -signal.SIGKILL, r.stderr[-3000:]
    else:
        assert r.code == 128 + signum, f"{point}:{sig}: exit {r.code}\n{r.stderr[-3000:]}"
        assert r.to_stop_s is not None and r.to_stop_s < 2.0, f"{point}:{sig}: acted on after {r.to_stop_s}"
    new = {k: v for k, v in rig.journals().items() if k not in before}
    assert len(new) <= 1, new.keys()
    run_id, j = next(iter(new.items()), (None, None))
    if j is not None:
        _check_journal(j, f"{point}:{sig}")
        if sig != "KILL":
            assert j["state"] in ("interrupted", "finished"), f"{point}:{sig}: journal left {j['state']}"

    # status: exit 0 only when what ran before the tune runs and serves; a trial arm running is exit 8, named
    code, out, err = rig.run("status", "--json")
    assert code in (0, 8), f"{point}:{sig}: status exit {code}: {err[-2000:]}"
    st = json.loads(out)
    if code == 0:
        assert st["profile"] == "t5-off" and st["healthy"], f"{point}:{sig}: {out}"
    elif st.get("active") and st["profile"] != "t5-off":
        assert st["unfinished_compare"] and "did not finish" in st["unfinished_compare"], f"{point}:{sig}: {out}"
    if j is None or (j.get("restore") or {}).get("ok"):       # nothing began, or what ran before is back
        assert code == 0, f"{point}:{sig}: t5-off runs, yet status exit {code}: {out}"

    # the next command converges
    if j is None:                 # stopped before its journal was written: nothing to resume; the user's next `up`
        code, out, err = rig.run("up", "--profile", "t5-off", "--yes", "--json")
        assert code == 0 and json.loads(out)["outcome"] == "unchanged", f"{point}:{sig}: {out} {err[-3000:]}"
    else:
        if j["state"] == "finished":
            done = j                                            # nothing left to do
        else:
            code, out, err = rig.run("tune", "--resume", run_id, "--json")
            assert code == 0, f"{point}:{sig}: the next command exited {code}:\n{err[-3000:]}"
            done = json.loads(out)
        _check_journal(done, f"{point}:{sig} (next)")
        assert done["state"] == "finished", f"{point}:{sig}: {done['state']}"
    assert rig.marker() is None, f"{point}:{sig}: marker left: {rig.marker()}"
    code, out, err = rig.run("status", "--json")
    st = json.loads(out)
    assert code == 0 and st["healthy"] and st["profile"] == "t5-off", f"{point}:{sig}: not converged: {out}"
    assert st["unfinished_compare"] is None, out


def test_the_tune_matrix_covers_every_tune_step():
    from sparkctl.deploy.steps import TUNE_STEPS
    assert {p.split(":")[1] for p, _ in POINTS} == set(TUNE_STEPS)
    assert {p for p, s in POINTS if s == "KILL"} == {p for p, s in POINTS if s != "KILL"} == set(BOUNDARIES)
    assert {s for _, s in POINTS} == {"KILL", *HANDLED_SIGNALS}


def test_the_crash_contract_parses_three_and_four_fields():
    from sparkctl.deploy.steps import parse_crash_at
    assert parse_crash_at("up:boot:after") == ("up", "boot", "after", signal.SIGKILL)     # the 3-field form: KILL
    assert parse_crash_at("tune:trial@1:before:TERM") == ("tune", "trial@1", "before", signal.SIGTERM)
    hup = parse_crash_at("up:boot:after:SIGHUP")
    assert hup is not None and hup[3] == signal.SIGHUP
    for bad in ("up:boot", "up:boot:during", "up:boot:after:STOP", "up:boot:after:INT:x"):
        assert parse_crash_at(bad) is None, bad
