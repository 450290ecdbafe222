"""A tune's restore says what runs after it, read back from the cluster (deploy.door.read_back), never what it
meant to do: generated over how the tune ended (killed at each tune step and settled by the next tune, killed and
resumed, completed) x whether the user deployed something of their own in between, as a pairwise covering set:
every (kill point, next command), (kill point, user deployed) and (next command, user deployed) pair is a case, 12
cases rather than the 22 of the full product (each ~36 s at load: a killed tune and a whole tune after it).

The user's profile `prod` launches exactly what the tune's candidate launches (the same argv under another
name): the case where a restore (or the user's own `up`) used to call the arm still running "unchanged", reported
`restored: prod (ok)` in 0.05 s and left the tune's trial serving under the arm's record.
"""
from __future__ import annotations

import json

import pytest

from testrig.controller import killed_at

TUNE = ("tune", "--profile", "t5", "--vary", "speculative.num_draft_tokens=6", "--runs", "1", "--max-tokens", "64",
        "--warmup", "0", "--confirm-rounds", "1", "--force")
PROD = "extends: t5\nspeculative:\n  num_draft_tokens: 6\n"        # the candidate's launch, the user's name
DIED = ("tune:tune-begin:after", "tune:trial@0:after", "tune:trial@1:after", "tune:confirm@1:after",
        "tune:tune-restore:before")
NEXT = ("next tune", "resume")
CASES = ([(f"died {p}", nxt, bool((i + j) % 2)) for i, p in enumerate(DIED) for j, nxt in enumerate(NEXT)]
         + [("completed", "next tune", user) for user in (False, True)])


def _serving(cli) -> tuple[str | None, str | None, bool]:
    """What the cluster runs, read by `status`: (profile, deployment, healthy)."""
    code, out, err = cli("status", "--json")
    st = json.loads(out)
    return st.get("profile") if st.get("active") else None, st.get("active"), bool(st.get("healthy"))


@pytest.mark.parametrize("how,nxt,user", CASES, ids=[f"{h}-{n}-{'user deployed' if u else 'untouched'}"
                                                        for h, n, u in CASES])
def test_what_serves_after_a_tune_is_what_its_restore_line_says(cli, tune_cluster, state_dir, profiles_dir,
                                                                how, nxt, user):
    (profiles_dir / "prod.yml").write_text(PROD)
    code, out, err = cli("up", "--profile", "t5-off", "--yes", "--json")
    assert code == 0, err
    run_id = None
    if how == "completed":
        if user:
            code, out, err = cli("up", "--profile", "prod", "--yes", "--json")
            assert code == 0, err
    else:
        killed_at(how.split()[1], *TUNE)
        marker = next(iter(state_dir.glob("*/tune.json")), None)
        run_id = json.loads(marker.read_text())["run"] if marker else None
        if user:
            code, out, err = cli("up", "--profile", "prod", "--yes", "--json")
            assert code == 0, err
            assert json.loads(out)["outcome"] == "deployed", out     # never "unchanged" onto the tune's arm
    want = "prod" if user else "t5-off"
    args = ("tune", "--resume", run_id) if nxt == "resume" and run_id else TUNE
    code, out, err = cli(*args)
    assert code == 0, err[-3000:]
    (line,) = [ln for ln in out.splitlines() if ln.startswith("restored:")]
    profile, deployment, healthy = _serving(cli)
    assert line.startswith(f"restored: {want} (ok)"), (line, profile, err[-3000:])
    assert (profile, healthy) == (want, True), (line, profile, deployment)
    code, out, err = cli("status", "--json")
    assert code == 0 and json.loads(out)["unfinished_compare"] is None, out
    rec = json.loads(next(state_dir.glob(f"*/deployments/{deployment}.json")).read_text())
    assert rec["command"] not in ("bench-compare",), rec["command"]   # its own record, never an arm's
    assert not list(state_dir.glob("*/tune.json"))                     # settled


def test_a_restore_that_leaves_something_else_serving_says_so(cli, tune_cluster, state_dir, profiles_dir):
    """The read-back itself: asked to leave t5-off serving while an arm of the same launch runs under another
    name, `read_back` says FAILED naming both; asked for nothing while something runs, FAILED too."""
    from sparkctl.config.inventory import resolve_inventory
    from sparkctl.deploy import door
    from sparkctl.deploy.commands import Deployer
    code, out, err = cli("up", "--profile", "t5-off", "--yes", "--json")
    assert code == 0, err
    d = Deployer(resolve_inventory(None))
    lines: list[str] = []
    r = door.read_back(d, "prod", {"ok": True, "profile": "prod"}, lines.append)
    assert not r["ok"] and "leave prod serving" in r["error"] and "t5-off runs" in r["error"], r
    assert r["serving"] == "t5-off" and lines and "FAILED" in lines[0]
    r = door.read_back(d, None, {"ok": True, "action": "down"}, lines.append)
    assert not r["ok"] and "t5-off" in r["error"], r
    assert door.read_back(d, "t5-off", {"ok": True, "profile": "t5-off"}, lines.append)["ok"]


def test_the_cases_cover_every_pair_of_how_it_ended_the_next_command_and_the_users_up():
    died = [(h, n, u) for h, n, u in CASES if h.startswith("died ")]
    assert {h for h, _, _ in died} == {f"died {p}" for p in DIED}
    for a, b in ((0, 1), (0, 2), (1, 2)):
        want = {(x, y) for x in {c[a] for c in died} for y in {c[b] for c in died}}
        assert {(c[a], c[b]) for c in died} == want, (a, b)
    assert {u for h, _, u in CASES if h == "completed"} == {False, True}
