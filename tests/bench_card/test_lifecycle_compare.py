"""`sparkctl bench --compare dflash-off` on the embedded cluster: both arms measured, original restored."""
from __future__ import annotations

import json
from pathlib import Path


def test_compare_deploys_other_profile_and_restores(cli, embedded_cluster):
    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
    assert code == 0, err
    original = json.loads(out)["deployment"]

    code, out, err = cli("bench", "--compare", "dflash-off", "--gates", "cold,decode,g6", "--runs", "2",
                         "--max-tokens", "81", "--warmup", "0", "--g6-max-tokens", "12", "--json")
    assert code == 0, err
    res = json.loads(out)
    roles = {a["config"]["role"]: a["config"] for a in res["arms"]}
    assert roles["ON"]["profile"] == "d5" and roles["OFF"]["profile"] == "dflash-off"
    assert roles["ON"]["deployment"] == original and roles["ON"]["argv_per_rank"]["0"][0] == "python3"
    assert res["emulated"] is True and all(c["emulated"] for c in roles.values())
    assert res["restore"]["ok"] is True and res["restore"]["profile"] == "d5"
    assert set(res["comparison"]["decode"]) == {"code", "prose"}
    assert res["g6"]["n"] == 20 and res["g6"]["identical"] == 20
    # the ON arm's cold number at boot comes from the deployment's own warm-up record
    assert res["arms"][0]["results"]["cold"]["at_boot"]["completion_tokens"] > 0
    # the run is recorded in the ledger, next to the deployments
    assert Path(res["files"]["json"]).parent.parent.name == "runs" and Path(res["files"]["markdown"]).exists()

    code, out, err = cli("status", "--json")
    st = json.loads(out)
    assert st["profile"] == "d5" and st["healthy"] and st["speculative_algorithm"] == "DFLASH"
    # each deploy of the transaction is one `up` through deploy's door: one record (the arm, then the restore),
    # each with the lifecycle's steps, and the restore is what is active now
    from sparkctl.config.inventory import load_inventory
    from sparkctl.state.ledger import Ledger
    ledger = Ledger.for_cluster(load_inventory(embedded_cluster).cluster.name)
    history = ledger.history()
    since = [ledger.load(i) for i in history[history.index(original) + 1:]]
    assert [r.command for r in since] == ["bench-compare", "bench-restore"], [(r.id, r.command) for r in since]
    assert since[0].id == res["compare_deployment"]["deployment"] and since[1].id == res["restore"]["deployment"]
    assert all({"boot", "hand-off"} <= {s.name for s in r.steps} for r in since)
    assert ledger.active_id() == since[1].id
