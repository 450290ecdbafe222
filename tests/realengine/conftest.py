"""The real-engine tier's session: optionally a busy machine (``SPARKCTL_TEST_CPU_BURNERS=N``, testrig/burners.py).

    SPARKCTL_TEST_CPU_BURNERS=2 flock /tmp/sparkctl-realengine.lock ./bin/test tests/realengine -q

starts two CPU-bound processes before the tier's first test and kills them after its last (docs/testing.md).
"""
from __future__ import annotations

import logging

import pytest

from testrig.burners import BurnerSettingError, burners_requested, cpu_burners

log = logging.getLogger("sparkctl.tests.realengine")


def pytest_configure(config: pytest.Config) -> None:
    """A bad value stops the run before any test, with one line naming the variable (not an error per test)."""
    try:
        burners_requested()
    except BurnerSettingError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.fixture(scope="session", autouse=True)
def busy_machine():
    """The burners the environment asked for, spinning for the whole tier; none when it asked for none."""
    with cpu_burners(burners_requested()) as procs:
        if procs:
            log.warning("real-engine tier beside %d CPU-bound processes (pids %s)", len(procs),
                        ", ".join(str(p.pid) for p in procs))
        yield procs
