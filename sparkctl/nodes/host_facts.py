"""Facts that host preparation establishes (``sparkctl prepare``), in the style of ``sparkctl.nodes.facts``:
an argv to run on a node plus a pure parser of its output. Evaluating them is
``sparkctl.deploy.host_checks``' job.

* ``model_manifest(dir)``: the checksum manifest next to a model directory, recomputed on the node only when a
  file is newer than it (the same code as the playbooks' helper, ``sparkctl/prepare/model_manifest.py``);
* ``fabric_ssh(user, address)``: rank 0 reaches a peer over the fabric with the dedicated key prepare made.

The interface MTU comes from ``sparkctl.nodes.facts.ip_addr`` (``Interface.mtu``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources

from sparkctl.nodes.facts import Fact

MANIFEST_SOURCE = resources.files("sparkctl.prepare").joinpath("model_manifest.py").read_text()
FABRIC_KEY = "~/.ssh/sparkctl_fabric_ed25519"
FABRIC_KNOWN_HOSTS = "~/.ssh/sparkctl_fabric_known_hosts"
_OK_MARK = "sparkctl-fabric-ok"


@dataclass(frozen=True)
class Manifest:
    """A model directory's checksums on one node; ``status`` missing when the directory is not there."""

    status: str                                  # cached | computed | missing
    path: str
    files: dict[str, str] = field(default_factory=dict)

    @property
    def present(self) -> bool:
        """The directory exists (it may be empty: an emulated engine needs no weights)."""
        return self.status != "missing"


def model_manifest(directory: str) -> Fact[Manifest]:
    """Example: ``model_manifest("/home/spark/models/Qwen3-8B").argv[:2] == ("python3", "-c")``."""
    return Fact(f"manifest {directory}", ("python3", "-c", MANIFEST_SOURCE, directory), parse_manifest)


def parse_manifest(text: str) -> Manifest:
    """Parse the helper's JSON line: ``{"status": "cached", "manifest": "/m/X.sha256", "files": {...}}``."""
    line = next((ln for ln in reversed(text.splitlines()) if ln.lstrip().startswith("{")), "")
    if not line:
        raise ValueError("no JSON line in the manifest helper's output")
    data = json.loads(line)
    return Manifest(str(data["status"]), str(data.get("manifest", "")), dict(data.get("files") or {}))


@dataclass(frozen=True)
class FabricSsh:
    """Outcome of ``ssh`` from rank 0 to a peer's fabric address with the fabric key."""

    ok: bool
    key_missing: bool = False
    host_key_problem: bool = False
    error: str = ""


def fabric_ssh(user: str, address: str) -> Fact[FabricSsh]:
    """SSH from this node (rank 0) to ``user@address`` with the fabric key and pinned host keys; prints a marker
    on success. The connector runs it as one remote command; ``~`` is expanded by ssh itself."""
    return Fact(f"fabric ssh {address}", (
        "ssh", "-i", FABRIC_KEY, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={FABRIC_KNOWN_HOSTS}", "-o", "ConnectTimeout=5", f"{user}@{address}",
        "echo", _OK_MARK), parse_fabric_ssh)


def parse_fabric_ssh(output: str) -> FabricSsh:
    """Parse stdout+stderr of ``fabric_ssh``. OpenSSH says ``Warning: Identity file ... not accessible`` for a
    missing key and ``Host key verification failed.`` / ``No ED25519 host key is known`` for an unknown host."""
    if _OK_MARK in output:
        return FabricSsh(True)
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    key_missing = any("not accessible" in ln and "Identity file" in ln for ln in lines)
    host_key = any("Host key verification failed" in ln or "host key is known" in ln.lower() for ln in lines)
    return FabricSsh(False, key_missing, host_key, lines[-1] if lines else "no output")
