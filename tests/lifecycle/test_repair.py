"""`sparkctl repair`: the way out of a damaged ledger, rebuilt from the engines actually running."""
from __future__ import annotations

import json

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.nodes.enginegroup import CGROUP_TOP, cgroup2_mount
from sparkctl.nodes.secretdirs import secrets_root_for
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
    assert code == 1 and "repair --yes" in err and "active deployment" not in err.split("repair --yes")[1], err
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
    # the rebuilt handles named no cgroup: the stop found each engine's from its log pipe and removed it
    parent = cgroup2_mount()
    key = secrets_root_for(ledger.root / "secrets").name
    assert parent is None or not list((parent / CGROUP_TOP / key).glob("*.rank*")), "engine cgroups left behind"


@pytest.mark.parametrize("damage", ["[]", '{"active": null, "hist', None], ids=["wrong-shape", "truncated", "deleted"])
def test_a_damaged_or_missing_index_is_rebuilt_from_the_records_never_read_as_nothing_deployed(cli, local_cluster,
                                                                                              damage):
    first = _up_ok(cli, "dflash-off")["deployment"]
    second = _up_ok(cli)["deployment"]
    ledger = Ledger.for_cluster(load_inventory(local_cluster).cluster.name)
    if damage is None:
        ledger.index_path.unlink()
    else:
        ledger.index_path.write_text(damage)
    code, out, err = cli("status", "--json")
    assert code == 0 and json.loads(out)["active"] == second, out + err
    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")      # d5 serves: nothing stopped as an orphan
    assert code == 0 and json.loads(out)["outcome"] == "unchanged" and "orphan" not in err, err
    assert ledger.index() == {"active": second, "history": [first, second]}
    assert json.loads(ledger.index_path.read_text()) == ledger.index()       # rewritten from the records
    code, out, err = cli("down", "--yes")
    assert code == 0, err
    _no_engine(local_cluster)
