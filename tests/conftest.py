"""Shared test helpers: run the CLI in-process, write throwaway profiles and inventories; the tiers.

Every test gets exactly one tier marker (docs/testing.md), assigned here and only here: by its directory, or by its
file where a file's tier differs from its directory's. A new file in a listed directory needs nothing; a new
directory needs one line in TIER_OF_DIR (collection fails naming it until then). A tier marker the file sets itself
(`pytestmark = pytest.mark.cluster`) wins.

Under pytest-xdist (`./bin/test` with no argument, `-n N --dist loadgroup`) the same hook puts the tests that must
share one worker in one `xdist_group`: everything on a test cluster (root, network namespaces: one user at a
time), everything on the real engine (one TP=2 engine at a time), and each module whose tests share a module-scoped
fixture (one deployment, one pool of emulators), so a session fixture is never built twice at great cost.
"""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def _hypothesis_profile() -> None:
    """Every Hypothesis test runs under testrig.mutations.CI_SETTINGS unless it says otherwise (deterministic, no
    example database, no deadline, no "too slow" health check on a loaded machine): a test written with a bare
    `@given` once failed under load with FailedHealthCheck (generation too slow), which is the machine, not the
    property. A test's own `@settings` still sets what it names (max_examples, usually)."""
    try:
        from hypothesis import settings
    except ImportError:        # the test extra is not installed: the tests that need it say so themselves
        return
    from testrig.mutations import CI_SETTINGS
    settings.register_profile("sparkctl", **CI_SETTINGS)
    settings.load_profile("sparkctl")


_hypothesis_profile()

TIERS = ("unit", "embedded", "crash", "cluster", "contract", "real_engine")
# tests/<directory>/ -> its tier
TIER_OF_DIR = {
    "unit": "unit", "golden": "unit", "sglang": "unit", "vllm": "unit", "property": "unit",
    "sim": "embedded", "lifecycle": "embedded", "bench_card": "embedded", "tune": "embedded",
    "doctor": "embedded", "scaleout": "embedded", "watch": "embedded", "install": "embedded",
    "bench_smoke": "embedded",
    "cluster": "cluster", "contract": "contract", "realengine": "real_engine",
}
# files whose tier is not their directory's (path under tests/)
TIER_OF_FILE = {
    "lifecycle/test_crash_matrix.py": "crash",
    "lifecycle/test_crash.py": "crash",
    "scaleout/test_replicated_crash.py": "crash",
    "scaleout/test_replicated_signal_matrix.py": "crash",
    "tune/test_tune_signals.py": "crash",
    "bench_card/test_compare_signals.py": "crash",
}
# modules whose module-scoped fixture is cheap to build once per worker and whose tests are independent of each
# other's order: spread over the workers instead of grouped (the crash matrix: each point brings the cluster to its
# own starting state; a worker's first point costs one `up`)
SPREAD_MODULES = {"lifecycle/test_crash_matrix.py", "scaleout/test_replicated_signal_matrix.py",
                  "tune/test_tune_signals.py", "bench_card/test_compare_signals.py"}
# modules that compare what a client measures with an emulator's known timing (decode rates, TTFT, a planted optimum):
# marked `timing` besides their tier; `./bin/test` runs them alone after the others (other workers' load moved their
# measurements past the tolerance), and under `-n` one worker runs them one after another
TIMING_MODULES = {"bench_card/test_emulated.py", "tune/test_tune.py", "tune/test_tune_vllm.py",
                  "sim/test_sim_timing.py", "sim/test_sim_perf.py"}
# one group per tier, so one worker each, for the test clusters (root, network namespaces and their prefixes: one user
# at a time) and the real engine (one TP=2 engine, port 26000 for its TCP store): two workers, side by side. They once
# shared one worker (`machine`, ~25 min, the suite's critical path) because the cluster tests' preflight judged
# this host's /proc/meminfo against d5's 0.88 of 23.5 GiB; they now see d5 at 0.5 (tests/cluster/conftest.py),
# and the memory measured with both running is in docs/testing.md.
GROUP_OF_TIER = {"cluster": "cluster", "real_engine": "real_engine"}
# The groups that each hold a worker for most of the run, longest first (measured: docs/testing.md). pytest-xdist's
# loadgroup orders its work units by their number of tests, so a short-listed but long group (the real engine in
# containers: 8 tests, 15-25 min) could start last, behind hundreds of one-test units, and end the run alone; these
# start first, one per worker, and the other workers take everything else (./bin/test runs one worker more than
# there are groups here).
LONG_GROUPS = ("real_engine_cluster", "real_engine", "cluster")


