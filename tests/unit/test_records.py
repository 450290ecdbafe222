"""Typed ledger records: strict reading, one status vocabulary, known-good derived from status, old JSON read."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkctl.errors import LedgerError
from sparkctl.nodes.handles import DockerHandle, ProcessHandle
from sparkctl.state.ledger import Ledger
from sparkctl.state.records import DeploymentRecord, Status
from testrig.handles import active, docker_handle, record


def _record(dep_id: str = "20260101T000000Z-d5-abcd", **kw) -> DeploymentRecord:
    base = dict(id=dep_id, profile="d5", profile_data={"api": {"api_key_env": "KEY"}}, cluster="c",
                identity="i" * 16, created="2026-01-01T00:00:00Z", endpoint="http://127.0.0.1:30000")
    return DeploymentRecord(**{**base, **kw})


@pytest.mark.parametrize("text", ["[]", "{}", '{"id": 3}', "null", '"text"'])
def test_a_record_of_the_wrong_shape_is_a_ledger_error_naming_the_file(tmp_path, text):
    ledger = Ledger(tmp_path / "c")
    ledger.set_active("dep")
    path = ledger.deployment_path("dep")
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(LedgerError) as exc:
        ledger.active()                      # never "no active deployment"
    assert exc.value.where == str(path) and "corrupt" in exc.value.message
    assert path.read_text() == text          # reported, not replaced


@pytest.mark.parametrize("text", ["[]", "{}", '{"history": "x"}', '{"history": [], "active": 5}', '{"hist', None])
def test_a_cluster_index_missing_truncated_or_of_the_wrong_shape_is_rebuilt_from_the_records(tmp_path, text):
    """cluster.json is a cache of the records: never read as "nothing deployed", rewritten from them."""
    ledger = Ledger(tmp_path / "c")
    for dep_id, status, handed in (("20260101T000000Z-d5-0001", Status.SUPERSEDED, "t"),
                                   ("20260101T000001Z-d5-0002", Status.SUCCESSFUL, "t"),
                                   ("20260101T000002Z-d5-0003", Status.FAILED, None)):
        ledger.save(_record(dep_id, status=status, handed_off=handed))
    if text is None:
        ledger.index_path.unlink(missing_ok=True)
    else:
        ledger.index_path.write_text(text)
    assert active(ledger).id == "20260101T000001Z-d5-0002"
    assert ledger.index()["history"] == ["20260101T000000Z-d5-0001", "20260101T000001Z-d5-0002",
                                         "20260101T000002Z-d5-0003"]
    ledger.sync_index()
    assert json.loads(ledger.index_path.read_text()) == ledger.index()


def test_the_active_deployment_is_derived_from_the_records_alone(tmp_path):
    ledger = Ledger(tmp_path / "c")
    ledger.save(_record("20260101T000000Z-d5-0001", status=Status.SUCCESSFUL, handed_off="t"))
    assert ledger.active_id() == "20260101T000000Z-d5-0001"
    # a newer one handed off in one write (its controller died before marking the old one superseded)
    ledger.save(_record("20260101T000001Z-d5-0002", status=Status.SUCCESSFUL, handed_off="t"))
    assert ledger.active_id() == "20260101T000001Z-d5-0002"
    # a newer one that never took over is passed over; one that failed after taking over ends the walk
    ledger.save(_record("20260101T000002Z-d5-0003", status=Status.INTERRUPTED))
    assert ledger.active_id() == "20260101T000001Z-d5-0002"
    ledger.save(_record("20260101T000001Z-d5-0002", status=Status.STOPPED, handed_off="t"))
    assert ledger.active_id() is None
    ledger.save(_record("20260101T000003Z-d5-0004", status=Status.RECOVERED))
    assert ledger.active_id() == "20260101T000003Z-d5-0004"


def test_a_bench_arm_is_never_a_rollback_target(tmp_path):
    ledger = Ledger(tmp_path / "c")
    ledger.save(_record("20260101T000000Z-d5-0001", status=Status.SUPERSEDED, handed_off="t"))
    ledger.save(_record("20260101T000001Z-d5-0002", status=Status.SUPERSEDED, handed_off="t", command="bench-compare"))
    ledger.save(_record("20260101T000002Z-d5-0003", status=Status.SUCCESSFUL, handed_off="t", command="bench-restore"))
    assert record(ledger.known_good(exclude=ledger.active_id(), rollback=True)).id == "20260101T000000Z-d5-0001"


def test_known_good_follows_the_status():
    assert {s for s in Status if _record(status=s).known_good} == {Status.SUCCESSFUL, Status.SUPERSEDED,
                                                                 Status.STOPPED}
    # a stored known_good flag is derived data: the status decides (a restore that failed its gates is not good)
    stored = {**_record().as_json(), "status": "failed", "known_good": True}
    assert not DeploymentRecord.model_validate(stored).known_good


def test_handles_come_back_as_their_kind_and_the_file_stays_compatible(tmp_path):
    ledger = Ledger(tmp_path / "c")
    rec = _record(status=Status.SUCCESSFUL, handles=[
        ProcessHandle(node="a", rank=1, deployment="d", pid=12, start_ticks=34, log="/l/rank1.log"),
        DockerHandle(node="b", rank=0, deployment="d", cluster="c", container="sparkctl-c-rank0-x",
                     container_id="f" * 64, log_since="2026-01-01T00:00:00.1Z")])
    ledger.save(rec)
    ledger.set_active(rec.id)
    data = json.loads(ledger.deployment_path(rec.id).read_text())
    assert data["status"] == "successful" and data["known_good"] is True and data["handles"][0]["pid"] == 12
    assert ledger.deployment_path(rec.id).stat().st_mode & 0o777 == 0o600
    back = active(ledger)
    assert isinstance(back.handles[0], ProcessHandle) and isinstance(back.handles[1], DockerHandle)
    assert docker_handle(back, 0).container == "sparkctl-c-rank0-x" and back.api_key_env == "KEY"
    assert ledger.known_good() == back


def test_known_good_skips_failed_and_excluded(tmp_path):
    ledger = Ledger(tmp_path / "c")
    for dep_id, status in (("a", Status.STOPPED), ("b", Status.SUCCESSFUL), ("c", Status.FAILED)):
        ledger.save(_record(dep_id, status=status))
        ledger.add_to_history(dep_id)
    assert record(ledger.known_good()).id == "b"
    assert record(ledger.known_good(exclude="b")).id == "a"


def test_keys_a_newer_sparkctl_wrote_survive_a_round_trip(tmp_path):
    ledger = Ledger(tmp_path / "c")
    ledger.deployment_path("x").parent.mkdir(parents=True)
    ledger.deployment_path("x").write_text(json.dumps({**_record("x").as_json(), "annotations": [{"rank": 0}]}))
    rec = ledger.load("x")
    ledger.save(rec)
    assert json.loads(ledger.deployment_path("x").read_text())["annotations"] == [{"rank": 0}]


def test_a_record_written_by_the_landed_code_still_loads_and_round_trips(tmp_path):
    """tests/lifecycle/fixtures/record-landed-d5.json was written by `sparkctl up --profile d5` of the code landed
    before the typed record (gates, checks, specs, capacity, warm-up and images were dicts then)."""
    from pathlib import Path

    from sparkctl.sglang.launch import RankSpec
    from sparkctl.state.records import Capacity, CheckResult, GateResult, Warmup

    fixture = Path(__file__).resolve().parents[1] / "lifecycle" / "fixtures" / "record-landed-d5.json"
    data = json.loads(fixture.read_text())
    ledger = Ledger(tmp_path / "c")
    ledger.deployment_path(data["id"]).parent.mkdir(parents=True)
    ledger.deployment_path(data["id"]).write_text(fixture.read_text())
    rec = ledger.load(data["id"])
    assert isinstance(rec.gates[0], GateResult) and rec.gates[0].name == "health" and rec.gates[0].ok
    assert isinstance(rec.preflight[0], CheckResult) and isinstance(rec.specs[0], RankSpec)
    assert isinstance(rec.capacity, Capacity) and rec.capacity.max_running_requests == 1
    assert isinstance(rec.warmup, Warmup) and rec.warmup.cold is not None and rec.warmup.cold.completion_tokens == 800
    assert rec.specs[0].api_host == data["specs"][0]["api_host"] and rec.capacity.context_len == 65536
    assert ledger.active_id() == data["id"] and rec.known_good
    ledger.save(rec)
    again = json.loads(ledger.deployment_path(data["id"]).read_text())
    assert again["gates"] == data["gates"] and again["specs"] == data["specs"] and again["warmup"] == data["warmup"]
    assert again["capacity"] == data["capacity"] and again["preflight"] == data["preflight"]


def test_records_written_before_the_renames_load_under_the_new_names(tmp_path):
    """tests/lifecycle/fixtures/records-816a677/ were written by the code of commit 816a677 (its README): an `up`,
    an `up` killed after boot and settled by the next command, a `rollback`. Each loads with every renamed key
    (`state.records.RENAMED_KEYS`, its failure's `Failure.RENAMED`, its handles' `nodes.handles.RENAMED_KEYS`)
    under its new name, and is written back with the new names only."""
    from pathlib import Path

    from sparkctl.nodes.handles import RENAMED_KEYS as HANDLE_KEYS
    from sparkctl.state.records import RENAMED_KEYS, Failure

    fixtures = Path(__file__).resolve().parents[1] / "lifecycle" / "fixtures" / "records-816a677"
    ledger = Ledger(tmp_path / "c")
    ledger.deployment_path("x").parent.mkdir(parents=True)
    old = {}
    for path in sorted(fixtures.glob("*.json")):
        old[path.stem] = json.loads(path.read_text())
        ledger.deployment_path(path.stem).write_text(path.read_text())
    assert {k for data in old.values() for k in data} >= set(RENAMED_KEYS)       # the fixtures hold the old names
    commands = {}
    for dep_id, data in old.items():
        rec = ledger.load(dep_id)
        commands[dep_id] = rec.command
        assert not set(RENAMED_KEYS) & set(rec.model_extra or {}), dep_id
        ledger.save(rec)
        again = json.loads(ledger.deployment_path(dep_id).read_text())
        assert not set(RENAMED_KEYS) & set(again), dep_id
        assert again["command"] == data["kind"]
        assert [h["runtime"] for h in again["handles"]] == [h["kind"] for h in data["handles"]] == ["process"] * 2
        assert all(isinstance(h, ProcessHandle) for h in rec.handles) and not any("kind" in h for h in again["handles"])
        expected = {RENAMED_KEYS.get(k, k): v for k, v in data.items() if k != "updated"}
        # a handle's fields added since (defaults): the engine's cgroup (none in a record written before them)
        expected["handles"] = [{**{HANDLE_KEYS.get(k, k): v for k, v in h.items()}, "cgroup": None}
                               for h in data["handles"]]
        # one journal model since 816a677: a single group's entries say which replica (none)
        expected["journal"] = [{**e, "replica": None} for e in data["journal"]]
        # what a restart must find again (deploy/inputs.py, issue 31): nothing kept by a record written before it
        expected.update(secrets=None, needed=[])
        # the engine (issue 34): every record written before it is an SGLang deployment
        expected["engine"] = "sglang"
        if data["failure"]:
            expected["failure"] = {Failure.RENAMED.get(k, k): v for k, v in data["failure"].items()}
            assert rec.failure is not None and rec.failure.step == data["failure"]["stage"]
        assert [s.name for s in rec.steps] == [s["name"] for s in data["stages"]] and rec.steps
        assert expected == {k: v for k, v in again.items() if k != "updated"}, dep_id   # nothing else changed
    assert commands == {"20261203T192928Z-d5-e689": "up", "20261203T192940Z-dflash-off-25fb": "up",
                        "20261203T192950Z-dflash-off-cdfe": "rollback"}
    settled = ledger.load("20261203T192940Z-dflash-off-25fb")
    assert settled.status == Status.INTERRUPTED and settled.settled is not None
    assert settled.settled.startswith("settled by `sparkctl rollback`")
    assert settled.settled == old["20261203T192940Z-dflash-off-25fb"]["reconciled"]


TUNE_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tune" / "written-by-1649c17"


@pytest.mark.parametrize("name", ["promoted", "within-noise", "resumed", "g6-diverged"])
def test_a_tune_journal_loads_typed_and_saves_back_as_written(name, tmp_path):
    """``runs/<id>/tune.json`` as commit 1649c17 wrote it (the dict-building tune; tests/tune/test_tune.py's four
    tunes on the embedded cluster): it loads into `TuneJournal` with every section a model (options, trials and
    their objective and G6 sample, estimate, confirmation, winner, restore, timing), and is written back with the
    same keys (the file sorts them); a journal from before ``created``/``began``/``updated`` existed loads too."""
    from sparkctl.state.tunejournal import G6Sample, ObjectiveSummary, RestoreReport, TuneJournal, TuneOptions

    text = (TUNE_FIXTURES / f"{name}.json").read_text()
    stored = json.loads(text)
    journal = TuneJournal.model_validate(stored)
    assert json.dumps(journal.as_json(), indent=2, sort_keys=True) + "\n" == text      # the file's own form
    assert type(journal.options) is TuneOptions and journal.options.profile == "t5"
    assert type(journal.restore) is RestoreReport and journal.restore.ok is stored["restore"]["ok"]
    base = journal.trials[0]
    assert type(base.g6) is G6Sample and base.g6.verdict == "reference" and base.g6_outputs
    for t, raw in zip(journal.trials, stored["trials"]):
        assert (t.objective is None) == (raw["objective"] is None)
        assert t.objective is None or (type(t.objective) is ObjectiveSummary
                                       and t.objective.median == raw["objective"]["median"])
        assert t.error == raw.get("error")
    older = {k: v for k, v in stored.items() if k not in ("created", "began", "updated")}
    assert TuneJournal.model_validate(older).as_json() == older


def test_what_each_tune_journal_fixture_holds():
    """The fixtures cover what a tune decides: a promotion (A B A B better), nothing within the noise, a
    resumed tune, and a candidate refused by its G6 sample."""
    from sparkctl.state.tunejournal import TuneJournal
    j = {n: TuneJournal.model_validate_json((TUNE_FIXTURES / f"{n}.json").read_text())
         for n in ("promoted", "within-noise", "resumed", "g6-diverged")}
    assert j["promoted"].winner and j["promoted"].winner.promoted
    assert j["promoted"].confirmation and j["promoted"].confirmation.verdict == "better"
    assert j["within-noise"].confirmation and j["within-noise"].confirmation.verdict == "within noise"
    assert any(t.reason == "G6 failed" for t in j["g6-diverged"].trials)
    assert all(t.status != "pending" for t in j["resumed"].trials) and j["resumed"].state == "finished"


def test_a_replicated_record_written_before_one_journal_model_still_loads(tmp_path):
    """`replicated.json` as commit 816a677 wrote it (its own journal entry model: replica, no nodes; written by that
    commit's `deploy.replicated.Record`): it loads, its journal is the single group's `JournalEntry`, and it is
    saved back in that model with every field kept."""
    import shutil
    from pathlib import Path

    from sparkctl.state.records import JournalEntry, ReplicatedRecord
    from sparkctl.state.replicated import Record

    old = Path(__file__).resolve().parents[1] / "fixtures" / "replicated" / "written-by-816a677.json"
    root = tmp_path / "default"
    root.mkdir(mode=0o700)
    shutil.copy(old, root / "replicated.json")
    (root / "replicated.json").chmod(0o600)
    stored = json.loads(old.read_text())
    rec = Record.load(root)
    model = rec.doc
    assert type(model) is ReplicatedRecord
    assert all(type(e) is JournalEntry for e in model.journal) and len(model.journal) == len(stored["journal"])
    assert [(e.step, e.phase, e.replica, e.detail) for e in model.journal] == [
        (e["step"], e["phase"], e["replica"], e["detail"]) for e in stored["journal"]]
    assert model.journal[5].line().endswith("replica-up failed: DeployError: verify gate(s) failed: smoke")
    rec.save()
    again = json.loads((root / "replicated.json").read_text())
    assert [{k: e[k] for k in old_e} for e, old_e in zip(again["journal"], stored["journal"])] == stored["journal"]
    assert {k: v for k, v in again.items() if k != "journal"} == {k: v for k, v in stored.items() if k != "journal"}
