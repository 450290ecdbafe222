"""What the deploy commands say (issue 17's deploy parts): the same JSON keys in every outcome, the plan names
the id `up` creates, image-stage lines once, the endpoint and next commands, the engine's own concurrency cap,
plain `rollback` with no known-good history going to the profile's rollback_profile."""
from __future__ import annotations

import json

from sparkctl.config.inventory import load_inventory
from sparkctl.state.ledger import Ledger


def _json(cli, *args: str) -> tuple[int, dict, str]:
    code, out, err = cli(*args, "--json")
    return code, json.loads(out), err


def test_up_status_down_json_have_the_same_keys_in_every_outcome(cli, local_cluster):
    code, dry, err = _json(cli, "up", "--profile", "d5", "--dry-run")
    assert code == 0 and dry["outcome"] == "dry-run"
    code, st_none, _ = _json(cli, "status")
    assert code == 0 and st_none["active"] is None
    code, deployed, err = _json(cli, "up", "--profile", "d5", "--yes")
    assert code == 0 and deployed["outcome"] == "deployed", err
    assert deployed["plan"]["deployment"] == deployed["deployment"]          # planned under the lock: one id
    # one image decision, said once in the plan and once as its step runs (not again by the step itself)
    assert err.count("image-build: ") == 2 and err.count("image-build image-build: ") == 1, err
    code, unchanged, err = _json(cli, "up", "--profile", "d5", "--yes")
    assert code == 0 and unchanged["outcome"] == "unchanged", err
    assert set(dry) == set(deployed) == set(unchanged)
    code, st, _ = _json(cli, "status")
    assert code == 0 and st["healthy"] and set(st) == set(st_none)
    code, down, _ = _json(cli, "down", "--yes")
    code, down_again, _ = _json(cli, "down", "--yes")
    assert down["changed"] and not down_again["changed"] and set(down) == set(down_again)
    # each output is the model `sparkctl schema NAME` exports: its keys are the schema's properties
    for name, out in (("up", deployed), ("status", st), ("down", down)):
        code, schema, _ = cli("schema", name)
        assert code == 0 and set(json.loads(schema)["properties"]) == set(out), name


def test_after_up_the_endpoint_and_the_next_commands_are_printed(cli, local_cluster):
    code, out, err = cli("up", "--profile", "d5", "--yes")
    assert code == 0, err
    endpoint = next(ln for ln in out.splitlines() if ln.startswith("deployed ")).split(": ", 1)[1].split()[0]
    nxt = next(ln for ln in out.splitlines() if ln.startswith("next: "))
    assert f"curl {endpoint}/v1/models" in nxt and "sparkctl status" in nxt and "sparkctl down" in nxt


def test_up_says_when_the_engine_caps_concurrency_with_its_own_reason(cli, local_cluster, faulty_profile):
    code, res, err = _json(cli, "up", "--profile", faulty_profile({"mamba_slots": 1}), "--yes")
    assert code == 0, err
    cc = res["concurrency"]
    assert cc is not None and cc["max_running_requests"] == res["capacity"]["max_running_requests"] == 1, res
    assert "capped to 1 by the mamba state cache" in cc["reason"] and "mamba_full_memory_ratio" in cc["setting"]
    assert "capped to 1 by the mamba state cache" in err


def test_plain_rollback_with_no_known_good_history_goes_to_the_rollback_profile(cli, local_cluster):
    code, first, err = _json(cli, "up", "--profile", "d5", "--yes")
    assert code == 0, err
    code, back, err = _json(cli, "rollback", "--yes")
    assert code == 0 and back["profile"] == "dflash-off" and back["outcome"] == "deployed", err   # d5.yml says so
    assert "rollback_profile of d5" in err
    ledger = Ledger.for_cluster(load_inventory(local_cluster).cluster.name)
    assert ledger.active_id() == back["deployment"]
    code, again, err = _json(cli, "rollback", "--yes")      # now there is history: back to the known-good d5
    assert code == 0 and again["profile"] == "d5", err
