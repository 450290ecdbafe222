"""An embedded two-rank cluster on fresh loopback addresses per test, with a fast emulator."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.deploy.lifecycle import Deployer
from sparkctl.deploy.progress import Reporter
from sparkctl.state.ledger import Ledger

FAST_SIM = {"boot_s": 0.4, "decode_tps": 4000, "peer_timeout_s": 2}


@pytest.fixture
def local_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_dir: Path):
    """Writes an inventory like inventory/local.yml on unused loopback addresses; yields its path.

    Every engine the test started is stopped at teardown through the ledger (never by name).
    """
    a, b = random.randint(1, 250), random.randint(1, 250)
    inv = tmp_path / "inventory.yml"
    sim = json.dumps(FAST_SIM)
    inv.write_text(f"""all:
  vars: {{sparkctl_cluster: t{a}x{b}, ansible_connection: local, sparkctl_sim: {sim}}}
  children:
    sparks:
      hosts:
        spark-a: {{ansible_host: 127.{a}.{b}.2, sparkctl_rank: 0, fabric_interface: lo, fabric_address: 127.{a}.{b}.2,
                  api_bind: 127.{a}.{b}.2, runtime: process, gpu_runtime: none}}
        spark-b: {{ansible_host: 127.{a}.{b}.3, sparkctl_rank: 1, fabric_interface: lo, fabric_address: 127.{a}.{b}.3,
                  api_bind: 127.{a}.{b}.3, runtime: process, gpu_runtime: none}}
""")
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(inv))
    for key in [k for k in __import__("os").environ if k.startswith("SPARKCTL_SIM_")]:
        monkeypatch.delenv(key)
    yield inv
    inventory = load_inventory(inv)
    ledger = Ledger.for_cluster(inventory.cluster.name)
    d = Deployer(inventory, Reporter(quiet=True), ledger)
    for dep_id in ledger.index()["history"]:
        try:
            rec = ledger.load(dep_id)
        except Exception:  # noqa: BLE001 - teardown: stop whatever is recorded
            continue
        for h in rec.get("handles") or []:
            d._runtimes(dep_id).for_node(h["node"]).stop(h, timeout_s=3)


@pytest.fixture
def faulty_profile(tmp_path: Path, profiles_dir: Path):
    """A profile 'faulty' = BASE + an emulator fault config carried in the profile's env.

    The fault travels with this deployment's engines only (SPARKCTL_SIM_CONFIG in the rank env), so the
    deployment a rollback restores boots clean, as on a real cluster.
    """
    def make(config: dict, base: str = "d5") -> str:
        path = tmp_path / "sim-faults.json"
        path.write_text(json.dumps(config))
        (profiles_dir / "faulty.yml").write_text(f"extends: {base}\nenv: {{SPARKCTL_SIM_CONFIG: '{path}'}}\n")
        return "faulty"
    return make
