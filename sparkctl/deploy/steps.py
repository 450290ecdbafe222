"""The steps each command runs, by name: the one list `plan`, `apply`, the journal and the crash matrix read.

A command's effects happen only inside its steps; `apply` journals each one before (intent) and after
(outcome), and calls `boundary(command, step, "before"|"after")` around it. `crash_points()` enumerates every
boundary from these definitions, so the crash test covers a step the day it is added here.

``SPARKCTL_CRASH_AT=<command>:<step>:<before|after>[:<KILL|INT|TERM|HUP>]`` (tests only) sends the controller
that signal at that boundary, once: KILL (the default, the 3-field form) is a ``kill -9`` landing there (no
handler, no cleanup); INT, TERM and HUP go through the CLI's own handlers (cli/signals.py) exactly as a user's
Ctrl-C, ``kill`` or a closed terminal would. A step that repeats (a tune's trials and A/B legs) is named by its
first occurrence, or one of them by ``<step>@<n>`` (``tune:trial@1:after``: after trial 1). Before the signal a
line ``sparkctl: SPARKCTL_CRASH_AT: SIG<X> at <point> (t=<unix time>)`` goes to stderr, so a test can time the
controller from the boundary to its exit.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator

CRASH_ENV = "SPARKCTL_CRASH_AT"

# The step names, each once. `deploy.plan` makes one typed step class per name of `up` (its `name`), `deploy.apply`
# dispatches on those classes, `deploy.rollback` marks the restore's boundaries with these, the crash matrix
# enumerates them (`crash_points`), and the ledger's stages and journal lines carry them.
SETTLE = "settle"
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
UP_STEPS = (SETTLE, PREFLIGHT, *IMAGE_STEPS, STOP_OLD, BOOT, WARM_UP, VERIFY, HAND_OFF)
RESTORE_STEPS = (STOP_NEW, RESTORE_BOOT, RESTORE_VERIFY, RESTORE_HAND_OFF)
DOWN_STEPS = (SETTLE, "stop-active", "stop-rest")
REPAIR_STEPS = ("move-aside", "rebuild", "index")
# The compare transaction (`bench --compare`, and each tune trial and A/B leg): record what it will restore, deploy
# the arm (its own `up` steps, one plan through `apply`, the deployment's command ARM_COMMAND), measure, restore
# what ran before (an `up` with command RESTORE_COMMAND, or `down` when nothing did), clear the record.
COMPARE_COMMAND = "bench-compare"
COMPARE_BEGIN, COMPARE_ARM, COMPARE_RESTORE, COMPARE_END = (
    "compare-begin", "compare-arm", "compare-restore", "compare-end")
COMPARE_STEPS = (COMPARE_BEGIN, COMPARE_ARM, COMPARE_RESTORE, COMPARE_END)
ARM_COMMAND, RESTORE_COMMAND = COMPARE_COMMAND, "bench-restore"   # the records' commands: the arm, the restore
TRANSACTION_COMMANDS = (ARM_COMMAND, RESTORE_COMMAND)

COMMANDS: dict[str, tuple[str, ...]] = {
    "up": UP_STEPS + RESTORE_STEPS,
    "rollback": UP_STEPS + RESTORE_STEPS,
    "down": DOWN_STEPS,
    "repair": REPAIR_STEPS,
    COMPARE_COMMAND: COMPARE_STEPS,
}


def crash_points() -> Iterator[tuple[str, str, str]]:
    """Every (command, step, before|after) boundary of every command that changes the cluster."""
    for command, steps in COMMANDS.items():
        for step in steps:
            for when in ("before", "after"):
                yield command, step, when


CRASH_SIGNALS: dict[str, signal.Signals] = {"KILL": signal.SIGKILL, "INT": signal.SIGINT, "TERM": signal.SIGTERM,
                                            "HUP": signal.SIGHUP}
_delivered: list[str] = []          # a handled signal is sent once per process (its cleanup passes boundaries too)


def parse_crash_at(text: str) -> tuple[str, str, str, signal.Signals] | None:
    """``cmd:step:when[:SIG]`` -> (cmd, step, when, signal); None when it is not of that form."""
    parts = text.split(":")
    if len(parts) not in (3, 4) or parts[2] not in ("before", "after"):
        return None
    sig = CRASH_SIGNALS.get(parts[3].upper().removeprefix("SIG")) if len(parts) == 4 else signal.SIGKILL
    return None if sig is None else (parts[0], parts[1], parts[2], sig)


def boundary(command: str, step: str, when: str, index: int | None = None) -> None:
    """A step boundary: signal this process here when SPARKCTL_CRASH_AT names it (see module docstring). `index`:
    the occurrence of a repeated step (``<step>@<index>`` names it; plain ``<step>`` is the first reached)."""
    want = os.environ.get(CRASH_ENV)
    if not want or _delivered:
        return
    parsed = parse_crash_at(want)
    if parsed is None:
        return
    cmd, name, at, sig = parsed
    if cmd != command or at != when or name not in (step, f"{step}@{index}"):
        return
    _delivered.append(want)
    print(f"sparkctl: {CRASH_ENV}: {sig.name} at {command}:{step}{'' if index is None else f'@{index}'}:{when} "
          f"(t={time.time():.3f})", file=sys.stderr, flush=True)
    os.kill(os.getpid(), sig)

# A replicated `up` (deploy/replicated.py, `replicas: K`): these steps around each replica's own `up`, which runs
# the steps above under the replica's own cluster, ledger and journal. Apart from COMMANDS: the crash matrix of
# tests/lifecycle drives the single-group commands; tests/scaleout/test_replicated_crash.py drives these.
REPLICATED_COMMAND = "up-replicated"
ROUTER_START, REPLICA_DETACH, REPLICA_UP, REPLICA_ATTACH, ROUTER_GATES = (
    "router-start", "replica-detach", "replica-up", "replica-attach", "router-gates")
REPLICATED_STEPS = (SETTLE, ROUTER_START, REPLICA_DETACH, REPLICA_UP, REPLICA_ATTACH, ROUTER_GATES, HAND_OFF)


def replicated_crash_points() -> Iterator[tuple[str, str, str]]:
    """Every (command, step, before|after) boundary of a replicated `up`."""
    for step in REPLICATED_STEPS:
        for when in ("before", "after"):
            yield REPLICATED_COMMAND, step, when


# `sparkctl tune` (sparkctl/tune/run.py): its journal written (tune-begin), each trial (a deploy + bench, its
# journal write after), each leg of the A/B confirmation, the restore of what ran before. `trial` and `confirm`
# repeat: ``trial@<i>`` is trial i (0: the baseline), ``confirm@<k>`` the k-th leg (1-based).
TUNE_COMMAND = "tune"
TUNE_BEGIN, TRIAL, CONFIRM, TUNE_RESTORE = "tune-begin", "trial", "confirm", "tune-restore"
TUNE_STEPS = (TUNE_BEGIN, TRIAL, CONFIRM, TUNE_RESTORE)


def tune_crash_points() -> Iterator[tuple[str, str, str]]:
    """Every (command, step, before|after) boundary of a tune (the first occurrence of a repeated step)."""
    for step in TUNE_STEPS:
        for when in ("before", "after"):
            yield TUNE_COMMAND, step, when
