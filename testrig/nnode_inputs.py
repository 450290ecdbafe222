"""Inputs for the N-node tests: an inventory of N Sparks (through a switch unless told) and a profile at tp N."""
from __future__ import annotations

from pathlib import Path

import yaml


def sparks_inventory(path: Path, n: int, *, topology: str | None = None, subnet: str | None = None,
                     addresses: list[str] | None = None, ranks: list[int] | None = None,
                     hcas: dict[int, list[str]] | None = None) -> Path:
    addresses = addresses or [f"192.168.100.{10 + i}" for i in range(n)]
    ranks = list(range(n)) if ranks is None else ranks
    hosts = {f"spark-{i}": {"ansible_host": f"spark-{i}.local", "sparkctl_rank": ranks[i],
                            "fabric_interface": "enp1s0f0np0", "fabric_address": addresses[i],
                            "roce_hcas": (hcas or {}).get(i, ["rocep1s0f0", "roceP2p1s0f0"])} for i in range(n)}
    cvars: dict = {"sparkctl_cluster": f"n{n}"}
    if topology:
        cvars["sparkctl_fabric_topology"] = topology
    if subnet:
        cvars["sparkctl_fabric_subnet"] = subnet
    path.write_text(yaml.safe_dump({"all": {"vars": cvars, "children": {"sparks": {"hosts": hosts}}}}))
    return path


def tp_profile(path: Path, tp: int, base: str = "d5") -> Path:
    path.write_text(f"description: {base} at TP={tp}\nextends: {base}\nserver:\n  tp_size: {tp}\n")
    return path
