"""Deploy's door restarts exactly the recorded deployment or refuses (`door.as_recorded`), before anything is
touched: a secret's variable missing, an inventory edited since the deployment. The engines that run are left as
they are, and the refusal names what differs and what to do."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.deploy import door
from sparkctl.deploy.commands import Deployer
from sparkctl.deploy.progress import Reporter
from sparkctl.errors import RestartRefusedError
from testrig.handles import active, pids
from testrig.watchrig import alive, ledger_of


def _deployed(cli, inv, monkeypatch) -> tuple[str, door.Deployed]:
    monkeypatch.setenv("SPARKCTL_API_KEY", "sk-recorded-0042")
    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
    assert code == 0, err
    return json.loads(out)["deployment"], door.deployed(Deployer(load_inventory(inv), Reporter()))


def _untouched(inv, dep: str) -> None:
    ledger = ledger_of(inv)
    assert active(ledger).id == dep and sorted(ledger.record_ids()) == [dep]
    assert all(alive(pid) for pid in pids(ledger.load(dep)))


@pytest.mark.parametrize("variable", ["SPARKCTL_API_KEY", "HF_TOKEN"])
def test_a_secret_set_at_deploy_time_and_missing_now_refuses_the_restart(variable, cli, local_cluster, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_recorded0042token")
    dep, what = _deployed(cli, local_cluster, monkeypatch)
    monkeypatch.delenv(variable)
    with pytest.raises(RestartRefusedError) as err:
        what.restart()
    assert err.value.hint is not None
    assert f"{variable} is not set in this environment" in err.value.message and "EnvironmentFile" in err.value.hint
    assert door.missing_secrets(ledger_of(local_cluster).load(dep)) == [variable]
    _untouched(local_cluster, dep)


def test_an_inventory_edited_since_the_deployment_refuses_naming_the_first_difference(cli, local_cluster,
                                                                                     monkeypatch):
    dep, _ = _deployed(cli, local_cluster, monkeypatch)
    doc = yaml.safe_load(local_cluster.read_text())
    node = doc["all"]["children"]["sparks"]["hosts"]["spark-a"]
    node["engine_env"] = {"OMP_NUM_THREADS": "3"}            # saved, never deployed
    local_cluster.write_text(yaml.safe_dump(doc, sort_keys=False))
    what = door.deployed(Deployer(load_inventory(local_cluster), Reporter()))
    with pytest.raises(RestartRefusedError) as err:
        what.restart()
    assert "rank 0 env OMP_NUM_THREADS: recorded None, now '3'" in err.value.message, err.value.message
    _untouched(local_cluster, dep)


def test_a_replicated_record_from_before_the_profile_was_kept_refuses_never_reads_the_file(tmp_path):
    """A `replicated.json` written by an older sparkctl (commit 816a677's, a stored fixture) keeps no profile as
    deployed: its restart is refused (rebuilding it from the profile file could roll out edits never deployed)."""
    import shutil

    from sparkctl.state.replicated import Record
    old = Path(__file__).resolve().parents[1] / "fixtures" / "replicated" / "written-by-816a677.json"
    root = tmp_path / "default"
    root.mkdir(mode=0o700)
    shutil.copy(old, root / "replicated.json")
    (root / "replicated.json").chmod(0o600)
    data = Record.load(root).doc
    with pytest.raises(RestartRefusedError) as err:
        door.recorded_replicated_profile(data, str(root / "replicated.json"))
    assert "keeps no profile as deployed" in err.value.message
    assert err.value.hint is not None
    assert f"sparkctl up --profile {data.profile}" in err.value.hint
