"""A rank SGLang calls slow, on the real engine (issue 31, item 2): SGLang 0.5.23's own "TP rank 1 could finish the
model loading, but there are other ranks that didn't finish loading ... or a slow node." is printed by the rank that
reached the barrier after weight loading when another did not (load_model_utils.py, dist_barrier_after_load).

Made here with real parts only: rank 0's node holds a damaged copy of the model (its weights file cut short, as a
failed copy or a full disk leaves it), so rank 0 fails while loading and rank 1, already at the barrier, prints the
line. `up` fails naming the doctor's signature and its fix (found in the *other* rank's log), and leaves no process
of either rank and no port held (the failed boot's stop: rank 0 died inside the load barrier, rank 1 waits in it; the
processes are found by the test's own path in their environment, not by sparkctl's tracking), `sparkctl doctor`
knows the line, and once the node is mended the next `up` deploys; that deployment is then stopped with no grace at
all (each rank's SIGKILL escalation at once: tests/realengine/test_engine_tree_real.py's "after ready" point, here on
a deployment `up` made) and nothing of either rank's tree, listed before the stop, outlives it. (The failed `up` is
also tests/realengine/test_engine_tree_real.py's "rank 0 dies in the load barrier" point, through `up`'s own stop.)
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.deploy.cluster import Cluster
from sparkctl.nodes import procfs
from sparkctl.nodes.handles import ProcessHandle
from sparkctl.nodes.process import local_port_free
from sparkctl.sglang.render import render
from testrig.embedded import stop_recorded_engines, write_real_engine_inventory
from testrig.sweep import port_holders, process_tree, processes_holding, still_running
from testrig.testenv import need_real_engine

pytestmark = pytest.mark.real_engine

SIGNATURE = "sglang-rank-did-not-finish-loading"
LINE = "could finish the model loading, but there are other ranks that didn't finish loading"


@pytest.fixture
def damaged_rank0(tmp_path: Path):
    """A real-engine cluster whose rank 0 node (spark-a) reads its models from a copy with the weights cut short."""
    engine = need_real_engine()
    inv = write_real_engine_inventory(tmp_path / "inventory.yml", engine, prefix="slow")
    models = tmp_path / "models-rank0"
    shutil.copytree(engine.model.parent / "target", models / "target")
    weights = next((models / "target").glob("*.safetensors"))
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])           # header intact, tensors cut short
    doc = yaml.safe_load(inv.read_text())
    doc["all"]["children"]["sparks"]["hosts"]["spark-a"]["host_paths"] = {"models": str(models)}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKCTL_INVENTORY", str(inv))
        mp.setenv("SPARKCTL_STATE_DIR", str(tmp_path / "state"))
        for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_") or k in ("SPARKCTL_CRASH_AT",
                                                                                     "SPARKCTL_API_KEY")]:
            mp.delenv(key)
        try:
            yield inv, engine
        finally:
            stop_recorded_engines(inv)


def test_a_rank_sglang_calls_slow_is_named_with_its_fix_and_the_next_up_works(cli, damaged_rank0, tmp_path):
    inv, engine = damaged_rank0
    code, out, err = cli("up", "--profile", "cpu-tiny", "--yes")
    assert code == 4, err[-4000:]
    # the failure names the doctor's signature, its fix and SGLang's own line, wherever rank it was printed by
    assert f"doctor: {SIGNATURE}" in err and LINE in err, err[-6000:]
    assert "sparkctl up` again" in err and "sparkctl logs --rank 0" in err, err[-6000:]
    # nothing of the failed boot remains: every engine process inherited SPARKCTL_STATE_DIR under tmp_path
    assert processes_holding((str(tmp_path),)) == []
    specs = render(load_profile("cpu-tiny"), load_inventory(inv), environ={}).specs
    busy = [f"{a}:{p} ({'; '.join(port_holders(a, p))})" for s in specs for a, p, _ in s.listen_ports()
            if not local_port_free(a, p)]
    assert not busy, busy

    code, out, _ = cli("doctor", "--json", "--no-kernel-log")
    assert code == 8, out[-3000:]
    found = {f["signature"]: f for f in json.loads(out)["findings"]}
    assert SIGNATURE in found, sorted(found)

    # the node mended (its models read from the good build again): the next `up` deploys and serves
    doc = yaml.safe_load(inv.read_text())
    doc["all"]["children"]["sparks"]["hosts"]["spark-a"]["host_paths"] = {"models": str(engine.model.parent)}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    code, out, err = cli("up", "--profile", "cpu-tiny", "--yes", "--json")
    assert code == 0, err[-4000:]
    assert json.loads(out)["outcome"] == "deployed"

    # stopped with no grace after ready: every process of both ranks' trees (listed first) is gone, ports free
    c = Cluster(load_inventory(inv))
    rec = c.ledger.active()
    assert rec is not None
    rts = c.runtimes(rec.id)
    handles = sorted((h for h in rec.handles if isinstance(h, ProcessHandle)), key=lambda h: -h.rank)
    assert len(handles) == 2, rec.handles
    tree = process_tree([h.pid for h in handles])
    assert any("scheduler" in procfs.title(p) for p, _ in tree), still_running(tree)
    for h in handles:
        rts.for_node(h.node).stop(h, timeout_s=0)     # SIGKILL at once (how long the kernel takes is its own)
    assert still_running(tree) == []
    busy = [f"{a}:{p} ({'; '.join(port_holders(a, p))})" for s in specs for a, p, _ in s.listen_ports()
            if not local_port_free(a, p)]
    assert not busy, busy
