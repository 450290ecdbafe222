"""The steps each command runs, by name: the one list `plan`, `apply`, the journal and the crash matrix read.

A command's effects happen only inside its steps; `apply` journals each one before (intent) and after
(outcome), and calls `boundary(command, step, "before"|"after")` around it. `crash_points()` enumerates every
boundary from these definitions, so the crash test covers a step the day it is added here.

``SPARKCTL_CRASH_AT=<command>:<step>:<before|after>`` (tests only) makes the controller SIGKILL itself at
that boundary: no handler, no cleanup, exactly a ``kill -9`` landing there.
"""
from __future__ import annotations

import os
import signal
from collections.abc import Iterator

CRASH_ENV = "SPARKCTL_CRASH_AT"

# The step names, each once. `deploy.plan` makes one typed step class per name of `up` (its `name`), `deploy.apply`
# dispatches on those classes, `deploy.rollback` marks the restore's boundaries with these, the crash matrix
# enumerates them (`crash_points`), and the ledger's stages and journal lines carry them.
RECONCILE = "reconcile"
PREFLIGHT = "preflight"
IMAGE_BUILD, IMAGE_DISTRIBUTE, IMAGE_VERIFY = "image-build", "image-distribute", "image-verify"
STOP_OLD = "stop-old"
BOOT = "boot"
WARM_UP = "warm-up"
VERIFY = "verify"
HAND_OFF = "hand-off"
STOP_NEW = "stop-new"
RESTORE_BOOT, RESTORE_VERIFY, RESTORE_HAND_OFF = "restore-boot", "restore-verify", "restore-hand-off"

IMAGE_STEPS = (IMAGE_BUILD, IMAGE_DISTRIBUTE, IMAGE_VERIFY)

# `up` (and `rollback`, which is an `up` of the target profile): in this order; stop-old only when something
# is active. A failure after stop-old runs the restore steps.
UP_STEPS = (RECONCILE, PREFLIGHT, *IMAGE_STEPS, STOP_OLD, BOOT, WARM_UP, VERIFY, HAND_OFF)
RESTORE_STEPS = (STOP_NEW, RESTORE_BOOT, RESTORE_VERIFY, RESTORE_HAND_OFF)
DOWN_STEPS = (RECONCILE, "stop-active", "stop-rest")
REPAIR_STEPS = ("move-aside", "rebuild", "index")
# `bench --compare`: record what it will restore, deploy the other arm (its own `up` steps), measure, restore.
COMPARE_STEPS = ("compare-begin", "compare-arm", "compare-restore", "compare-end")

COMMANDS: dict[str, tuple[str, ...]] = {
    "up": UP_STEPS + RESTORE_STEPS,
    "rollback": UP_STEPS + RESTORE_STEPS,
    "down": DOWN_STEPS,
    "repair": REPAIR_STEPS,
    "bench-compare": COMPARE_STEPS,
}


def crash_points() -> Iterator[tuple[str, str, str]]:
    """Every (command, step, before|after) boundary of every command that changes the cluster."""
    for command, steps in COMMANDS.items():
        for step in steps:
            for when in ("before", "after"):
                yield command, step, when


def boundary(command: str, step: str, when: str) -> None:
    """A step boundary: SIGKILL this process here when SPARKCTL_CRASH_AT names it (see module docstring)."""
    want = os.environ.get(CRASH_ENV)
    if want and want == f"{command}:{step}:{when}":
        os.kill(os.getpid(), signal.SIGKILL)

# A replicated `up` (deploy/replicated.py, `replicas: K`): these steps around each replica's own `up`, which runs
# the steps above under the replica's own cluster, ledger and journal. Apart from COMMANDS: the crash matrix of
# tests/lifecycle drives the single-group commands; tests/scaleout/test_replicated_crash.py drives these.
REPLICATED_COMMAND = "up-replicated"
ROUTER_START, REPLICA_DETACH, REPLICA_UP, REPLICA_ATTACH, ROUTER_GATES = (
    "router-start", "replica-detach", "replica-up", "replica-attach", "router-gates")
REPLICATED_STEPS = (RECONCILE, ROUTER_START, REPLICA_DETACH, REPLICA_UP, REPLICA_ATTACH, ROUTER_GATES, HAND_OFF)


def replicated_crash_points() -> Iterator[tuple[str, str, str]]:
    """Every (command, step, before|after) boundary of a replicated `up`."""
    for step in REPLICATED_STEPS:
        for when in ("before", "after"):
            yield REPLICATED_COMMAND, step, when
