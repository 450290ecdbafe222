"""Generated hostile text and damaged files through every command that prints a name.

* Hostile names (escape sequences, C0/C1 controls, bidi overrides, 100 kB strings) put where the outside puts
  them (a card's run id, profile, status, start time and served model; a profile file's name and description;
  a replicated record's fields) and the commands that print them run (`bench history` with and without
  --json, `bench diff`, `profiles`, `render`, `status`): no control byte reaches stdout or stderr, no line
  is longer than the guard's bound, never exit 70.
* Damaged tune journals, cards and replicated records: exit 6 or skipped with a line, never 70.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from testrig.mutations import REPO, ci_settings, run_cli

LOCAL = str(REPO / "inventory" / "local.yml")
CONTROL = {chr(c) for c in list(range(0x00, 0x09)) + list(range(0x0b, 0x20)) + list(range(0x7f, 0xa0))}
RUN = "20250101T000000Z-bench-d5-0001"

HOSTILE = st.one_of(
    st.sampled_from(["\x1b[2J\x1b[H", "\x1b]0;owned\x07", "\x9b31m", "a\rb", "\u202eevil", "\x00\x08\x7f",
                     "x" * 100_000, "\x1b" * 5000, "http://u:hunter2pw@h/"]),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x250, blacklist_categories=["Cs"]),
            min_size=1, max_size=40),
)


def _check(code: int, out: str, err: str, *, url_secret: bool = True) -> None:
    assert code != 70, err[-2000:]
    bad = sorted({hex(ord(c)) for c in out + err if c in CONTROL})
    assert not bad, f"control characters reached the terminal: {bad}"
    assert not url_secret or "hunter2pw" not in out + err
    longest = max((len(line) for line in (out + err).splitlines()), default=0)
    json_out = out.lstrip().startswith(("{", "["))
    assert json_out or longest <= 4096 + 40, longest


class _Env:
    """A throwaway state directory (and profiles directory) for one generated example."""

    def __enter__(self) -> _Env:
        self.tmp = Path(tempfile.mkdtemp(prefix="sparkctl-prop-"))
        self.state = self.tmp / "state"
        self.profiles = self.tmp / "profiles"
        self.profiles.mkdir()
        self.saved = {k: os.environ.get(k) for k in ("SPARKCTL_STATE_DIR", "SPARKCTL_PROFILES_DIR",
                                                     "SPARKCTL_INVENTORY")}
        os.environ.update(SPARKCTL_STATE_DIR=str(self.state), SPARKCTL_PROFILES_DIR=str(self.profiles),
                          SPARKCTL_INVENTORY=LOCAL)
        return self

    def __exit__(self, *exc: Any) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(self.tmp, ignore_errors=True)

    def card(self, data: Any, run_dir: str = RUN) -> Path:
        d = self.state / "local" / "runs" / run_dir
        d.mkdir(parents=True, exist_ok=True)
        p = d / "report.json"
        p.write_text(data if isinstance(data, str) else json.dumps(data))
        return p


def _card(**fields: Any) -> dict[str, Any]:
    s = {"n": 3, "median": 10.0, "min": 9.0, "max": 11.0, "spread": 0.2, "samples": [9.0, 10.0, 11.0]}
    arm = {"config": {"role": fields.pop("role", "ON"), "profile": fields.pop("profile", "d5"),
                      "model": fields.pop("model", "m"), "sglang_version": fields.pop("version", "0.5")},
           "results": {"decode": {"classes": {fields.pop("cls", "code"): {"decode_tok_s": s}}}}}
    return {"schema": "sparkctl.bench/1", "run_id": RUN, "mode": "endpoint", "status": "successful",
            "started": "2025-01-01T00:00:00Z", "arms": [arm], **fields}


FIELDS = st.sampled_from(["run_id", "profile", "status", "started", "model", "version", "cls", "role", "mode"])


@ci_settings(max_examples=60)
@given(field=FIELDS, value=HOSTILE)
def test_hostile_card_fields_never_reach_the_terminal_raw(field, value):
    with _Env() as env:
        env.card(_card(**{field: value}))
        env.card(_card(run_id="20250102T000000Z-bench-d5-0002", started="2025-01-02T00:00:00Z"),
                 "20250102T000000Z-bench-d5-0002")
        for argv in (("bench", "history"), ("bench", "history", "--json"),
                     ("bench", "diff", RUN, "20250102T000000Z-bench-d5-0002"),
                     ("bench", "diff", "--json", RUN, "20250102T000000Z-bench-d5-0002")):
            code, out, err = run_cli(*argv)
            _check(code, out, err)
            assert code in (0, 2, 6), (argv, code, err[-500:])


@ci_settings(max_examples=40)
@given(name=HOSTILE, description=HOSTILE)
def test_hostile_profile_names_and_descriptions_never_reach_the_terminal_raw(name, description):
    with _Env() as env:
        stem = "".join(c for c in name if c not in "/\x00")[:200] or "p"
        with contextlib.suppress(OSError, UnicodeEncodeError):
            (env.profiles / f"{stem}.yml").write_text(json.dumps({"extends": "d5", "description": description}))
        for argv in (("profiles",), ("profiles", "--json"), ("render", "--profile", name),
                     ("render", "--profile", stem, "--json"), ("status",)):
            _check(*run_cli(*argv), url_secret=False)       # a file name cannot hold the URL's '/'s


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | HOSTILE,
                       lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                                   max_size=4), max_leaves=12)


def _damage(doc: dict[str, Any], data: st.DataObject) -> Any:
    """`doc` with one field (at any depth) replaced by a generated value, or removed, or the whole file broken."""
    how = data.draw(st.sampled_from(["replace", "remove", "truncate", "junk"]))
    if how == "truncate":
        text = json.dumps(doc)
        return text[:data.draw(st.integers(0, max(0, len(text) - 1)))]
    if how == "junk":
        return data.draw(JSONISH)
    paths: list[tuple[Any, ...]] = []

    def walk(v: Any, p: tuple[Any, ...]) -> None:
        paths.append(p)
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, p + (k,))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, p + (i,))
    walk(doc, ())
    path = data.draw(st.sampled_from(paths[1:]))
    doc = json.loads(json.dumps(doc))
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if how == "remove":
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(JSONISH)
    return doc


@ci_settings(max_examples=60)
@given(data=st.data())
def test_damaged_cards_are_skipped_with_a_line_or_exit_6_never_70(data):
    with _Env() as env:
        damaged = _damage(_card(), data)
        env.card(damaged)
        for argv in (("bench", "history"), ("bench", "history", "--json"), ("bench", "diff", RUN, RUN)):
            code, out, err = run_cli(*argv)
            _check(code, out, err)
            assert code in (0, 2, 6), (argv, code, err[-800:])


def _journal() -> dict[str, Any]:
    run_id = "20250101T000000Z-tune-d5-abcd"
    from sparkctl.state.tunejournal import TuneOptions
    trial = {"index": 0, "changes": {}, "baseline": True, "status": "pending", "reason": None, "deployment": None,
             "card": None, "objective": None, "elapsed_s": None, "accept_len": None, "capacity": None, "g6": None}
    return {"schema": "sparkctl.tune/1", "run_id": run_id, "state": "running", "created": "x", "profile": "d5",
            "profile_data": {}, "space": [["server.x", [1, 2]]], "baseline_values": {"server.x": 1},
            "options": TuneOptions(profile="d5", vary=["server.x=1,2"]).model_dump(mode="json"), "trials": [trial],
            "original": None, "estimate": None, "confirmation": None, "winner": None, "restore": None, "timing": {}}


@ci_settings(max_examples=80)
@given(data=st.data())
def test_damaged_tune_journals_are_exit_6_never_70(data):
    """TuneJournalFile.load refuses every damaged journal with a LedgerError naming it (or reads one that is still a
    journal); `tune --resume` of a refused one is exit 6 before anything is deployed."""
    from sparkctl.errors import LedgerError
    from sparkctl.state.ledger import Ledger
    from sparkctl.state.tunejournal import TuneJournalFile
    with _Env() as env:
        doc = _journal()
        damaged = _damage(doc, data)
        d = env.state / "local" / "runs" / doc["run_id"]
        d.mkdir(parents=True)
        (d / "tune.json").write_text(damaged if isinstance(damaged, str) else json.dumps(damaged))
        try:
            TuneJournalFile.load(Ledger.for_cluster("local"), doc["run_id"])
        except LedgerError as exc:
            assert str(d / "tune.json") in exc.render()
            code, out, err = run_cli("tune", "--resume", doc["run_id"], "-i", LOCAL)
            _check(code, out, err)
            assert code == 6 and "tune.json" in err, err[-800:]


REPLICATED = {"profile": "d5", "endpoint": "http://127.0.0.1:1", "status": "down", "started": "x",
              "replicas": [{"index": 0, "url": "http://127.0.0.1:2", "nodes": ["local"], "cluster": "local.r0"}],
              "journal": [{"step": "s", "phase": "ok", "at": "x", "what": "w"}]}


@ci_settings(max_examples=60)
@given(data=st.data())
def test_damaged_replicated_records_are_exit_6_or_read_never_70(data):
    with _Env() as env:
        root = env.state / "local"
        root.mkdir(parents=True)
        damaged = _damage(REPLICATED, data)
        (root / "replicated.json").write_text(damaged if isinstance(damaged, str) else json.dumps(damaged))
        for argv in (("status",), ("status", "--json"), ("logs", "--router")):
            code, out, err = run_cli(*argv)
            _check(code, out, err)


COMPARE = {"original": "20260101T000000Z-d5-abcd", "arm": None, "since": "2026-01-01T00:00:00Z",
           "controller": {"pid": 1, "host": "elsewhere", "start_ticks": None, "since": "x", "command": "bench"}}
WATCH = {"pid": 1, "host": "elsewhere", "start_ticks": None, "since": "x", "interval_s": 5.0, "stopped": None,
         "desired": "down", "healthy": None, "restarts": 0, "failures": 0, "rollbacks": 0, "flaps": 0}


@ci_settings(max_examples=40)
@given(data=st.data(), which=st.sampled_from(["compare.json", "watch.json"]))
def test_damaged_comparison_markers_and_watcher_files_never_crash_a_reader(data, which):
    """`compare.json` (`CompareMarker`) and `watch.json` (`WatchState`) damaged in any field, truncated or junk:
    `status`, `down --dry-run` and `repair --dry-run` read them and exit 0, 2, 6 or 8 (a damaged marker is a
    LedgerError naming it, or the comparison `status` reports), never 70 and never raw control characters."""
    with _Env() as env:
        root = env.state / "local"
        root.mkdir(parents=True)
        damaged = _damage(COMPARE if which == "compare.json" else WATCH, data)
        (root / which).write_text(damaged if isinstance(damaged, str) else json.dumps(damaged))
        for argv in (("status", "--json"), ("down", "--dry-run", "--json"), ("repair", "--dry-run", "--json")):
            code, out, err = run_cli(*argv, "-i", LOCAL)
            _check(code, out, err)
            assert code in (0, 2, 6, 8), (argv, code, err[-800:])
