"""The generated matrix of issue 31: every action the watcher takes on its own (`supervisor.ACTIONS`) under every
fault of the unattended world (`FAULTS`), on the embedded cluster (emulator engines, real processes), with a
real webhook server on loopback and a watcher driven poll by poll in this process. After each cell:

I1  every deployment the watcher started for the watched profile is the recorded one exactly (profile as deployed,
    every rank's argv, environment, node and image as recorded), or the restart was refused loudly (watch.json
    `refused`, a REFUSED line in its log, `sparkctl_watch_restart_refused` 1 and `sparkctl_watch_refusals_total`,
    a `refused` webhook event) and nothing new was started: a secret's variable missing or holding another value,
    a model moved are always refused (`REFUSED`; tests/watch/test_watch_refusals.py generates every such input);
I2  no wait holds the cluster lock: a poll that acts on nothing returns within the node deadline, a hook that
    hangs (the server holds the request, never answers) is still hanging when the action is over while the
    cluster lock is free, and a lock held by a user's command is waited for (the watcher never takes it then);
I3  nothing unbounded: the watcher's output (its stderr and watch.log) under a size bound, its event queue bounded.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.state.controller import live_lock_holder
from sparkctl.state.ledger import Ledger
from sparkctl.state.records import DeploymentRecord
from sparkctl.statefiles import ROOM_BYTES
from sparkctl.watch.supervisor import ACTIONS, Watcher, WatchOptions
from testrig.handles import pid_of
from testrig.testenv import need_module, small_tmpfs
from testrig.watchrig import Hook, alive, metric, wait_until

parser = need_module("prometheus_client.parser", "the watcher's metrics (the `watch` extra)")

API_KEY = "sk-matrix-51c0ffee77"
FAULTS = ("hook-hanging", "node-command-hanging", "state-dir-full", "lock-held", "secret-missing", "secret-changed",
          "model-gone", "profile-edited")
MODEL = "GLM-5.3-Flash-NVFP4"                   # d5's model: /models/MODEL, on each node under host_paths.models
# fault -> the outcome it must have and what the refusal must name
REFUSED = {"secret-missing": "SPARKCTL_API_KEY", "secret-changed": "SPARKCTL_API_KEY", "model-gone": f"/models/{MODEL}"}
NODE_DEADLINE_S = 1.0
OUTPUT_BOUND = 256 * 1024


@dataclass
class Cell:
    action: str
    fault: str
    inv: Path
    root: Path
    w: Watcher
    out: io.StringIO
    hook: Hook
    original: DeploymentRecord
    polls: list[tuple[float, bool]] = field(default_factory=list)      # (seconds, acted)
    after_acts: list[tuple[int, bool]] = field(default_factory=list)   # (events still being sent, lock free)
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def ledger(self) -> Ledger:
        return Ledger(self.root)

    def poll(self) -> None:
        before = (self.w.state.restarts, self.w.state.failures, self.w.state.gave_up, self.w.state.refused,
                  self.w.state.last_action)
        t0 = time.monotonic()
        self.w._poll_once()                   # the loop's own poll (a poll's failure is said, never raised)
        after = (self.w.state.restarts, self.w.state.failures, self.w.state.gave_up, self.w.state.refused,
                 self.w.state.last_action)
        self.polls.append((time.monotonic() - t0, before != after))
        if before != after and self.w.outbox is not None:     # the action is over: event on its way? lock free?
            self.after_acts.append((self.w.outbox.pending(), live_lock_holder(self.root) is None))

    def poll_until(self, pred: Callable[[], object], what: str, timeout: float = 90.0) -> None:
        end = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < end, f"{self.action} x {self.fault}: no {what} within {timeout:g}s:\n" + \
                self.out.getvalue()[-4000:]
            self.poll()
            time.sleep(0.05)

    def kill_rank_1(self) -> None:
        rec = self.ledger().active()
        pid = pid_of(rec, 1)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not alive(pid), "rank 1 gone", 20)

    def acted(self) -> bool:
        a = self.w.state.last_action or ""
        return a.startswith(("restarted ", "REFUSED", "restart of ", "gave up", "could not act"))


def _fill(path: Path) -> None:
    """Fill the filesystem of `path` to the last byte (ENOSPC)."""
    try:
        fd = os.open(path / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    except OSError:                            # already full
        return
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)


def _prepare_fault(fault: str, tmp_path: Path, inv: Path, monkeypatch, cleanups: list) -> None:
    """What a fault needs before the deployment is made."""
    if fault == "node-command-hanging":          # the nodes report a GPU: the metrics read it with nvidia-smi
        doc = yaml.safe_load(inv.read_text())
        for host in doc["all"]["children"]["sparks"]["hosts"].values():
            host["gpu_runtime"] = "nvidia"
        inv.write_text(yaml.safe_dump(doc, sort_keys=False))
        (tmp_path / "bin").mkdir()
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    if fault == "model-gone":                    # the nodes keep d5's model and drafter: the deployment has them
        models = tmp_path / "models"
        for d in (MODEL, "GLM-5.3-Flash-DFlash2"):
            (models / d).mkdir(parents=True)
        doc = yaml.safe_load(inv.read_text())
        for host in doc["all"]["children"]["sparks"]["hosts"].values():
            host["host_paths"] = {"models": str(models)}
        inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    if fault == "state-dir-full":
        stack = contextlib.ExitStack()
        mnt = stack.enter_context(small_tmpfs(tmp_path / "small", 4 * ROOM_BYTES))
        cleanups.append(stack.close)
        monkeypatch.setenv("SPARKCTL_STATE_DIR", str(mnt))


def _apply_fault(cell: Cell, tmp_path: Path, profiles_dir: Path, monkeypatch) -> Callable[[], None] | None:
    """The fault, once the deployment runs and the watcher watches it; returns how to lift it (lock-held)."""
    f = cell.fault
    if f == "node-command-hanging":
        shim = tmp_path / "bin" / "nvidia-smi"
        shim.write_text("#!/bin/sh\nexec sleep 300\n")
        shim.chmod(0o755)
    elif f == "state-dir-full":
        _fill(cell.root.parent)
    elif f == "secret-missing":
        monkeypatch.delenv("SPARKCTL_API_KEY")
    elif f == "secret-changed":                   # the key rotated in the watcher's environment
        monkeypatch.setenv("SPARKCTL_API_KEY", API_KEY + "-rotated")
    elif f == "model-gone":                       # the model moved on the nodes
        (tmp_path / "models" / MODEL).rename(tmp_path / "models" / f"{MODEL}.moved")
    elif f == "profile-edited":                   # saved, never deployed
        (profiles_dir / "cell.yml").write_text("extends: d5\nserver: {mem_fraction_static: 0.7}\n")
    elif f == "lock-held":
        code = ("import sys\nfrom pathlib import Path\nfrom sparkctl.state.ledger import Ledger\n"
                f"with Ledger(Path({str(cell.root)!r})).lock('down'):\n"
                "    print('held', flush=True)\n    sys.stdin.read()\n")
        holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        stdin, stdout = holder.stdin, holder.stdout
        assert stdin is not None and stdout is not None         # both are pipes
        assert stdout.readline().strip() == "held"

        def lift() -> None:
            stdin.close()
            holder.wait(timeout=30)

        def lift_if_held() -> None:
            if holder.poll() is None:
                lift()
        cell.cleanups.append(lift_if_held)
        return lift
    return None


def _restart(cell: Cell, lift: Callable[[], None] | None) -> str:
    """Kill rank 1 and poll until the watcher acted; 'ok', 'refused' or 'failed'."""
    cell.kill_rank_1()
    if lift is not None:                          # a user's command holds the lock: waited for, never taken
        for _ in range(4):
            cell.poll()
        assert cell.w.state.restarts == 0 and "waiting: `sparkctl down`" in cell.out.getvalue()
        assert all(s < NODE_DEADLINE_S + 3 for s, _ in cell.polls), cell.polls
        lift()
    cell.poll_until(cell.acted, "restart, refusal or failure")
    a = cell.w.state.last_action or ""
    return "ok" if a.startswith("restarted ") else "refused" if a.startswith("REFUSED") else "failed"


def _flap(cell: Cell, lift: Callable[[], None] | None) -> str:
    first = _restart(cell, lift)
    if first != "ok":
        return first
    cell.kill_rank_1()                            # the restarted group dies at once: a failed restart
    cell.poll_until(lambda: cell.w.state.flaps == 1, "flap counted")
    seen = time.monotonic()
    assert cell.w.state.failures >= 1 and "flapping" in (cell.w.state.last_action or "")
    assert cell.w.next_attempt > seen, "a flap is backed off, never restarted back to back"
    restarts = cell.w.state.restarts
    cell.poll_until(lambda: cell.w.state.restarts > restarts, "the restart after the backoff")
    assert time.monotonic() - seen >= cell.w.opts.backoff_s * 0.9
    cell.poll_until(cell.acted, "second restart")
    return "ok"


def _give_up(cell: Cell, lift: Callable[[], None] | None) -> str:
    first = _restart(cell, lift)
    if first == "refused" or (cell.w.state.last_action or "").startswith("could not act"):
        return first                              # nothing could be started, a rollback neither
    if first == "ok":
        cell.kill_rank_1()
    cell.poll_until(lambda: cell.w.state.gave_up, "give-up")
    assert cell.w.state.gave_up is not None and cell.w.state.gave_up.startswith("crash loop")
    return "gave-up"


DRIVERS: dict[str, Callable[[Cell, Callable[[], None] | None], str]] = {
    "restart": _restart, "flap": _flap, "give-up": _give_up}


def test_every_watcher_action_has_a_driver():
    assert set(DRIVERS) == set(ACTIONS)


def _gauge(url: str, name: str) -> float | None:
    return metric(url, name)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("action", list(ACTIONS))
def test_watcher_action_under_fault(action, fault, cli, local_cluster, profiles_dir, tmp_path, monkeypatch):
    from sparkctl.watch.log import WatchLog, WatchReporter
    from sparkctl.watch.metrics import WatchMetrics
    from sparkctl.watch.notify import Notifier
    from testrig.embedded import stop_recorded_engines

    cleanups: list[Callable[[], None]] = []
    monkeypatch.setenv("SPARKCTL_API_KEY", API_KEY)
    (profiles_dir / "cell.yml").write_text("extends: d5\n")
    _prepare_fault(fault, tmp_path, local_cluster, monkeypatch, cleanups)
    hook = Hook(hang=fault == "hook-hanging")
    metrics = None
    try:
        code, out, err = cli("up", "--profile", "cell", "--yes", "--json")
        assert code == 0, err
        ledger = Ledger.for_cluster(load_inventory(local_cluster).cluster.name)
        original = ledger.load(json.loads(out)["deployment"])
        assert any("--config" in s.argv for s in original.specs)       # a key-protected deployment
        stream = io.StringIO()
        reporter = WatchReporter(WatchLog(ledger.root / "watch.log"), stream)
        metrics = WatchMetrics(0, cluster=ledger.root.name)
        opts = WatchOptions(interval_s=0.1, backoff_s=1.0, backoff_max_s=2.0, fail_checks=1,
                            max_failures=1 if action == "give-up" else 3, node_deadline_s=NODE_DEADLINE_S)
        w = Watcher(load_inventory(local_cluster), reporter, opts, metrics=metrics,
                    notifier=Notifier(hook.url, timeout_s=60))
        cell = Cell(action, fault, local_cluster, ledger.root, w, stream, hook, original, cleanups=cleanups)
        w.begin()
        lift = _apply_fault(cell, tmp_path, profiles_dir, monkeypatch)
        outcome = DRIVERS[action](cell, lift)
        for _ in range(3):                        # and the watcher goes on checking, at once
            cell.poll()
        _invariants(cell, outcome, metrics, ledger)
    finally:
        if metrics is not None:
            metrics.close()
        watcher = locals().get("w")
        if watcher is not None and watcher.outbox is not None:
            watcher.outbox.close(0.5)
        hook.close()
        stop_recorded_engines(local_cluster)       # before the state directory goes (its records name them)
        for fn in reversed(cleanups):
            fn()


def _invariants(cell: Cell, outcome: str, metrics, ledger: Ledger) -> None:
    text = cell.out.getvalue()
    orig = cell.original
    if cell.fault in REFUSED:
        assert outcome == "refused", (outcome, text[-3000:])
    # I1: what the watcher started for the watched profile is the recorded deployment, exactly
    started = [ledger.load(i) for i in ledger.record_ids() if i != orig.id]
    for rec in started:
        if rec.profile == "cell" and rec.command == "up":
            assert rec.profile_data == orig.profile_data, f"{rec.id} is not the profile as deployed"
            assert [s.model_dump(include={"argv", "env", "node", "image"}) for s in rec.specs] == \
                [s.model_dump(include={"argv", "env", "node", "image"}) for s in orig.specs], rec.id
    if outcome == "refused":
        assert not started, [r.id for r in started]
        assert cell.w.state.refused and "REFUSED to restart" in text and REFUSED[cell.fault] in cell.w.state.refused
        assert _gauge(metrics.url, "sparkctl_watch_restart_refused") == 1
        assert (_gauge(metrics.url, "sparkctl_watch_refusals_total") or 0) >= 1
        wait_until(lambda: any(e["event"] == "refused" for e in cell.hook.events), "the refused event", 10)
    if cell.fault == "profile-edited" and outcome in ("ok", "gave-up"):
        assert any(r.profile == "cell" for r in started), "the restart happened (from the recorded profile)"
    # I2: no wait holds the lock
    idle = [s for s, acted in cell.polls if not acted]
    assert idle and max(idle) < NODE_DEADLINE_S + 3, f"a poll that acted on nothing took {max(idle):.1f}s"
    assert all(free for _, free in cell.after_acts), cell.after_acts       # never left holding the lock
    if cell.fault == "hook-hanging":
        assert cell.hook.held, "the hook got the events and never answered"
        assert any(pending for pending, _ in cell.after_acts), "an action ended while its event still hung"
        with ledger.lock("test"):                                              # and a command takes the lock now
            pass
    if cell.fault == "node-command-hanging":
        assert "node samples not read within 1s" in text, "the hanging nvidia-smi was run and cut at the deadline"
    # I3: bounded output
    assert len(text) < OUTPUT_BOUND and (cell.root / "watch.log").stat().st_size < OUTPUT_BOUND \
        if (cell.root / "watch.log").exists() else len(text) < OUTPUT_BOUND
    assert cell.w.outbox is not None and cell.w.outbox.pending() <= 32 + 1
