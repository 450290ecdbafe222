"""THE crash matrix: SIGKILL the controller at every step boundary of every command that changes the cluster.

The points come from the step definitions (`sparkctl.deploy.steps.crash_points`), not from a hand-picked list:
a step added there is crashed here the day it is added. Each point runs the CLI as a subprocess with
``SPARKCTL_CRASH_AT=<command>:<step>:<before|after>`` (the controller SIGKILLs itself there: no handler runs),
then checks the invariants of issue 15:

- I1 `status` tells the truth: exit 0 only if the active deployment serves (/health 200, settings in force);
- I2 the next `up` (or `down`) exits 0 and converges;
- I3 no command exits 0 saying healthy or unchanged while nothing serves;
- I4 the last known-good deployment is serving or restorable (its record loads, it renders);
- I5 every record written before the crash still loads; no secret file is left once its engine is gone.

One embedded cluster is shared by every point (the converging `up` of one point is the setup of the next), on
a short emulator boot, so the matrix stays a few minutes on 2 cores.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkctl.deploy.steps import COMMANDS, CRASH_ENV, RESTORE_STEPS, crash_points
from testrig.controller import run_in_process

FAST = {"boot_s": 0.3, "decode_tps": 6000, "ttft_base_s": 0.01}
KEY = "sk-crash-matrix-secret"


class Matrix:
    def __init__(self, root: Path) -> None:
        from testrig.embedded import write_embedded_inventory

        self.root = root
        self.inv = write_embedded_inventory(root / "inventory.yml", FAST, prefix="cm")
        profiles = root / "profiles"
        profiles.mkdir()
        bad = root / "bad-faults.json"      # rank 1 dies during boot: the failed `up` restores the previous one
        bad.write_text(json.dumps({"ranks": {"1": {"crash_after_s": 0.15}}}))
        (profiles / "bad.yml").write_text(f"extends: dflash-off\nenv: {{SPARKCTL_SIM_CONFIG: '{bad}'}}\n")
        self.converged = False       # the last point ended with d5 deployed and healthy (checked by status)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCTL_")}
        self.env.update(SPARKCTL_STATE_DIR=str(root / "state"), SPARKCTL_INVENTORY=str(self.inv),
                        SPARKCTL_PROFILES_DIR=str(profiles), SPARKCTL_API_KEY=KEY)

    def run(self, *args: str, crash: str | None = None, timeout: float = 120) -> tuple[int, str, str]:
        """`sparkctl ARGS`: a real process when it is to crash (it SIGKILLs itself at `crash`) or to meet a full disk
        (the ledger counts the record writes of its process); otherwise (`status`, the setup and the next command)
        in-process, which saves an interpreter start per call."""
        from sparkctl.state.ledger import WRITE_FAULT_ENV
        if not crash and WRITE_FAULT_ENV not in self.env:
            return run_in_process(list(args), self.env)
        env = {**self.env, CRASH_ENV: crash} if crash else self.env
        p = subprocess.run([sys.executable, "-m", "sparkctl", *args], env=env, capture_output=True, text=True,
                           timeout=timeout)
        return p.returncode, p.stdout, p.stderr

    @property
    def ledger(self):
        from sparkctl.config.inventory import load_inventory
        from sparkctl.state.ledger import Ledger
        return Ledger(Path(self.env["SPARKCTL_STATE_DIR"]) / load_inventory(self.inv).cluster.name)

    def serves(self, endpoint: str | None, expect_spec: str | None | bool = False) -> bool:
        from sparkctl.sglang.client import SGLangAPIError, SGLangClient
        if not endpoint:
            return False
        try:
            with SGLangClient(endpoint, api_key=KEY, timeout=5) as c:
                if c.health() != 200:
                    return False
                if expect_spec is not False:
                    return c.server_info().get("speculative_algorithm") == expect_spec
                return True
        except SGLangAPIError:
            return False


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    from testrig.embedded import stop_recorded_engines
    m = Matrix(tmp_path_factory.mktemp("crash-matrix"))
    old = {k: os.environ.get(k) for k in m.env if k.startswith("SPARKCTL_")}
    os.environ.update({k: v for k, v in m.env.items() if k.startswith("SPARKCTL_")})  # for the in-test ledger reads
    try:
        yield m
    finally:
        stop_recorded_engines(m.inv)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _scenario(command: str, step: str) -> tuple[list[str], str]:
    """The command run at a crash point, and the profile that must be active before it (the setup)."""
    if command in ("up", "rollback"):
        target = "bad" if step in RESTORE_STEPS else "dflash-off"
        args = ["up", "--profile", target] if command == "up" else ["rollback", "--to", target]
        return [*args, "--yes", "--json"], "d5"
    if command == "down":
        return ["down", "--yes", "--json"], "d5"
    if command == "repair":
        return ["repair", "--yes", "--json"], "d5"
    if command == "bench-compare":
        return ["bench", "--compare", "dflash-off", "--gates", "cold", "--warmup", "0", "--json"], "d5"
    raise AssertionError(command)


POINTS = list(crash_points())


def _check_invariants(m: Matrix, point: str, before: set[str]) -> None:
    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import Profile
    from sparkctl.deploy.cluster import Cluster

    ledger = m.ledger
    # I5: every record written before the crash still loads
    for dep_id in before:
        ledger.load(dep_id)
    # I1 / I3: status exit 0 only if the active deployment serves with its settings in force
    code, out, err = m.run("status", "--json")
    if point.startswith("repair:") and code == 6:
        # the damage repair was fixing is still there: status names it and the way out, and that way converges
        assert "run `sparkctl repair`" in err, f"{point}: {err}"
        code, out, err = m.run("repair", "--yes", "--json")
        assert code == 0, f"{point}: repair after the crash exited {code}: {err}"
        code, out, err = m.run("status", "--json")
    assert code in (0, 8), f"{point}: status exit {code}: {err}"
    st = json.loads(out)
    if code == 0 and st["active"]:
        assert m.serves(st["endpoint"], st["speculative_algorithm"]), f"{point}: status 0 but nothing serves: {out}"
    if not st["active"] or not m.serves(st["endpoint"]):
        assert code == 8 or not st["active"] and st["ok"], f"{point}: {out}"
        assert not st["healthy"], f"{point}: healthy while nothing serves: {out}"
    if point.startswith("bench-compare:") and code == 8 and st["unfinished_compare"]:
        assert "did not finish" in st["unfinished_compare"], out
    # I4: the last known-good deployment is serving or restorable (its record loads, its profile renders here);
    # a bench arm is never what a plain rollback goes to
    good = ledger.known_good()
    assert good is not None, f"{point}: no known-good deployment left"
    target = ledger.known_good(exclude=ledger.active_id(), rollback=True)
    assert target is None or target.command != "bench-compare", f"{point}: rollback would go to the bench arm"
    Cluster(load_inventory(m.inv)).render(Profile.model_validate(good.profile_data))
    # I2 / I3: the next `up` exits 0, converges, and says healthy/unchanged only when it serves
    code, out, err = m.run("up", "--profile", "d5", "--yes", "--json")
    assert code == 0, f"{point}: the next up exited {code}:\n{err[-3000:]}"
    res = json.loads(out)
    assert res["outcome"] in ("deployed", "unchanged") and m.serves(res["endpoint"], "DFLASH"), f"{point}: {out}"
    code, out, err = m.run("status", "--json")
    assert code == 0 and json.loads(out)["healthy"], f"{point}: not converged: {out} {err}"
    assert json.loads(out)["unfinished_compare"] is None, out
    m.converged = True
    # I5: no secret file left for a deployment none of whose engines runs
    from sparkctl.deploy.observe import process_engines
    running = {e.deployment for e in process_engines(Cluster(load_inventory(m.inv)))}
    secrets = ledger.root / "secrets"
    left = [p.name for p in secrets.iterdir() if p.name not in running and any(p.rglob("*"))] \
        if secrets.exists() else []
    assert not left, f"{point}: secret files left for stopped deployments: {left}"


@pytest.mark.parametrize("command,step,when", POINTS, ids=[":".join(p) for p in POINTS])
def test_sigkill_at_every_step_boundary(matrix, command, step, when):
    m = matrix
    point = f"{command}:{step}:{when}"
    args, setup = _scenario(command, step)
    if not (m.converged and setup == "d5"):   # the previous point ended on a healthy d5: shared, not redeployed
        code, out, err = m.run("up", "--profile", setup, "--yes", "--json")
        assert code == 0, err
    m.converged = False
    if command == "repair":                     # something for repair to do: the active record damaged
        ledger = m.ledger
        if ledger.known_good(exclude=ledger.active_id()) is None:
            # the damaged record must not be the only known-good one (I4 then has nothing to find: a point dealt
            # first to its worker met that): one more deployment before it
            for profile in ("dflash-off", "d5"):
                code, out, err = m.run("up", "--profile", profile, "--yes", "--json")
                assert code == 0, err
        ledger.deployment_path(ledger.active_id()).write_text("not json {")
    before = set(m.ledger.record_ids())
    code, out, err = m.run(*args, crash=point)
    reached = code == -9
    if not reached:
        # the step is not on this command's path here (e.g. stop-old with nothing active): say so, still check
        assert step in ("stop-old",) or command == "repair", f"{point} was never reached (exit {code}):\n{err[-2000:]}"
    if command == "repair" and not reached:
        assert code == 0, err
    _check_invariants(m, point, {i for i in before if (m.ledger.deployment_path(i)).exists()
                                 and not m.ledger.deployment_path(i).read_text().startswith("not json")})


def test_the_matrix_covers_every_step_of_every_command():
    covered = {(c, s) for c, s, _ in POINTS}
    assert covered == {(c, s) for c, steps in COMMANDS.items() for s in steps}


# The full-disk points are dealt to this many tests (each its own cluster under pytest-xdist: they run side by side).
FULL_DISK_SHARES = 4


@pytest.mark.parametrize("first", range(1, FULL_DISK_SHARES + 1),
                         ids=[f"writes-{i}-every-{FULL_DISK_SHARES}" for i in range(1, FULL_DISK_SHARES + 1)])
def test_the_state_directory_full_from_each_record_write_of_up_on(matrix, first):
    """The file system fills up at each record write of an `up` in turn (every write from the Nth fails with
    ENOSPC): exit 6 naming the state directory, never 70 or a traceback, and I1-I5 hold after each. The points
    are the writes themselves: N grows until the `up` makes fewer writes than N (it then succeeds). They are dealt
    to FULL_DISK_SHARES tests (this one: N = first, first + FULL_DISK_SHARES, ...); together they cover every N
    up to the first that succeeds, and each ends past the up's last write."""
    from sparkctl.state.ledger import WRITE_FAULT_ENV

    m = matrix
    n, codes = first - FULL_DISK_SHARES, []
    while True:
        n += FULL_DISK_SHARES
        if not m.converged:
            code, out, err = m.run("up", "--profile", "d5", "--yes", "--json")
            assert code == 0, err
        m.converged = False
        env_before = dict(m.env)
        m.env[WRITE_FAULT_ENV] = str(n)
        try:
            code, out, err = m.run("up", "--profile", "dflash-off", "--yes", "--json")
        finally:
            m.env = env_before
        codes.append(code)
        assert code in (0, 6), f"write {n}: exit {code}:\n{err[-3000:]}"
        assert "Traceback" not in err and "internal error" not in err, f"write {n}:\n{err[-3000:]}"
        if code == 6:
            assert "No space left on device" in err, err
        _check_invariants(m, f"full-from-write-{n}", set(m.ledger.record_ids()) - {"x"})
        if code == 0:
            break
        assert n < 60, "an up that never stops writing"
    print(f"state directory full from record writes {first}, {first + FULL_DISK_SHARES} ... {n - FULL_DISK_SHARES} "
          f"of an up, then none from write {n}: exits {codes}")
    assert codes[:-1] == [6] * (len(codes) - 1) and n > 5, codes