def tier_of(path: Path) -> str:
    """The tier of the test file at `path` (under tests/), from TIER_OF_FILE, else TIER_OF_DIR."""
    rel = path.resolve().relative_to(TESTS).as_posix()
    if rel in TIER_OF_FILE:
        return TIER_OF_FILE[rel]
    top = rel.split("/", 1)[0]
    if top not in TIER_OF_DIR:
        raise pytest.UsageError(f"tests/{rel}: tests/{top}/ has no tier: add it to TIER_OF_DIR in tests/conftest.py "
                                f"(one of {', '.join(TIERS)})")
    return TIER_OF_DIR[top]


def _rel(item: pytest.Item) -> str:
    return Path(str(item.path)).resolve().relative_to(TESTS).as_posix()


def _xdist_group(item: pytest.Item, tier: str) -> str | None:
    if tier in GROUP_OF_TIER:
        return GROUP_OF_TIER[tier]
    rel = _rel(item)
    if rel in TIMING_MODULES:
        return "timing"
    if rel in SPREAD_MODULES:
        return None
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        if any(d.scope in ("module", "session") and d.baseid.startswith("tests") for d in defs):
            return rel
    return None


@pytest.hookimpl(tryfirst=True)   # before xdist reads the xdist_group marks (it runs in each worker)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    xdist = config.pluginmanager.hasplugin("xdist")
    for item in items:
        own = [m.name for m in item.iter_markers() if m.name in TIERS]
        tier = own[0] if own else tier_of(Path(str(item.path)))
        if not own:
            item.add_marker(getattr(pytest.mark, tier))
        if _rel(item) in TIMING_MODULES:
            item.add_marker(pytest.mark.timing)
        if xdist:
            marked = next(item.iter_markers("xdist_group"), None)     # a test's own mark wins
            group = (marked.args[0] if marked.args else marked.kwargs.get("name", "default")) if marked else \
                _xdist_group(item, tier)
            if group:
                if not marked:
                    item.add_marker(pytest.mark.xdist_group(group))
                if getattr(config.option, "loadgroup", False):    # an xdist worker under --dist loadgroup
                    _suffix_group(item, group)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under --dist loadgroup: xdist's scheduler with LONG_GROUPS handed out first (see there)."""
    if config.getoption("dist", None) != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling  # type: ignore[import-untyped]

    class LongGroupsFirst(LoadGroupScheduling):
        _ordered = False

        def _assign_work_unit(self, node: object) -> None:
            if not self._ordered:            # the first assignment: the queue is complete, nothing handed out yet
                self._ordered = True
                for group in reversed(LONG_GROUPS):
                    if group in self.workqueue:
                        self.workqueue.move_to_end(group, last=False)
            super()._assign_work_unit(node)
    return LongGroupsFirst(config, log)


def _suffix_group(item: pytest.Item, group: str) -> None:
    """What pytest-xdist 3.8 does with an xdist_group mark (the scheduler groups by the id's "@group" suffix), done
    here because it writes `item._nodeid`, which pytest 9 no longer reads (the id is `item._id`): without this,
    --dist loadgroup spread every group over the workers."""
    if "@" in item.nodeid:
        return
    if hasattr(item, "_id"):
        from _pytest.nodeid import coerce_node_id
        item._id = coerce_node_id(f"{item.nodeid}@{group}")
    else:
        item._nodeid = f"{item.nodeid}@{group}"  # type: ignore[attr-defined]  # pytest < 9's own attribute


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """With SPARKCTL_TEST_CPU_LOG set, each test's wall and CPU (the worker's own and its reaped children's) is
    appended there as it ends (testrig/testcpu.py; `python -m testrig.testcpu FILE` sums it)."""
    from testrig.testcpu import measured

    with measured(item.nodeid):
        return (yield)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run `sparkctl ARGS` in-process; returns (exit code, stdout, stderr)."""
    from sparkctl.cli.main import main

    def run(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err
    return run


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "state"
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(path))
    return path


@pytest.fixture
def profiles_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A profiles directory searched before the shipped one; shipped profiles still resolve for extends."""
    path = tmp_path / "profiles"
    path.mkdir()
    monkeypatch.setenv("SPARKCTL_PROFILES_DIR", str(path))
    return path


