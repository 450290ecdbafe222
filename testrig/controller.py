"""Tests' handle on a `sparkctl` subprocess: follow its progress on stderr, signal it at a chosen moment.

Waits are on observable progress (a stderr line), never a fixed sleep. Example::

    with SparkctlProcess(["up", "--profile", "d5", "--yes"]) as run:
        run.wait_for("rank 0 started")
        run.kill(signal.SIGKILL)
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

Cli = Callable[..., tuple[int, str, str]]
REPO = Path(__file__).resolve().parents[1]


class SparkctlProcess:
    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "sparkctl", *args], env=dict(env or os.environ),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._done = False
        self.stdout = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._out_reader = threading.Thread(target=self._read_out, daemon=True)
        self._out_reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._done = True
            self._changed.notify_all()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        self.stdout = self.proc.stdout.read()

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, *, after: str | None = None, timeout: float = 180.0) -> str:
        """Block until a stderr line matches `pattern` (regex), counting only lines after the first match of
        `after`; the line, or AssertionError with all stderr so far (also when the process ended first)."""
        rx, start_rx = re.compile(pattern), re.compile(after) if after else None

        def found() -> str | None:
            lines = self.lines
            if start_rx is not None:
                first = next((i for i, ln in enumerate(lines) if start_rx.search(ln)), None)
                if first is None:
                    return None
                lines = lines[first + 1:]
            return next((ln for ln in lines if rx.search(ln)), None)
        with self._changed:
            ok = self._changed.wait_for(lambda: found() is not None or self._done, timeout=timeout)
            line = found()
        assert ok and line is not None, f"no stderr line matching {pattern!r}:\n{self.stderr}"
        return line

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 120.0) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"`sparkctl` (pid {self.proc.pid}) still runs {timeout:.0f} s later; its stderr:"
                                 f"\n{self.stderr}") from None
        self._reader.join(timeout=10)
        self._out_reader.join(timeout=10)
        return code

    def __enter__(self) -> SparkctlProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.wait()


def run_in_process(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """`sparkctl ARGS` in this process with `env` as its whole environment for the call (os.environ restored after);
    (exit code, stdout, stderr). For the commands a test runs around the one under test (`status`, the next `up`,
    `down`), where the process boundary is not what is checked: it saves an interpreter start and sparkctl's imports
    (about 1 s a call at load 5 on 2 cores, 4-6 s at load 8). A signalled or killed command stays a real process
    (SparkctlProcess, run_at_boundary). Engines it starts are children of this process until they end; sparkctl
    counts a zombie as dead (sparkctl/nodes/procfs.py), so nothing waits on one."""
    import io

    from sparkctl.cli.main import main

    saved_env, saved_streams = dict(os.environ), (sys.stdout, sys.stderr)
    out, err = io.StringIO(), io.StringIO()
    os.environ.clear()
    os.environ.update(env)
    sys.stdout, sys.stderr = out, err
    try:
        code = main(list(args))
    finally:
        sys.stdout, sys.stderr = saved_streams
        os.environ.clear()
        os.environ.update(saved_env)
    return code, out.getvalue(), err.getvalue()


# A warm-up that lasts while the gates before it stay quick, for killing something during warm-up: the emulator
# prefills at SLOW_PREFILL_TPS tokens/s, the gates' chat prompt is 20 tokens (0.4 s), SLOW_WARM_UP's prompt 3000
# (60 s). (A slow ttft_base_s would slow the gates' generation as much, and the kill would wait for it.)
SLOW_PREFILL_TPS = 50
SLOW_WARM_UP = "warmup:\n  prompt: '" + "slow " * 3000 + "'\n"


def kill_up_at(marker: str, profile: str, *, after: str | None = None, cli: Cli | None = None) -> int:
    """Run `sparkctl up --profile PROFILE --yes`, SIGKILL it once stderr shows `marker` (after `after`); the dead
    controller's pid. With `cli`, first checks that `status` names the `up` in progress (exit 8)."""
    with SparkctlProcess(["up", "--profile", profile, "--yes"]) as run:
        run.wait_for(marker, after=after)
        if cli is not None:
            code, out, _ = cli("status")
            assert code == 8 and f"`sparkctl up` in progress (pid {run.pid} on" in out, out
        run.kill(signal.SIGKILL)
        assert run.wait() == -signal.SIGKILL
        return run.pid


