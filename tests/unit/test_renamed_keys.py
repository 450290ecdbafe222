"""Output keys renamed for one name per concept (issue 33, item 3): every result that has a new key writes the old
one beside it, with the same value, for a release (sparkctl.deploy.results.RENAMED_KEYS, listed in
docs/reference.md); a router handle written with the old key loads as before."""
from __future__ import annotations

import json

import pytest

from sparkctl.deploy.results import RENAMED_KEYS, DownResult, RouterStatus, UpResult
from sparkctl.deploy.settle import Settled
from sparkctl.router.launch import recorded_runtime


def test_each_renamed_key_is_written_under_both_names():
    up = UpResult(outcome="deployed", changed=True, profile="d5", cluster="c", emulated=True,
                  steps=[{"name": "boot", "elapsed_s": 1.0}], settled=Settled(lines=["adopted x"]))
    down = DownResult(changed=True, settled=["stopped y"])
    router = RouterStatus(url="http://r", runtime="container", live=True, ready=True)
    for result in (up, down, router):
        data = json.loads(json.dumps(result.as_json()))
        pairs = [(old, new) for old, new in RENAMED_KEYS.items() if new in data]
        assert pairs, data
        for old, new in pairs:
            assert data[old] == data[new] and data[new] not in (None, [], "process"), (old, data)


def test_a_result_without_the_new_values_writes_the_old_keys_empty_too():
    up = UpResult(outcome="unchanged", changed=False, profile="d5", cluster="c", emulated=True)
    data = up.as_json()
    assert data["stages"] is data["steps"] is None and data["reconciled"] is data["settled"] is None
    assert RouterStatus(url="u", live=False, ready=False).as_json()["kind"] == "process"


@pytest.mark.parametrize("entry,runtime", [({"runtime": "container"}, "container"),
                                           ({"kind": "container"}, "container"), ({"kind": "process"}, "process"),
                                           ({}, "process")])
def test_a_router_entry_of_either_name_says_how_it_runs(entry, runtime):
    assert recorded_runtime(entry) == runtime
