"""`sparkctl repair`: the way out of a damaged ledger, rebuilt from the engines actually running."""
from __future__ import annotations

import json

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.state.ledger import Ledger
from tests.lifecycle.test_crash import _no_engine, _up_ok


@pytest.mark.parametrize("damage", ["not json {", "[]", "{}", None], ids=["garbage", "list", "empty", "moved-aside"])
def test_repair_rebuilds_the_active_deployment_from_what_runs(cli, local_cluster, damage):
    dep = _up_ok(cli)["deployment"]
    ledger = Ledger.for_cluster(load_inventory(local_cluster).cluster.name)
    path = ledger.deployment_path(dep)
    if damage is None:
        path.rename(path.with_name("aside.bak"))     # what the old fix line told the user to do
    else:
        path.write_text(damage)
    for cmd in (("status",), ("down", "--yes")):
        code, _, err = cli(*cmd)
        assert code == 6 and "run `sparkctl repair`" in err, err
    code, _, err = cli("repair")                      # not a terminal, no --yes: shows, refuses, changes nothing
    assert code == 1 and "repair --yes" in err and f"active deployment" not in err.split("repair --yes")[1], err
    assert f"rebuild {dep} (d5) from its running engines" in err, err
    assert (path.read_text() == damage) if damage is not None else not path.exists()
    code, out, err = cli("repair", "--yes", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["changed"] and result["active"] == dep
    if damage is not None:   # the damaged file is kept, moved aside
        kept = list((ledger.root / "damaged").iterdir())
        assert [p.read_text() for p in kept] == [damage] and kept[0].name.startswith(f"{dep}.json.")
    rec = ledger.load(dep)
    assert rec.status == "recovered" and not rec.known_good and [h.rank for h in rec.handles] == [1, 0]
    code, out, _ = cli("status")
    assert code == 0 and "healthy" in out, out
    code, out, _ = cli("repair", "--yes")
    assert code == 0 and "nothing to repair" in out
    code, out, err = cli("down", "--yes")
    assert code == 0, err
    _no_engine(local_cluster)
    assert ledger.load(dep).status == "recovered"       # stopped, still never verified: not a rollback target


def test_repair_of_a_damaged_index_keeps_it_and_rebuilds_the_history(cli, local_cluster):
    first = _up_ok(cli, "dflash-off")["deployment"]
    second = _up_ok(cli)["deployment"]
    ledger = Ledger.for_cluster(load_inventory(local_cluster).cluster.name)
    ledger.index_path.write_text("[]")
    code, _, err = cli("up", "--profile", "d5", "--yes")
    assert code == 6 and "cluster.json" in err and "sparkctl repair" in err
    code, out, err = cli("repair", "--yes", "--json")
    assert code == 0, err
    assert ledger.index() == {"active": second, "history": [first, second]}
    assert [p.read_text() for p in (ledger.root / "damaged").iterdir()] == ["[]"]
    code, out, err = cli("down", "--yes")
    assert code == 0, err
    _no_engine(local_cluster)