def killed_at(point: str, *args: str, timeout: float = 300.0) -> str:
    """Run `sparkctl ARGS` in a subprocess with ``SPARKCTL_CRASH_AT=point``: it SIGKILLs itself at that boundary
    (sparkctl/deploy/steps.py; no handler runs). Fails naming its stderr when it ends any other way; its stderr."""
    from sparkctl.deploy.steps import CRASH_ENV

    env = {**os.environ, CRASH_ENV: point, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-m", "sparkctl", *args], env=env, capture_output=True, text=True,
                       timeout=timeout, cwd=str(REPO))
    assert p.returncode == -signal.SIGKILL, f"`sparkctl {' '.join(args)}` did not reach {point} " \
        f"(exit {p.returncode}):\n{p.stderr[-3000:]}"
    return p.stderr


# The gates every successful `up` reports (sparkctl.deploy.verify), each judged from the engine's own answers.
VERIFY_GATES = frozenset({"health", "models", "settings", "capacity", "workers", "smoke"})


def cli_ok(cli: Cli, *args: str) -> dict[str, Any]:
    """`sparkctl ARGS --yes --json` that must exit 0: its JSON (else the assertion shows the end of its stderr)."""
    code, out, err = cli(*args, "--yes", "--json")
    assert code == 0, err[-4000:]
    return json.loads(out)


