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

The same invariants over a vLLM profile (`engine: vllm` on the emulator's vLLM dialect: the headless rank, vLLM's
temporary directory, its readiness and gates from vLLM's own answers), at the boundaries where engines start and stop
(`up` from `stop-old` on, with its restore; `down`): what a dead controller leaves of vLLM engines is settled and
converges as SGLang's. What serves is judged from each engine's own answers (SGLang's /server_info, vLLM's /metrics: its
spec-decode family only under --speculative-config).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkctl.deploy.steps import COMMANDS, CRASH_ENV, IMAGE_STEPS, PREFLIGHT, RESTORE_STEPS, SETTLE, crash_points
from testrig.controller import run_in_process

FAST = {"boot_s": 0.3, "decode_tps": 6000, "ttft_base_s": 0.01}
KEY = "sk-crash-matrix-secret"


@dataclass(frozen=True)
class Names:
    """The profiles a matrix deploys: `good` (speculative: what each point converges to), `other` (its replacement),
    `bad` (`other` whose rank 1 dies during boot: the failed `up` restores the previous one); `spec` the algorithm
    `good` runs."""

    engine: str
    good: str
    other: str
    bad: str
    spec: str


SGLANG = Names("sglang", "d5", "dflash-off", "bad", "DFLASH")
VLLM = Names("vllm", "v-spec", "v-plain", "v-bad", "NGRAM")


class Matrix:
    def __init__(self, root: Path, names: Names = SGLANG) -> None:
        from testrig.embedded import write_embedded_inventory

        self.root = root
        self.names = names
        self.inv = write_embedded_inventory(root / "inventory.yml", FAST, prefix="cm" if names is SGLANG else "cv")
        profiles = root / "profiles"
        profiles.mkdir()
        bad = root / "bad-faults.json"      # rank 1 dies during boot: the failed `up` restores the previous one
        bad.write_text(json.dumps({"ranks": {"1": {"crash_after_s": 0.15}}}))
        if names is SGLANG:
            (profiles / "bad.yml").write_text(f"extends: dflash-off\nenv: {{SPARKCTL_SIM_CONFIG: '{bad}'}}\n")
        else:
            _vllm_profiles(profiles, bad, self.inv)
        self.converged = False       # the last point ended with `good` deployed and healthy (checked by status)
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

    def use(self, monkeypatch: pytest.MonkeyPatch) -> Matrix:
        """This matrix's SPARKCTL_* for the test's own reads (a Cluster finds its ledger by them): a worker can hold
        both engines' matrices, each test reads its own."""
        for k, v in self.env.items():
            if k.startswith("SPARKCTL_"):
                monkeypatch.setenv(k, v)
        return self

    @property
    def ledger(self):
        from sparkctl.config.inventory import load_inventory
        from sparkctl.state.ledger import Ledger
        return Ledger(Path(self.env["SPARKCTL_STATE_DIR"]) / load_inventory(self.inv).cluster.name)

    def serves(self, endpoint: str | None, expect_spec: str | None | bool = False) -> bool:
        """The endpoint answers /health 200, and (`expect_spec` not False) runs that speculative algorithm (None:
        none), by the engine's own answer: SGLang's /server_info, vLLM's /metrics (spec-decode counters only with
        --speculative-config)."""
        from sparkctl.sglang.client import SGLangAPIError, SGLangClient
        if not endpoint:
            return False
        try:
            with SGLangClient(endpoint, api_key=KEY, timeout=5) as c:
                if c.health() != 200:
                    return False
                if expect_spec is False:
                    return True
                if self.names.engine == "vllm":
                    return ("vllm:spec_decode_num_drafts" in c.text("/metrics")) == bool(expect_spec)
                return c.server_info().get("speculative_algorithm") == expect_spec
        except SGLangAPIError:
            return False


def _matrix(root: Path, names: Names) -> Iterator[Matrix]:
    """A module's matrix of `names`; at the end every engine its ledger recorded is stopped (read with its own
    SPARKCTL_*: each test sets them for itself, `Matrix.use`)."""
    from testrig.embedded import stop_recorded_engines
    m = Matrix(root, names)
    try:
        yield m
    finally:
        with pytest.MonkeyPatch.context() as mp:
            m.use(mp)
            stop_recorded_engines(m.inv)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    yield from _matrix(tmp_path_factory.mktemp("crash-matrix"), SGLANG)


@pytest.fixture(scope="module")
def vllm_matrix(tmp_path_factory):
    yield from _matrix(tmp_path_factory.mktemp("crash-matrix-vllm"), VLLM)


def _vllm_profiles(profiles: Path, bad_faults: Path, inv: Path) -> None:
    """v-spec (cpu-tiny-vllm with ngram drafting), v-plain (without) and v-bad (v-plain whose rank 1 dies during
    boot), from the shipped cpu-tiny-vllm on ports of its own (testrig.embedded.emulated_vllm_profile: a real
    engine's TCP store binds *:26000, which an emulator's store on 127.x.y.2:26000 beside it makes fail with
    EADDRINUSE: measured, a real replicated test failed so while this matrix ran by hand), the API key in force."""
    import yaml

    from testrig.embedded import emulated_vllm_profile
    doc = emulated_vllm_profile(inv)
    doc["api"]["api_key_env"] = "SPARKCTL_API_KEY"
    doc.pop("speculative", None)
    (profiles / "v-plain.yml").write_text(yaml.safe_dump(doc))
    (profiles / "v-spec.yml").write_text(yaml.safe_dump({**doc, "speculative": {"algorithm": "NGRAM",
                                                                              "num_draft_tokens": 5}}))
    (profiles / "v-bad.yml").write_text(yaml.safe_dump({**doc, "env": {**doc["env"],
                                                                       "SPARKCTL_SIM_CONFIG": str(bad_faults)}}))


def _scenario(command: str, step: str, names: Names = SGLANG) -> tuple[list[str], str]:
    """The command run at a crash point, and the profile that must be active before it (the setup)."""
    if command in ("up", "rollback"):
        target = names.bad if step in RESTORE_STEPS else names.other
        args = ["up", "--profile", target] if command == "up" else ["rollback", "--to", target]
        return [*args, "--yes", "--json"], names.good
    if command == "down":
        return ["down", "--yes", "--json"], names.good
    if command == "repair":
        return ["repair", "--yes", "--json"], names.good
    if command == "bench-compare":
        return ["bench", "--compare", names.other, "--gates", "cold", "--warmup", "0", "--json"], names.good
    raise AssertionError(command)


POINTS = list(crash_points())
ENGINE_FREE_UP_STEPS = (SETTLE, PREFLIGHT, *IMAGE_STEPS)
# vLLM: the commands whose steps start and stop engines (the record-only commands, repair and the compare's record,
# are one code for both engines), from the first step that touches one: before `stop-old` an `up` has only settled a
# converged cluster, checked it and planned (the process runtime has no images), the same for either engine
VLLM_POINTS = [p for p in POINTS if p[0] == "down" or p[0] == "up" and p[1] not in ENGINE_FREE_UP_STEPS]


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
    code, out, err = m.run("up", "--profile", m.names.good, "--yes", "--json")
    assert code == 0, f"{point}: the next up exited {code}:\n{err[-3000:]}"
    res = json.loads(out)
    assert res["outcome"] in ("deployed", "unchanged") and m.serves(res["endpoint"], m.names.spec), \
        f"{point}: {out}"
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
def test_sigkill_at_every_step_boundary(matrix, command, step, when, monkeypatch):
    _crash_at(matrix.use(monkeypatch), command, step, when)


@pytest.mark.parametrize("command,step,when", VLLM_POINTS, ids=[":".join(p) for p in VLLM_POINTS])
def test_sigkill_at_every_step_boundary_of_a_vllm_deployment(vllm_matrix, command, step, when, monkeypatch):
    _crash_at(vllm_matrix.use(monkeypatch), command, step, when)


def _crash_at(m: Matrix, command: str, step: str, when: str) -> None:
    point = f"{command}:{step}:{when}"
    args, setup = _scenario(command, step, m.names)
    if not (m.converged and setup == m.names.good):  # the previous point converged on it: shared, not redeployed
        code, out, err = m.run("up", "--profile", setup, "--yes", "--json")
        assert code == 0, err
    m.converged = False
    if command == "repair":                     # something for repair to do: the active record damaged
        ledger = m.ledger
        if ledger.known_good(exclude=ledger.active_id()) is None:
            # the damaged record must not be the only known-good one (I4 then has nothing to find: a point dealt
            # first to its worker met that): one more deployment before it
            for profile in (m.names.other, m.names.good):
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
def test_the_state_directory_full_from_each_record_write_of_up_on(matrix, first, monkeypatch):
    """The file system fills up at each record write of an `up` in turn (every write from the Nth fails with
    ENOSPC): exit 6 naming the state directory, never 70 or a traceback, and I1-I5 hold after each. The points
    are the writes themselves: N grows until the `up` makes fewer writes than N (it then succeeds). They are dealt
    to FULL_DISK_SHARES tests (this one: N = first, first + FULL_DISK_SHARES, ...); together they cover every N
    up to the first that succeeds, and each ends past the up's last write."""
    from sparkctl.state.ledger import WRITE_FAULT_ENV

    m = matrix.use(monkeypatch)
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