FAST_SIM = {"boot_s": 0.4, "decode_tps": 4000}     # peer_timeout_s: testrig.embedded.PEER_TIMEOUT_S


@pytest.fixture
def local_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path):
    """An embedded two-rank cluster on fresh loopback addresses with a fast emulator; yields its inventory path.

    Every engine the test started is stopped at teardown through the ledger (never by name).
    """
    import os

    from testrig.embedded import stop_recorded_engines, write_embedded_inventory

    inv = write_embedded_inventory(tmp_path / "inventory.yml", FAST_SIM)
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(inv))
    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    yield inv
    stop_recorded_engines(inv)


@pytest.fixture
def faulty_profile(tmp_path: Path, profiles_dir: Path):
    """A profile 'faulty' = BASE + an emulator fault config carried in the profile's env.

    The fault travels with this deployment's engines only (SPARKCTL_SIM_CONFIG in the rank env), so the
    deployment a rollback restores boots clean, as on a real cluster.
    """
    import json

    def make(config: dict, base: str = "d5", extra: str = "") -> str:
        path = tmp_path / "sim-faults.json"
        path.write_text(json.dumps(config))
        (profiles_dir / "faulty.yml").write_text(f"extends: {base}\nenv: {{SPARKCTL_SIM_CONFIG: '{path}'}}\n{extra}")
        return "faulty"
    return make


@pytest.fixture
def sim(tmp_path: Path):
    """``sim(extra_argv, knobs=..., host=..., port=..., env=..., model=..., config=...)`` starts an emulator
    (testrig.simproc.SimProc); all are killed afterwards. The test thread runs at raised priority meanwhile (the
    client side of the timing tests measures in it; testrig/priority.py)."""
    import json

    from testrig.priority import raised_priority
    from testrig.simproc import MODEL, SimProc
    from testrig.testenv import free_port

    procs: list[SimProc] = []

    def start(argv: list[str] | None = None, *, knobs: dict | None = None, host: str = "127.0.0.1",
              port: int | None = None, env: dict[str, str] | None = None, model: str = MODEL,
              config: dict | None = None) -> SimProc:
        port = port or free_port(host)
        e = {"SPARKCTL_SIM_BOOT_S": "0.3"}
        for k, v in (knobs or {}).items():
            e[f"SPARKCTL_SIM_{k.upper()}"] = json.dumps(v)
        if config is not None:
            path = tmp_path / f"sim-{len(procs)}.json"
            path.write_text(json.dumps(config))
            e["SPARKCTL_SIM_CONFIG"] = str(path)
        e.update(env or {})
        full = ["--model-path", model, "--host", host, "--port", str(port), *(argv or [])]
        p = SimProc(full, e, host, port)
        procs.append(p)
        return p

    with raised_priority():
        yield start
    for p in procs:
        p.close()


@pytest.fixture
def vllm_sim(tmp_path: Path):
    """``vllm_sim(extra_argv, knobs=..., host=..., port=..., env=..., model=...)`` starts the emulator's vLLM dialect
    (``python -m sparkctl.sim serve MODEL --host H --port P ...``, testrig.simproc.SimProc); all are killed
    afterwards. ``kv_bytes_per_token`` defaults to 512: the tiny seeded model's cell at TP=2, so the shipped
    cpu-tiny-vllm's 64 MiB per rank hold 131,072 tokens, as on the real engine."""
    import json

    from testrig.simproc import SimProc
    from testrig.testenv import free_port

    procs: list[SimProc] = []

    def start(argv: list[str] | None = None, *, knobs: dict | None = None, host: str = "127.0.0.1",
              port: int | None = None, env: dict[str, str] | None = None, model: str = "/models/target") -> SimProc:
        port = port or free_port(host)
        e = {"SPARKCTL_SIM_BOOT_S": "0.3", "SPARKCTL_SIM_KV_BYTES_PER_TOKEN": "512"}
        for k, v in (knobs or {}).items():
            e[f"SPARKCTL_SIM_{k.upper()}"] = json.dumps(v)
        e.update(env or {})
        p = SimProc(["serve", model, "--host", host, "--port", str(port), *(argv or [])], e, host, port)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.close()