def passed_gates(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The gates of an `up`/`rollback` result by name, after checking every verify gate is there and passed."""
    gates = {g["name"]: g for g in res["gates"]}
    assert set(gates) >= VERIFY_GATES and all(g["ok"] for g in gates.values()), gates
    return gates


def active_profile(cli: Cli, expect_code: int = 0) -> str:
    """The profile `status --json` says is active, after checking `status` exits `expect_code`."""
    code, out, err = cli("status", "--json")
    assert code == expect_code, err
    return json.loads(out)["profile"]


def assert_status_interrupted(cli: Cli, pid: int, during: str) -> dict[str, Any]:
    """`status` exits 8 and says the deployment was interrupted by the death of `pid` during `during`, with both
    ranks alive; its JSON says the same."""
    code, out, err = cli("status")
    assert code == 8, out + err
    assert f"was interrupted (controller pid {pid} on" in out and f"during {during}: ranks 0, 1 alive" in out, out
    code, out, _ = cli("status", "--json")
    data = json.loads(out)
    assert code == 8 and not data["ok"] and data["interrupted"][0]["controller_pid"] == pid
    return data


BOUNDARY_LINE = re.compile(r"sparkctl: SPARKCTL_CRASH_AT: SIG\w+ at ")
STOPPING_LINE = re.compile(r"sparkctl: SIG\w+: stopping")


class AtBoundary:
    """A `sparkctl` run signalled at a step boundary (``SPARKCTL_CRASH_AT=<point>:<SIG>``), timed by the monotonic
    clock of this process as its stderr lines arrive: from the boundary's own line to the handler's "stopping"
    line (the signal acted on) and to the exit."""

    def __init__(self, code: int, stdout: str, stderr: str, to_stop_s: float | None, to_exit_s: float | None) -> None:
        self.code, self.stdout, self.stderr = code, stdout, stderr
        self.to_stop_s, self.to_exit_s = to_stop_s, to_exit_s

    @property
    def reached(self) -> bool:
        return self.to_exit_s is not None


class SignalRig:
    """An embedded cluster of a signal matrix's own: its inventory (emulator knobs `sim`), state and profiles
    directories, an environment that holds only these of sparkctl's variables (and `extra`), and `run`: `sparkctl
    ARGS` in this process (`status`, `down` and the next command; the signalled command itself is a real process,
    `run_at_boundary`)."""

    def __init__(self, root: Path, sim: dict[str, Any], *, prefix: str = "t", nodes: int = 2, **extra: str) -> None:
        from testrig.embedded import write_embedded_inventory
        self.inv = write_embedded_inventory(root / "inventory.yml", sim, prefix=prefix, nodes=nodes)
        self.profiles_dir = root / "profiles"
        self.profiles_dir.mkdir(exist_ok=True)
        self.state = root / "state"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCTL_")}
        self.env.update(SPARKCTL_STATE_DIR=str(self.state), SPARKCTL_INVENTORY=str(self.inv),
                        SPARKCTL_PROFILES_DIR=str(self.profiles_dir), **extra)

    def run(self, *args: str) -> tuple[int, str, str]:
        return run_in_process(list(args), self.env)

    def stop_engines(self) -> None:
        """Stop every engine this rig's ledger recorded (whatever state the last point left it in)."""
        from unittest import mock

        from testrig.embedded import stop_recorded_engines
        with mock.patch.dict(os.environ, SPARKCTL_STATE_DIR=str(self.state)):
            stop_recorded_engines(self.inv)


class SignalTimes:
    """What a signal matrix measured at each point (boundary -> "stopping" line, boundary -> exit), summed up in one
    line when its rig goes (`summary`); `add` takes each point's `AtBoundary`."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.points: list[tuple[str, float | None, float | None]] = []

    def add(self, point: str, sig: str, r: AtBoundary) -> None:
        self.points.append((f"{point}:{sig}", r.to_stop_s, r.to_exit_s))

    def summary(self, label: str | None = None) -> str | None:
        if not self.points:
            return None
        acted = [s for _, s, _ in self.points if s is not None]
        exits = [e for _, _, e in self.points if e is not None]
        return (f"{label or self.label}: {len(self.points)} points; boundary -> stopping line max "
                f"{max(acted, default=0):.3f} s; boundary -> exit max {max(exits, default=0):.2f} s")


HANDLED_SIGNALS = ("INT", "TERM", "HUP")


def dealt_signals(points: list[str], signals: tuple[str, ...] = HANDLED_SIGNALS) -> list[tuple[str, str]]:
    """Each point with one of `signals`, dealt in turn (point k gets signal k mod n): every point meets a signal and
    every signal about 1/n of the points, not every pair.

    SIGINT, SIGTERM and SIGHUP take one path in sparkctl: `cli/signals.py` installs one handler for the three, which
    raises `Interrupted` for each; they differ only in the name said and the exit code (128 + the signal), which
    tests/unit/test_cli_signals.py checks for each and every matrix point checks for the signal it meets. Every pair
    tested that one path three times: the three signal matrices were ~2,660 s of the suite's worker time (full run,
    4 workers, 2026-12-06). SIGKILL is another path (no handler; the next command settles the intent records): a
    matrix that covers it keeps it at every point (tests/lifecycle/test_crash_matrix.py, tests/tune/...)."""
    return [(p, signals[k % len(signals)]) for k, p in enumerate(points)]


def run_at_boundary(args: list[str], point: str, sig: str, env: dict[str, str], *,
                    timeout: float = 300.0) -> AtBoundary:
    """`sparkctl ARGS` with ``SPARKCTL_CRASH_AT=<point>:<sig>`` (sig KILL, INT, TERM or HUP; sparkctl/deploy/steps.py);
    its exit code, output and timings (None when the boundary was never reached)."""
    import time

    from sparkctl.deploy.steps import CRASH_ENV

    arrivals: list[tuple[float, str]] = []
    with SparkctlProcess(args, env={**env, CRASH_ENV: f"{point}:{sig}"}) as run:
        seen = 0
        deadline = time.monotonic() + timeout
        while run.proc.poll() is None and time.monotonic() < deadline:
            with run._changed:
                def grown(n: int = seen) -> bool:
                    return len(run.lines) > n or run._done
                run._changed.wait_for(grown, timeout=0.05)
                now, fresh = time.monotonic(), run.lines[seen:]
            seen += len(fresh)
            arrivals += [(now, ln) for ln in fresh]
        code = run.wait(timeout=max(1.0, deadline - time.monotonic()))
        ended = time.monotonic()
        with run._changed:
            arrivals += [(ended, ln) for ln in run.lines[seen:]]
        t_boundary = next((t for t, ln in arrivals if BOUNDARY_LINE.search(ln)), None)
        t_stop = next((t for t, ln in arrivals if STOPPING_LINE.search(ln)), None)
        return AtBoundary(code, run.stdout, run.stderr,
                          None if t_boundary is None or t_stop is None else t_stop - t_boundary,
                          None if t_boundary is None else ended - t_boundary)
