"""Every boundary of a replicated `up` (`deploy.steps.replicated_crash_points`, plus the lifecycle's boot and
hand-off inside a replica's own `up`), each with one of SIGINT, SIGTERM and SIGHUP dealt in turn (the three take one
handler: `testrig.controller.dealt_signals`), delivered at the boundary itself (``SPARKCTL_CRASH_AT=<point>:<SIG>``),
each followed by `status` and the next `up`. SIGKILL at the same points is tests/scaleout/test_replicated_crash.py.

A rolling update (p1 <-> p2, every point rolls to the other profile) under a client loop through the router, and
a first `up` (nothing runs). After each signal:

- it is acted on within 2 s of the boundary (the handler's "stopping" line) and the CLI exits 128 + the signal;
- `status` is truthful: the record is not left "updating" (no `up` in progress, none interrupted), exit 0 only
  when the router is ready and every replica healthy in it, and every replica that serves is in the router when
  the router runs (none left out by a cut detach or attach);
- the next `up` exits 0 and converges: every replica runs the profile asked, healthy, in the router, the record
  "active";
- in the rolling update, no request of the client loop fails, from the signalled `up` to the end of the next.

One embedded cluster per test group (an xdist group each), short emulator boots.
"""
from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import httpx
import pytest

from sparkctl.deploy.steps import replicated_crash_points
from testrig.controller import HANDLED_SIGNALS, SignalRig, SignalTimes, dealt_signals, run_at_boundary
from testrig.embedded import write_replicated_profile
from testrig.testenv import need_module

need_module("sglang_router", "the router extra (sglang-router) is not installed")
FAST = {"boot_s": 0.3, "decode_tps": 4000, "ttft_base_s": 0.002}
INNER = [("up", "boot", "after"), ("up", "hand-off", "before")]       # inside a replica's own `up`
ROLLING = dealt_signals([":".join(p) for p in [*replicated_crash_points(), *INNER]])
FIRST_UP = dealt_signals([":".join(p) for p in replicated_crash_points() if p[1] != "replica-detach"])
TIMES = SignalTimes("replicated signals")


class Rig(SignalRig):
    def __init__(self, root: Path) -> None:
        super().__init__(root, FAST, nodes=2)
        self.profiles = [write_replicated_profile(root / f"p{k}.yml", mrr, drain_timeout_s=30, warmup_requests=0)
                         for k, mrr in ((1, 16), (2, 24))]
        self.mrr = (16, 24)
        self.current: int | None = None

    def up(self, k: int) -> list[str]:
        return ["up", "--profile", str(self.profiles[k]), "--yes", "--json"]

    def close(self) -> None:
        self.run("down", "--yes")
        self.stop_engines()


def _rig(tmp_path_factory, name: str):
    r = Rig(tmp_path_factory.mktemp(name))
    try:
        yield r
    finally:
        r.close()
        if line := TIMES.summary(f"replicated signals ({name}), so far"):
            print("\n" + line)


@pytest.fixture(scope="module")
def rolling(tmp_path_factory):
    yield from _rig(tmp_path_factory, "rep-sig-rolling")


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    yield from _rig(tmp_path_factory, "rep-sig-first")


