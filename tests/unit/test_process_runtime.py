"""The process runtime. Logs per boot attempt: a restart of the same deployment (a restore, a rollback's restart)
reads only its own attempt's lines, so a fatal line an earlier attempt left (a traceback, half a line of a
SIGKILLed engine) never fails the new boot; an engine killed by SIGKILL leaves no traceback of the pipe.
Secrets: on tmpfs (0700 directories, 0400 files), gone when their engine stops, swept by `cleanup_secrets`
after a kill -9, kept while their engine runs."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.deploy.boot import boot
from sparkctl.deploy.progress import Reporter
from sparkctl.errors import StateDirError
from sparkctl.nodes import procfs
from sparkctl.nodes.handles import ProcessHandle
from sparkctl.nodes.process import ProcessRuntime
from sparkctl.nodes.runtime import Handle, Runtime
from sparkctl.nodes.secretdirs import own_private_dir, secrets_home
from sparkctl.sglang.render import render
from testrig.embedded import write_embedded_inventory
from testrig.testenv import signal_and_settle

FAST = {"boot_s": 0.3, "decode_tps": 4000}
STALE = "Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


@pytest.fixture
def setup(tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    inv = load_inventory(write_embedded_inventory(tmp_path / "inventory.yml", FAST))
    env = {"SPARKCTL_API_KEY": "sk-proc-rt-5150", "HF_TOKEN": "hf_procRT0042"}
    specs = render(load_profile("d5"), inv, environ=env).specs
    assert all(s.secret_files for s in specs)
    rt = ProcessRuntime(tmp_path / "logs" / "dep-1", inv.cluster.sim, secrets_root=tmp_path / "secrets")
    started: list[tuple[Runtime, Handle]] = []
    yield rt, specs, started
    for _, h in started:
        assert isinstance(h, ProcessHandle)
        rt.stop(h, timeout_s=3)


def _boot(rt, specs, started):
    return boot(specs, lambda node: rt, "dep-1", Reporter(quiet=True), timeout_s=60, started=started)


def test_a_restart_reads_only_its_own_attempt(setup):
    rt, specs, started = setup
    first = _boot(rt, specs, started)
    for h in first.handles:
        rt.stop(h, timeout_s=5)
    for h in first.handles:           # what a crashed attempt can leave: a traceback, the last line cut short
        with open(h.log, "a") as fh:
            fh.write(STALE)
    second = _boot(rt, specs, started)              # would fail at once on the stale OOM without the offset
    for old, new in zip(sorted(first.handles, key=lambda h: h.rank), sorted(second.handles, key=lambda h: h.rank)):
        assert new.log == old.log and new.log_offset > old.log_offset
        whole = Path(new.log).read_text()
        assert whole.endswith("\n") and (STALE + "\n") in whole     # the cut line was ended, not glued to ours
        mine, _ = rt.read_log(new, 0)
        assert "Traceback" not in mine and "OutOfMemoryError" not in mine
        assert "server_args={" in mine
        theirs, _ = rt.read_log(old, 0)
        assert "OutOfMemoryError" in theirs          # an earlier attempt's handle still reads its own lines


def test_an_engine_killed_by_sigkill_leaves_no_pipe_traceback(setup):
    rt, specs, started = setup
    result = _boot(rt, specs, started)
    h0 = next(h for h in result.handles if h.rank == 0)
    engine = int(Path(f"/proc/{h0.pid}/task/{h0.pid}/children").read_text().split()[0])
    os.kill(engine, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while rt.liveness(h0).alive and time.monotonic() < deadline:
        time.sleep(0.05)
    live = rt.liveness(h0)
    assert not live.alive and live.exit_code == -signal.SIGKILL, live
    text, _ = rt.read_log(h0, 0)
    assert "Traceback" not in text and "logpipe" not in text


def _engine_of(h) -> int:
    return int(Path(f"/proc/{h.pid}/task/{h.pid}/children").read_text().split()[0])


def _gone(pid: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = procfs.proc_stat(pid)
        if st is None or st[0] == "Z":
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} still runs")


def test_secrets_live_on_tmpfs_privately_and_go_when_the_engine_stops(setup):
    rt, specs, started = setup
    result = _boot(rt, specs, started)
    assert procfs.fs_type(rt.secrets_root) == "tmpfs" and rt.secrets_root.is_relative_to(secrets_home())
    for h in result.handles:
        sdir = rt.secrets_dir("dep-1", h.rank)
        assert oct(sdir.stat().st_mode & 0o777) == oct(0o700)
        assert {p.name: oct(p.stat().st_mode & 0o777) for p in sdir.iterdir()} == \
            {"engine-secrets.yaml": oct(0o400), "hf-token": oct(0o400)}
        assert str(sdir) in procfs.cmdline(h.pid)        # the pipe names it: how "in use" is told
    for h in result.handles:
        rt.stop(h, timeout_s=5)
        assert not rt.secrets_dir("dep-1", h.rank).exists()
    assert not (rt.secrets_root / "dep-1").exists()


def test_cleanup_secrets_sweeps_what_a_kill_9_left_and_keeps_a_running_engines(setup):
    rt, specs, started = setup
    result = _boot(rt, specs, started)
    h0, h1 = sorted(result.handles, key=lambda h: h.rank)
    engine = _engine_of(h1)
    os.kill(h1.pid, signal.SIGKILL)                  # pipe and engine of rank 1 die: nobody removes the files
    _gone(h1.pid)
    _gone(engine)
    assert rt.secrets_dir("dep-1", 1).exists()
    other = ProcessRuntime(rt.log_dir, rt.sim_knobs, secrets_root=rt.log_dir.parent.parent / "secrets")
    assert other.secrets_root == rt.secrets_root     # a later command (settle, down) finds the same place
    removed = other.cleanup_secrets()
    assert removed == [str(rt.secrets_dir("dep-1", 1))]
    assert not rt.secrets_dir("dep-1", 1).exists() and rt.secrets_dir("dep-1", 0).exists()   # rank 0 still runs
    assert other.cleanup_secrets() == []
    rt.stop(h0, timeout_s=5)
    assert not (rt.secrets_root / "dep-1").exists()


def test_a_planted_secrets_home_is_refused_not_followed(tmp_path, monkeypatch):


    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    home = tmp_path / "run" / "sparkctl"
    home.parent.mkdir()
    home.symlink_to(target)
    with pytest.raises(StateDirError, match="not a directory of this user"):
        own_private_dir(home)
    assert oct(target.stat().st_mode & 0o777) == oct(0o755)        # never tightened through the link
    home.unlink()
    assert own_private_dir(home) == home and oct(home.stat().st_mode & 0o777) == oct(0o700)


def test_secrets_home_prefers_a_tmpfs_xdg_runtime_dir(tmp_path):
    shm = Path("/dev/shm")
    assert secrets_home({"XDG_RUNTIME_DIR": str(shm)}) == shm / "sparkctl"                 # a tmpfs: used
    assert secrets_home({"XDG_RUNTIME_DIR": str(tmp_path)}) == shm / f"sparkctl-{os.getuid()}"   # not a tmpfs
    assert secrets_home({}) == shm / f"sparkctl-{os.getuid()}"


# -- sparkctl's own helper (the log pipe) never runs with the rank's environment ---------------------------------

def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode("utf-8", "surrogateescape").split("\0") if "=" in item)


def _profile_with_env(tmp_path: Path, env: dict[str, str]):
    doc = tmp_path / "profiles" / "probe.yml"
    doc.parent.mkdir(exist_ok=True)
    doc.write_text("description: probe\nextends: d5\nenv:\n" + "".join(f"  {k}: {v!r}\n" for k, v in env.items()))
    return load_profile(str(doc))


def test_the_log_pipe_never_gets_the_ranks_environment_and_the_engine_gets_all_of_it(setup, tmp_path, monkeypatch):
    """A profile env the value policy allows reaches the engine, never the pipe: the pipe's /proc environ holds
    none of the rank's engine variables (the profile's, the ones sparkctl sets per rank, the emulator knobs), and
    the file that carried them to the engine is gone once the engine runs."""
    rt, _, started = setup
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)     # the runtime sets it for the engine only
    inv = load_inventory(tmp_path / "inventory.yml")
    env = {"NCCL_DEBUG": "INFO", "SPARKCTL_PROBE_PROFILE_VAR": "probe-1"}
    specs = render(_profile_with_env(tmp_path, env), inv,
                   environ={"SPARKCTL_API_KEY": "sk-proc-rt-5150", "HF_TOKEN": "hf_procRT0042"}).specs
    result = _boot(rt, specs, started)
    for h in result.handles:
        spec = next(s for s in specs if s.rank == h.rank)
        assert env.items() <= spec.env.items() and "SGLANG_HOST_IP" in spec.env
        engine_keys = set(spec.env) | {"SPARKCTL_SIM_CLUSTER", "SPARKCTL_SIM_SGLANG_VERSION", "PYTHONUNBUFFERED"}
        pipe, engine = _environ(h.pid), _environ(_engine_of(h))
        assert "sparkctl.nodes.logpipe" in procfs.cmdline(h.pid) and "-I" in procfs.cmdline(h.pid)
        assert not engine_keys & set(pipe), sorted(engine_keys & set(pipe))
        assert engine_keys <= set(engine) and env.items() <= engine.items()
        assert engine["HF_TOKEN_PATH"] == str(rt.secrets_dir("dep-1", h.rank) / "hf-token")
        for secret in ("sk-proc-rt-5150", "hf_procRT0042"):          # neither of them carries a secret
            assert secret not in "\0".join(f"{k}={v}" for k, v in {**pipe, **engine}.items())
        assert {p.name for p in rt.secrets_dir("dep-1", h.rank).iterdir()} == {"engine-secrets.yaml", "hf-token"}


SITECUSTOMIZE = ("import os, sys\n"
                 "with open(os.path.join({marks!r}, str(os.getpid())), 'w') as fh:\n"
                 "    fh.write(' '.join(sys.orig_argv))\n")


@pytest.mark.parametrize("where", ["rank", "rank and caller"])
def test_a_planted_sitecustomize_runs_in_the_engine_never_in_the_pipe(setup, tmp_path, monkeypatch, where):
    """The profile policy refuses PYTHONPATH; below it, at the runtime, a rank's env is the user's to set for the
    engine. A LaunchSpec whose env points PYTHONPATH at a planted sitecustomize (and, in the second case, the
    caller's own environment too): it runs in the engine (proof that it was reachable), never in the pipe."""
    import dataclasses

    rt, specs, started = setup
    plant, marks = tmp_path / "plant", tmp_path / "marks"
    plant.mkdir()
    marks.mkdir()
    (plant / "sitecustomize.py").write_text(SITECUSTOMIZE.format(marks=str(marks)))
    if where == "rank and caller":
        monkeypatch.setenv("PYTHONPATH", str(plant))
    specs = [dataclasses.replace(s, env={**s.env, "PYTHONPATH": str(plant)}) for s in specs]
    result = _boot(rt, specs, started)
    ran = {int(p.name): p.read_text() for p in marks.iterdir()}
    for h in result.handles:
        engine = _engine_of(h)
        assert "sparkctl.sim" in ran.get(engine, ""), (engine, ran)     # the engine ran it
        assert h.pid not in ran, ran[h.pid]                              # the pipe did not
    assert not any("logpipe" in argv for argv in ran.values()), ran


def test_liveness_reads_every_state_each_call_and_walks_the_tree_at_most_once_a_ttl(setup, monkeypatch):
    """Boot calls liveness ten times a second per rank, on the cores the engines boot on: the tree of a real SGLang
    rank is ~70 thread children files, so the walk is reused for `tree_ttl_s`; a stop is still seen on the next
    call, because each process's state is read every time."""
    rt, specs, started = setup
    booted = _boot(rt, specs, started)
    handle = booted.handles[0]
    walks: list[int] = []
    real = procfs.descendants

    def counted(pid: int) -> list[int]:
        walks.append(pid)
        return real(pid)
    monkeypatch.setattr(procfs, "descendants", counted)
    rt.tree_ttl_s = 0.0
    assert rt.liveness(handle).alive and walks == [handle.pid]              # past the TTL: walked again
    rt.tree_ttl_s = 60.0
    assert rt.liveness(handle).alive and rt.liveness(handle).alive and walks == [handle.pid]
    engine = real(handle.pid)[0]
    signal_and_settle(engine, signal.SIGSTOP)
    try:
        live = rt.liveness(handle)                     # the cached tree, the state read now
        assert not live.alive and f"pid {engine}" in live.detail and "state T" in live.detail, live.detail
        assert walks == [handle.pid]
    finally:
        os.kill(engine, signal.SIGCONT)
    rt.tree_ttl_s = 0.0
    assert rt.liveness(handle).alive and walks == [handle.pid, handle.pid]


def test_an_interrupt_in_start_after_the_fork_leaves_no_process_of_the_rank(setup):
    """`start` interrupted at any line from the fork (inside `Popen`) to its return, with the forked log pipe given
    time to exec first (a loaded machine's order: it then names the rank's secret directory, so the clean-up would
    keep the secrets it reads and start the engine nobody recorded): no process of the rank is left, and its
    secrets are gone."""
    import subprocess

    from sparkctl.errors import Interrupted
    from testrig.linetrap import LineTrap, Target, sigint, source_line
    rt, specs, _ = setup
    spec = specs[0]
    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    forked = f"_execute_child:{source_line(execute_child, 'self._child_created = True')}"     # the fork returned

    def pipe_running() -> BaseException:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(
                "sparkctl.nodes.logpipe" in procfs.cmdline(p) for p in procfs.children(os.getpid())):
            time.sleep(0.01)
        return sigint()

    def trap(at: int | None, make=sigint) -> LineTrap:
        return LineTrap([Target.code(ProcessRuntime.start.__code__), Target.code(execute_child.__code__)], at,
                        make=make)
    count = trap(None)
    with count.armed():
        handle = rt.start(spec, "dep-1")
    rt.stop(handle, timeout_s=5)
    points = range(count.trail.index(forked), len(count.trail))
    assert len(points) > 5, count.trail
    left = []
    for at in points:
        t = trap(at, pipe_running)
        with pytest.raises(Interrupted), t.armed():
            rt.start(spec, "dep-1")
        time.sleep(0.3)                               # what a surviving pipe would do next: start the engine
        named = procfs.processes_naming(str(rt.log_dir / f"rank{spec.rank}.log"))
        if named or rt.secrets_dir("dep-1", spec.rank).exists():
            left.append((t.where, named))
            for pid in named:
                os.kill(pid, signal.SIGKILL)
    assert not left, left


def test_a_vllm_ranks_tmpdir_is_short_enough_for_its_ipc_sockets_and_private(tmp_path):
    """vLLM binds ZMQ IPC sockets at `ipc://$TMPDIR/<uuid4>` (at most 107 bytes of path: a longer TMPDIR failed its
    boot with "ipc path ... is longer than 107 characters"); the rank's TMPDIR is short whatever the state directory,
    and is refused when something else (a link) sits at its name."""
    deep = tmp_path / ("very-long-state-directory-name-" * 4) / "state"
    rt = ProcessRuntime(deep / "logs" / "dep", secrets_root=deep / "secrets")
    tmp = rt.tmp_dir("20261206T204456Z-cpu-tiny-vllm-0d5e-with-a-long-name", 7)
    assert len(f"{tmp}/{'0' * 36}") <= 107 and tmp.parent == secrets_home()
    assert tmp != rt.tmp_dir("20261206T204456Z-cpu-tiny-vllm-0d5e-with-a-long-name", 6)
    secrets_home().mkdir(mode=0o700, exist_ok=True)
    tmp.symlink_to(tmp_path)
    try:
        with pytest.raises(StateDirError):
            own_private_dir(tmp)
    finally:
        tmp.unlink()


def test_a_child_caught_inside_its_exec_counts_as_forked_by_the_start(monkeypatch):
    """An interrupt can land while the child a start forked is inside execve: its /proc command line reads empty for
    that moment (a loaded machine stretched it: a router start interrupted at `_execute_child` ran unrecorded).
    forked_since reads again, and a child still unreadable (and not a zombie) is counted as the start's own."""
    from sparkctl.nodes import procfs

    before = set(procfs.children(os.getpid()))
    child = subprocess.Popen(["sleep", "30"])
    try:
        real = procfs.cmdline
        monkeypatch.setattr(procfs, "cmdline", lambda pid: [] if pid == child.pid else real(pid))
        assert procfs.forked_since(before, "no-such-marker", settle_s=0.05) == [child.pid]
        monkeypatch.setattr(procfs, "cmdline", real)
        assert procfs.forked_since(before, "no-such-marker", settle_s=0.05) == []     # exec'd: not this start's
        assert procfs.forked_since(before, "sleep", settle_s=0.05) == [child.pid]
    finally:
        child.kill()
        child.wait()
