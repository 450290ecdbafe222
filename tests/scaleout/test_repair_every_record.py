"""`repair` rebuilds every kind of record from what actually runs: a single group's deployment record and a
replicated deployment's `replicated.json`, each damaged in each way (truncated, garbage, the wrong schema) while
it runs -> `repair --yes` -> `status` sees what runs, `down` stops it, and nothing of it is left (no engine, no
router: no process whose output goes to a log under the state directory)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from testrig.embedded import write_embedded_inventory, write_replicated_profile
from testrig.testenv import need_module

FAST = {"boot_s": 0.3, "decode_tps": 2000, "ttft_base_s": 0.002}
DAMAGE = {"truncated": lambda text: text[: len(text) // 2], "garbage": lambda text: "\x00\xff not json {{{",
          "wrong schema": lambda text: json.dumps({"replicas": 5, "router": "x", "status": ["active"]})}
KINDS = ("single group", "replicated")
CASES = [(k, d) for k in KINDS for d in DAMAGE]


def _ours(state: Path) -> list[int]:
    """Processes whose stdout is a log under the state directory: the engines and routers of this test."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/fd/1").startswith(str(state) + "/"):
                    found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("kind,damage", CASES, ids=[f"{k}-{d}" for k, d in CASES])
def test_repair_rebuilds_what_runs_then_down_leaves_nothing(tmp_path, monkeypatch, cli, state_dir, kind, damage):
    if kind == "replicated":
        need_module("sglang_router", "the router extra (sglang-router) is not installed")
    for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    inv = write_embedded_inventory(tmp_path / "inventory.yml", FAST, nodes=2)
    prof = str(write_replicated_profile(tmp_path / "rep.yml", 16)) if kind == "replicated" else "base"
    try:
        code, out, err = cli("up", "-p", prof, "-i", str(inv), "--yes", "--json")
        assert code == 0, err[-3000:]
        running = _ours(state_dir)
        assert running
        if kind == "replicated":
            (target,) = state_dir.glob("*/replicated.json")
        else:
            (target,) = state_dir.glob("*/deployments/*.json")
        target.write_text(DAMAGE[damage](target.read_text()))
        code, out, err = cli("status", "-i", str(inv), "--json")
        assert code == 6, (code, err[-2000:])                       # damaged: exit 6, never "nothing runs"
        code, out, err = cli("repair", "-i", str(inv), "--yes", "--json")
        assert code == 0 and json.loads(out)["changed"], err[-3000:]
        assert list((target.parent / "damaged").glob(f"{target.name}.*")) or \
            list((target.parent.parent / "damaged").glob(f"{target.name}.*")), "the damaged file was not kept"
        code, out, err = cli("status", "-i", str(inv), "--json")
        st = json.loads(out)
        assert code == 0, (out, err[-2000:])
        if kind == "replicated":
            assert st.get("replicated") and len(st["replicas"]) == 2, out
            assert all(r["in_router"] for r in st["replicas"]), out
        else:
            assert st["active"] and st["healthy"], out
        code, out, err = cli("down", "-i", str(inv), "--yes", "--json")
        assert code == 0, err[-3000:]
        if kind == "replicated":
            assert json.loads(out)["stopped"] == ["router", "replica 0", "replica 1"], out
        assert not _ours(state_dir), f"left running after down: {_ours(state_dir)}"
        code, out, err = cli("status", "-i", str(inv), "--json")
        assert code == 0 and not json.loads(out).get("active") and not json.loads(out).get("replicated"), out
    finally:
        cli("down", "-i", str(inv), "--yes")
        for pid in _ours(state_dir):        # a failed run's leftovers (started by this test): never outlive it
            os.kill(pid, 9)
