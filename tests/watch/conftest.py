"""`sparkctl watch` on the embedded cluster (emulator): a real watcher process (testrig.controller.SparkctlProcess),
real engines killed or stopped with real signals, and waits on observable conditions with bounded timeouts."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testrig.controller import SparkctlProcess
from testrig.watchrig import FAST


@pytest.fixture
def watcher(local_cluster) -> Iterator[Callable[..., SparkctlProcess]]:
    """Start `sparkctl watch FAST... ARGS` (the test's cluster through the environment); each one is stopped at
    teardown (SIGTERM, then SIGKILL), before the cluster's engines are."""
    started: list[SparkctlProcess] = []

    def start(*args: str, ready: bool = True) -> SparkctlProcess:
        run = SparkctlProcess(["watch", *FAST, *args])
        started.append(run)
        if ready:
            run.wait_for(r"watch +watching cluster", timeout=60)
        return run
    yield start
    import signal
    for run in started:
        if run.proc.poll() is None:
            run.kill(signal.SIGTERM)
            try:
                run.proc.wait(timeout=60)
            except Exception:  # noqa: BLE001 - teardown: never leave it running
                run.proc.kill()
        run.__exit__(None, None, None)


@pytest.fixture
def fault_profile(tmp_path: Path, profiles_dir: Path) -> Callable[..., tuple[str, Path]]:
    """A profile NAME = BASE + an emulator fault file carried in its env (read by each engine as it starts: rewrite
    the file and the next boot of that profile has the new fault). Returns (name, fault file)."""
    def make(name: str, config: dict, base: str = "d5") -> tuple[str, Path]:
        path = tmp_path / f"{name}-faults.json"
        path.write_text(json.dumps(config))
        (profiles_dir / f"{name}.yml").write_text(f"extends: {base}\nenv: {{SPARKCTL_SIM_CONFIG: '{path}'}}\n")
        return name, path
    return make
