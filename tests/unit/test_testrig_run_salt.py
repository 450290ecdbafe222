"""The per-run salt the image tests add to a seconds flag stays within the profile's bound at every clock reading.

It was `time % 1_000_000` plus offsets up to 953: from 603,847 in each cycle of the clock the value was a
watchdog_timeout the profile refuses (604,800 s, a week), and six cluster tests failed in CI on the day it crossed.
Generated over the clock (Hypothesis) and over every `N + RUN` offset written in the tests, each validated by the real
profile loader, so neither a new offset nor a new module's own fold can bring it back.
"""
from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.config.limits import SECONDS_MAX
from sparkctl.config.profile import load_profile
from testrig import testenv

TESTS = Path(__file__).resolve().parents[1]


def _offsets() -> dict[str, list[int]]:
    """Every `N + RUN` in the tests, by file; and every module's RUN is run_salt() (no fold of its own)."""
    out: dict[str, list[int]] = {}
    for path in TESTS.rglob("*.py"):
        text = path.read_text()
        if re.search(r"\b\d+ \+ RUN\b", text):      # a number salted into a flag
            assert re.search(r"^RUN = run_salt\(\)", text, re.M), f"{path}: RUN is not testrig's run_salt()"
            out[str(path.relative_to(TESTS))] = [int(n) for n in re.findall(r"\b(\d+) \+ RUN\b", text)]
    return out


def test_every_module_salts_with_run_salt_and_its_offsets_fit_the_room():
    offsets = _offsets()
    assert len(offsets) >= 3, offsets          # the image pipeline, up with images, the real engine in containers
    assert all(offsets.values()), offsets
    too_big = {f: [n for n in ns if n > testenv.RUN_SALT_ROOM] for f, ns in offsets.items()}
    assert not any(too_big.values()), too_big


@settings(max_examples=60, deadline=None)
@given(clock=st.floats(min_value=0, max_value=2.0 ** 34, allow_nan=False))
def test_the_largest_salted_value_is_a_watchdog_timeout_the_profile_accepts(clock, tmp_path_factory):
    value = testenv.run_salt(clock) + testenv.RUN_SALT_ROOM
    assert 0 < value <= SECONDS_MAX
    path = tmp_path_factory.mktemp("salt") / "p.yml"
    path.write_text(f"extends: d5\nserver:\n  watchdog_timeout: {value}\n")
    assert load_profile(str(path)).server.watchdog_timeout == value