class ClientLoop:
    """Generations through the router, one after another, until stopped; every failure kept."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint, self.done = endpoint, 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        with httpx.Client(timeout=60, trust_env=False) as c:
            while not self._stop.is_set():
                try:
                    r = c.post(self.endpoint + "/generate",
                               json={"text": f"loop {self.done}", "sampling_params": {"max_new_tokens": 32}})
                    if r.status_code != 200 or r.json()["meta_info"]["completion_tokens"] != 32:
                        self.failures.append(f"{r.status_code} {r.text[:200]}")
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                self.done += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=90)


def _signalled(r: Rig, args: list[str], point: str, sig: str):
    res = run_at_boundary(args, point, sig, r.env)
    TIMES.add(point, sig, res)
    return res


def _check_status_after(r: Rig, label: str) -> dict:
    code, out, err = r.run("status", "--json")
    assert code in (0, 8), f"{label}: status exit {code}: {err[-2000:]}"
    st = json.loads(out)
    assert st.get("status") != "updating" and st.get("progress") is None, f"{label}: record left updating: {out}"
    if code == 0:
        assert st["healthy"] and all(x["healthy"] and x["in_router"] for x in st.get("replicas", [])), \
            f"{label}: {out}"
    if (st.get("router") or {}).get("live"):
        left_out = [x["index"] for x in st["replicas"] if x["healthy"] and not x["in_router"]]
        assert not left_out, f"{label}: replicas {left_out} serve but are out of the router: {out}"
    for x in st.get("replicas", []):       # what each replica runs, against what was asked (the record's profile)
        assert (x["profile"] is not None) == (x["deployment"] is not None), f"{label}: {out}"
        assert x["profile"] in (None, *(p.stem for p in r.profiles)), f"{label}: {out}"
    return st


def _check_converged(r: Rig, k: int, label: str) -> None:
    code, out, err = r.run(*r.up(k))
    assert code == 0, f"{label}: the next up exited {code}:\n{err[-3000:]}"
    code, out, err = r.run("status", "--json")
    st = json.loads(out)
    assert code == 0 and st["healthy"] and st["status"] == "active", f"{label}: not converged: {out}"
    assert all(x["in_router"] and x["healthy"] for x in st["replicas"]), f"{label}: {out}"
    assert st["profile"] == r.profiles[k].stem and {x["profile"] for x in st["replicas"]} == {st["profile"]}, out
    for x in st["replicas"]:
        info = httpx.get(x["url"] + "/server_info", timeout=5, trust_env=False).json()
        assert info["max_running_requests"] == r.mrr[k], f"{label}: replica {x['index']} runs {info}"


@pytest.mark.parametrize("point,sig", ROLLING, ids=[f"{p}:{s}" for p, s in ROLLING])
def test_a_signal_at_every_boundary_of_a_rolling_update(rolling, point, sig):
    r, label = rolling, f"{point}:{sig}"
    if r.current is None:
        code, out, err = r.run(*r.up(0))
        assert code == 0, err[-3000:]
        r.current = 0
    dst = 1 - r.current
    code, out, err = r.run("status", "--json")
    loop = ClientLoop(json.loads(out)["endpoint"])
    try:
        res = _signalled(r, r.up(dst), point, sig)
        if not res.reached:
            assert point.split(":")[1] == "router-start" and res.code == 0, \
                f"{label} never reached (exit {res.code}):\n{res.stderr[-3000:]}"    # the router already runs
        else:
            assert res.code == 128 + signal.Signals[f"SIG{sig}"], f"{label}: exit {res.code}\n{res.stderr[-3000:]}"
            assert res.to_stop_s is not None and res.to_stop_s < 2.0, f"{label}: acted on after {res.to_stop_s}"
        _check_status_after(r, label)
        _check_converged(r, dst, label)
        r.current = dst
    finally:
        loop.stop()
    assert loop.failures == [], f"{label}: {len(loop.failures)} of {loop.done} requests failed: {loop.failures[:3]}"
    assert loop.done > 0


@pytest.mark.parametrize("point,sig", FIRST_UP, ids=[f"{p}:{s}" for p, s in FIRST_UP])
def test_a_signal_at_every_boundary_of_a_first_up(first, point, sig):
    r, label = first, f"{point}:{sig}"
    code, out, err = r.run("down", "--yes")
    assert code == 0, err[-3000:]
    res = _signalled(r, r.up(0), point, sig)
    assert res.reached, f"{label} never reached on a first up (exit {res.code}):\n{res.stderr[-3000:]}"
    assert res.code == 128 + signal.Signals[f"SIG{sig}"], f"{label}: exit {res.code}\n{res.stderr[-3000:]}"
    assert res.to_stop_s is not None and res.to_stop_s < 2.0, f"{label}: acted on after {res.to_stop_s}"
    _check_status_after(r, label)
    _check_converged(r, 0, label)


def test_the_matrices_cover_every_replicated_step_and_signal():
    from sparkctl.deploy.steps import REPLICATED_STEPS
    assert {p.split(":")[1] for p, _ in ROLLING} >= set(REPLICATED_STEPS)
    assert {p for p, _ in ROLLING} == {":".join(p) for p in [*replicated_crash_points(), *INNER]}
    assert {s for _, s in ROLLING} == {s for _, s in FIRST_UP} == set(HANDLED_SIGNALS)
