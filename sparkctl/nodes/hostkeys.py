"""Host keys of the nodes: checked against the inventory's known_hosts, never ignored.

Policy ``accept-new`` appends an unknown host's key on first contact (like OpenSSH's
``StrictHostKeyChecking=accept-new``; the file is appended under a lock, never rewritten); ``pinned`` refuses an
unknown host with the command that adds its key after checking it out of band. A *changed* key is refused by
`sparkctl.nodes.ssh` itself (paramiko's BadHostKeyException), whatever the policy.
"""
from __future__ import annotations

import base64
import fcntl
import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from sparkctl.errors import NodeError
from sparkctl.extras import needed

if TYPE_CHECKING:
    import paramiko

    from sparkctl.config.inventory import ClusterSettings

log = logging.getLogger("sparkctl.nodes.ssh")

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


def known_hosts_path(cluster: ClusterSettings | None) -> Path:
    return Path(os.path.expanduser((cluster.known_hosts if cluster else None) or DEFAULT_KNOWN_HOSTS))


def host_key_name(host: str, port: int) -> str:
    """known_hosts name of a host: ``host`` on port 22, ``[host]:port`` otherwise (as OpenSSH writes it)."""
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint of a host key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


_KNOWN_HOSTS_LOCK = threading.Lock()


def missing_key_policy(kind: str, node: str, path: Path) -> paramiko.MissingHostKeyPolicy:
    """What to do with a host not in known_hosts: ``accept-new`` (append its key) or ``pinned`` (refuse)."""
    with needed("nodes", f"SSH to node {node}"):
        import paramiko

    class AcceptNew(paramiko.MissingHostKeyPolicy):
        """Unknown host: trust on first contact and append the key to known_hosts (never rewrite the file)."""

        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
            line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
            with _KNOWN_HOSTS_LOCK:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)   # another sparkctl process may add a host right now
                    os.write(fd, line.encode())
                finally:
                    os.close(fd)
            client.get_host_keys().add(hostname, key.get_name(), key)
            log.warning("[%s] new host key for %s (%s %s) added to %s (host_key_policy accept-new)",
                        node, hostname, key.get_name(), fingerprint(key), path)

    class Pinned(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
            raise NodeError(
                f"host key of {hostname} is not in {path} and host_key_policy is 'pinned'",
                where=f"[{node}] ssh",
                hint="verify the key out of band "
                     f"(on the node: ssh-keygen -lf /etc/ssh/ssh_host_{key_type(key)}_key.pub)"
                     f", then add it: ssh-keyscan -t {key_type(key)} {hostname.strip('[]').split(']:')[0]} >> {path}",
                evidence=f"offered: {key.get_name()} {fingerprint(key)}")

    return AcceptNew() if kind == "accept-new" else Pinned()


def key_type(key: paramiko.PKey) -> str:
    """``ed25519``, ``rsa``, ``ecdsa``: the key type as ssh-keygen and /etc/ssh file names spell it."""
    name = key.get_name()
    return {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa"}.get(name, "ecdsa" if name.startswith("ecdsa") else name)
