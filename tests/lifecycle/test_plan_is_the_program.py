"""`--dry-run` prints exactly what the command then runs, for every command with a plan and each of its outcomes.

Commands: `up` and `rollback` of one group, `up` of replicas behind the router (a rolling update included).
Outcomes: deployed, unchanged, failed with the previous deployment restored, and a rolling update stopped by a
replica whose `up` failed. For each, the steps the dry run printed are the steps the command journaled, in order,
each `noop` exactly where the plan said so (the plan decides; apply runs its decision); a failed command ran the
plan's steps up to the one that failed, then only what that plan says runs on failure. The settle step that
precedes planning (what a dead controller left) is not part of a plan and is left out of the comparison.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from sparkctl.config.inventory import load_inventory
from sparkctl.state.ledger import Ledger
from testrig.embedded import stop_cluster_engines, write_embedded_inventory, write_replicated_profile
from testrig.testenv import need_module

FAST = {"boot_s": 0.3, "decode_tps": 2000, "ttft_base_s": 0.002}


def _dry(cli, *args: str) -> dict:
    code, out, err = cli(*args, "--dry-run", "--json")
    assert code == 0, err[-3000:]
    doc = json.loads(out)
    assert doc["outcome"] == "dry-run", doc
    return doc


def _planned(doc: dict) -> list[tuple[str, str, str]]:
    """(step, what, outcome it will journal) of a single group's dry run; [] when the plan is a no-op."""
    plan = doc["plan"]
    return [] if plan["noop_reason"] else [(s["name"], s["what"], "noop" if s["noop"] else "ok")
                                           for s in plan["steps"]]


def _ran(ledger: Ledger, dep_id: str) -> list[tuple[str, str, str]]:
    """(step, what, outcome) of every step the record's journal closed (the steps' own lines: a step's runner may
    journal more of its own, e.g. each rank's start, under other words)."""
    rec = ledger.load(dep_id)
    opened = {(e.step, e.what) for e in rec.journal if e.phase == "intent"}
    closed = [(e.step, e.what, e.phase) for e in rec.journal if e.phase != "intent" and (e.step, e.what) in opened]
    assert [s for s, _, _ in closed] == [s.name for s in rec.steps], (closed, rec.steps)
    return closed


def _run(cli, *args: str) -> tuple[int, dict | None, str]:
    code, out, err = cli(*args, "--yes", "--json")
    return code, json.loads(out) if code == 0 else None, err


def test_single_group_up_and_rollback_run_what_their_dry_run_printed(cli, local_cluster, faulty_profile):
    ledger = Ledger.for_cluster(load_inventory(local_cluster).cluster.name)
    # deployed (a first up), unchanged, deployed over another (stop-old), a rollback, a rollback --to
    for args in (("up", "--profile", "d5"), ("up", "--profile", "d5"), ("up", "--profile", "dflash-off"),
                 ("rollback",), ("rollback", "--to", "dflash-off")):
        planned = _planned(_dry(cli, *args))
        code, res, err = _run(cli, *args)
        assert code == 0, err[-3000:]
        assert res is not None
        if not planned:
            assert res["outcome"] == "unchanged", res
            continue
        assert res["outcome"] == "deployed" and _ran(ledger, res["deployment"]) == planned, args
        assert [n for n, _, o in planned if o == "noop"] == ["image-build", "image-distribute", "image-verify"]
    # failed and restored: the plan's steps up to the failing boot, and nothing of the plan after it
    name = faulty_profile({"ranks": {"1": {"crash_after_s": 0.3, "boot_s": 3.0}}})
    planned = _planned(_dry(cli, "up", "--profile", name))
    code, _, err = _run(cli, "up", "--profile", name)
    assert code == 4, err[-3000:]
    failed = next(i for i in reversed(ledger.index()["history"]) if ledger.load(i).profile == name)
    ran = _ran(ledger, failed)
    names = [n for n, _, _ in planned]
    assert ran[-1][0] == "boot" and ran[-1][2] == "failed", ran
    assert ran[:-1] == planned[:names.index("boot")], (ran, planned)


def _replicated_planned(doc: dict) -> tuple[list[str], dict[str, list[str]]]:
    """The numbered steps of a replicated dry run ("N. what" -> what), and per step what runs if it fails."""
    steps: list[str] = []
    on_failure: dict[str, list[str]] = {}
    for line in doc["plan"]:
        head, _, rest = line.partition(". ")
        if head.isdigit():
            steps.append(rest)
            on_failure[rest] = []
        elif line.strip().startswith("on failure: "):
            on_failure[steps[-1]].append(line.strip().removeprefix("on failure: "))
    return steps, on_failure


def _together(whats: list[str]) -> list[str]:
    """`whats` with each run of consecutive replica `up`s in one order: a first `up` runs them at once, one thread
    each, and each closes when it is done (the plan lists them in replica order)."""
    out: list[str] = []
    group: list[str] = []
    for w in [*whats, ""]:
        if re.match(r"replica \d+: up ", w):
            group.append(w)
            continue
        out += sorted(group)
        group = []
        if w:
            out.append(w)
    return out


def _replicated_ran(root: Path, since: int) -> list[tuple[str, str]]:
    """(what, outcome) of each step the replicated record's journal closed after entry `since`, settle left out."""
    from sparkctl.state.replicated import Record
    journal = Record.load(root).doc.journal[since:]
    return [(e.what, e.phase) for e in journal if e.phase != "intent" and e.step != "settle"]


def test_replicated_up_runs_what_its_dry_run_printed(cli, tmp_path, monkeypatch, state_dir, profiles_dir):
    need_module("sglang_router", "the router extra (sglang-router) is not installed")
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy.replicated import sub_inventory
    from sparkctl.router.replicas import render_replicas
    from sparkctl.state.replicated import Record

    inv_path = write_embedded_inventory(tmp_path / "inventory.yml", FAST, nodes=2, prefix="pp")
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(inv_path))
    inv = load_inventory(inv_path)
    root = Ledger.for_cluster(inv.cluster.name).root
    rep = write_replicated_profile(profiles_dir / "rep.yml", 16)
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"ranks": {"0": {"crash_after_s": 0.2, "boot_s": 2.0}}}))
    (profiles_dir / "rep-bad.yml").write_text(f"extends: rep\nserver:\n  max_running_requests: 20\n"
                                              f"env: {{SPARKCTL_SIM_CONFIG: '{faults}'}}\n")
    write_replicated_profile(profiles_dir / "rep2.yml", 24)
    try:
        # a first up (every replica at once), unchanged, a rolling update, a rolling update a replica stops
        for profile, expect in (("rep", 0), ("rep", 0), ("rep2", 0), ("rep-bad", 4)):
            steps, on_failure = _replicated_planned(_dry(cli, "up", "--profile", profile))
            since = len(Record.load(root).doc.journal)
            code, out, err = cli("up", "--profile", profile, "--yes", "--json")
            assert code == expect, err[-3000:]
            ran = _replicated_ran(root, since)
            if expect == 0:
                assert _together([w for w, _ in ran]) == _together(steps), (profile, ran, steps)
                assert all(o in ("ok", "noop") for _, o in ran), ran
                continue
            # replica 0's `up` failed (it restored rep2 alone): the plan up to it, then its on-failure steps
            failed = next(i for i, (_, o) in enumerate(ran) if o == "failed")
            assert [w for w, _ in ran[:failed + 1]] == steps[:failed + 1], (ran, steps)
            assert [w for w, _ in ran[failed + 1:]] == on_failure[steps[failed]] and on_failure[steps[failed]], ran
            assert ran[failed + 1][1] == "noop" and ran[failed + 2][1] == "ok", ran   # the router runs; back in
            assert "replica 0" in err and "serves as before and is back in the router" in err, err[-3000:]
        # down: the router, then each replica's own down, exactly the engines its dry run named
        dry = _dry(cli, "down")
        assert dry["plan"][0].startswith("stop-router: stop the router"), dry["plan"]
        assert {line.split(":")[0] for line in dry["plan"][1:]} == {"replica 0", "replica 1"}, dry["plan"]
        assert len(dry["engines"]) == 2, dry                   # two replicas of one rank each (rep2 runs)
        assert all("-rep2-" in e for e in dry["engines"]), dry
        code, res, err = _run(cli, "down")
        assert code == 0 and res is not None, err[-3000:]
        assert res["stopped"] == ["router", "replica 0", "replica 1"], res
        assert _dry(cli, "down")["engines"] == []
    finally:
        code, _, err = cli("down", "--yes")
        for r in render_replicas(load_profile(str(rep)), inv, environ={}):
            stop_cluster_engines(sub_inventory(r, inv.cluster.name))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_down_and_repair_run_what_their_dry_run_printed(cli, local_cluster):
    """`down --dry-run` names what `down` then stops (a deployment a killed `up` left running, settled first; the
    active one), changing nothing; `repair --dry-run` prints the changes `repair` then makes, changing nothing."""
    from testrig.controller import killed_at

    ledger = Ledger.for_cluster(load_inventory(local_cluster).cluster.name)
    code, res, err = _run(cli, "up", "--profile", "d5")
    assert code == 0, err[-3000:]
    killed_at("up:boot:after", "up", "--profile", "dflash-off", "--yes")     # its ranks run, never verified
    before = _files(ledger.root)
    dry = _dry(cli, "down")
    assert _files(ledger.root) == before                          # a dry run changes nothing
    assert dry["plan"][0].startswith("settle: ") and "dflash-off" in dry["plan"][0], dry["plan"]
    assert [line.split(":")[0] for line in dry["plan"][1:]] == ["stop-active", *["stop-rest"] * (len(dry["plan"]) - 2)]
    assert len(dry["engines"]) == 2 and all(" of " in e for e in dry["engines"]), dry
    code, res, err = _run(cli, "down")
    assert code == 0 and res is not None, err[-3000:]
    assert sorted(res["engines"]) == sorted(dry["engines"]), (res, dry)
    after = _dry(cli, "down")
    assert after["engines"] == [] and after["plan"] == ["stop-active: no-op (no active deployment)"], after

    # repair: the index rewritten by hand (the active deployment forgotten, one history entry without a record)
    code, res, err = _run(cli, "up", "--profile", "d5")
    assert code == 0 and res is not None, err[-3000:]
    index = json.loads((ledger.root / "cluster.json").read_text())
    index.update(active=None, history=[*index["history"], "20200101T000000Z-gone-0000"])
    (ledger.root / "cluster.json").write_text(json.dumps(index))
    before = _files(ledger.root)
    code, out, err = cli("repair", "--dry-run", "--json")
    assert code == 0, err[-3000:]
    planned = json.loads(out)
    assert planned["outcome"] == "dry-run" and planned["changed"] is False and planned["changes"], planned
    assert _files(ledger.root) == before
    code, out, err = cli("repair", "--yes", "--json")
    assert code == 0, err[-3000:]
    done = json.loads(out)
    assert done["changed"] is True and done["changes"] == planned["changes"], (done, planned)
    assert done["active"] == res["deployment"]
