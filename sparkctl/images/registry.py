"""Copy images node to node over the fabric, moving only the layers the peer lacks (a short-lived registry).

Every Spark project we know pipes the whole image through ``docker save | ssh docker load`` each time. Here the
building node runs Debian/Ubuntu's ``docker-registry`` (the CNCF distribution registry, ``apt-get install
docker-registry``) for the duration of one copy, bound to its **fabric address** only, and the peer's own
daemon ``docker pull``s from it: Docker asks only for the layers it does not have, directly node to node over
the CX-7 link, never through the controller. Details:

* TLS with a certificate made for this run (``openssl`` on the building node, subjectAltName = its fabric
  address), trusted by the two daemons through ``/etc/docker/certs.d/<addr>:<port>/ca.crt`` (read per pull:
  no daemon restart, no ``insecure-registries``); removed when the copy ends.
* The registry's storage is a cache on the building node (``<host_paths.cache>/sparkctl-registry``): a push
  compresses and stores only layers it has not stored before, so a flag-only change pushes one thin layer.
* Progress per layer (compressed size, sent or already present) and the bytes the peer's fabric interface
  actually received (``/proc/net/dev``) are reported.
* Identity: the peer's image ID must equal the building node's after the pull (the ID is the config digest,
  which a registry round trip keeps), else ImageError.

Example::

    src = Endpoint.of(inventory, inventory.node("spark-a")); dst = Endpoint.of(inventory, inventory.node("spark-b"))
    for t in distribute([plan.engine_tag, plan.launch_tag], src, [dst], report=print):
        print(t.line())     # "spark-b <- sparkctl/sglang-gb10-launch:d5-...: 1 of 9 layers sent, 4.1 kB ..."
"""
from __future__ import annotations

import io
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from sparkctl.errors import ImageError

log = logging.getLogger("sparkctl.images")
PORT = int(os.environ.get("SPARKCTL_REGISTRY_PORT", "5055"))
REGISTRY_BINARY = "docker-registry"
CERTS_D = "/etc/docker/certs.d"
_START = 'exec "$0" serve "$1" >"$2" 2>&1 </dev/null & echo $!'   # fixed script; values are positional args
_WAIT = ("import socket,sys,time\nend=time.time()+float(sys.argv[3])\nwhile time.time()<end:\n"
         "    try:\n        socket.create_connection((sys.argv[1],int(sys.argv[2])),1).close();sys.exit(0)\n"
         "    except OSError:\n        time.sleep(0.1)\nsys.exit(1)\n")
_NO_SPACE = re.compile(r"no space left on device", re.I)


@dataclass
class Endpoint:
    """A node as the copy sees it: its connection (``.run``/``.put``), fabric address and interface, cache dir."""

    name: str
    conn: Any
    fabric_address: str
    fabric_iface: str
    cache_dir: str

    @classmethod
    def of(cls, inventory: Any, node: Any) -> "Endpoint":
        from sparkctl.nodes.ssh import connector_for
        return cls(node.name, connector_for(inventory, node), node.fabric_address, node.fabric_interface,
                   node.host_paths.cache)


@dataclass
class LayerMove:
    digest: str                 # compressed blob digest in the registry
    size: int                   # compressed bytes
    sent: bool


@dataclass
class Transfer:
    node: str
    image: str
    image_id: str
    layers: list[LayerMove] = field(default_factory=list)
    rx_bytes: int = 0           # what the peer's fabric interface received during the pull (all traffic)
    seconds: float = 0.0
    skipped: str | None = None

    @property
    def sent_bytes(self) -> int:
        return sum(layer.size for layer in self.layers if layer.sent)

    def line(self) -> str:
        if self.skipped:
            return f"{self.node} <- {self.image}: nothing to send ({self.skipped})"
        sent = [x for x in self.layers if x.sent]
        rate = self.rx_bytes / self.seconds / 1e6 if self.seconds else 0.0
        return (f"{self.node} <- {self.image}: {len(sent)} of {len(self.layers)} layers sent, "
                f"{self.sent_bytes / 1e6:.1f} MB compressed, {self.rx_bytes / 1e6:.1f} MB on the fabric in "
                f"{self.seconds:.1f}s ({rate:.0f} MB/s)")


def image_id(conn: Any, ref: str) -> str | None:
    r = conn.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], timeout=30)
    return r.stdout.strip() if r.returncode == 0 else None


def rx_bytes(ep: Endpoint) -> int:
    """Bytes received so far on the node's fabric interface (``/proc/net/dev``: per network namespace, unlike
    ``/sys/class/net`` in a process that entered only a network namespace)."""
    r = ep.conn.run(["cat", "/proc/net/dev"], timeout=15)
    for line in r.stdout.splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == ep.fabric_iface and counters.split():
            return int(counters.split()[0])
    raise ImageError(f"fabric interface {ep.fabric_iface} not found on {ep.name}", where=f"[{ep.name}] fabric",
                     hint="check fabric_interface in the inventory", evidence=r.output[-800:])


class Registry:
    """The short-lived TLS registry on ``source``'s fabric address (a context manager; stops and cleans up)."""

    def __init__(self, source: Endpoint, peers: list[Endpoint], port: int = PORT) -> None:
        self.source, self.peers, self.port = source, peers, port
        self.host = f"{source.fabric_address}:{port}"
        self.storage = f"{source.cache_dir.rstrip('/')}/sparkctl-registry"
        self.tmp = ""
        self.pid = ""

    def __enter__(self) -> "Registry":
        s = self.source
        if s.conn.run(["sh", "-c", 'command -v "$0"', REGISTRY_BINARY], timeout=15).returncode != 0:
            raise ImageError(f"{REGISTRY_BINARY} is not installed on {s.name}", where=f"[{s.name}] image copy",
                             hint=f"apt-get install docker-registry on {s.name} (Debian/Ubuntu package: the copy "
                                  "to the peer runs it for a few seconds on the fabric address)")
        self.tmp = s.conn.run(["mktemp", "-d", "/tmp/sparkctl-registry.XXXXXX"], check=True).stdout.strip()
        try:
            s.conn.run(["mkdir", "-p", self.storage], check=True)
            s.conn.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                        "/CN=sparkctl-registry", "-addext", f"subjectAltName=IP:{s.fabric_address}",
                        "-keyout", f"{self.tmp}/key.pem", "-out", f"{self.tmp}/cert.pem"], check=True, timeout=60)
            cert = s.conn.run(["cat", f"{self.tmp}/cert.pem"], check=True).stdout
            config = (f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {self.storage}\n"
                      f"http:\n  addr: {self.host}\n  tls:\n    certificate: {self.tmp}/cert.pem\n"
                      f"    key: {self.tmp}/key.pem\n")
            s.conn.put(io.BytesIO(config.encode()), f"{self.tmp}/config.yml")
            for ep in (s, *self.peers):
                ep.conn.run(["mkdir", "-p", f"{CERTS_D}/{self.host}"], check=True)
                ep.conn.put(io.BytesIO(cert.encode()), f"{CERTS_D}/{self.host}/ca.crt")
            self.pid = s.conn.run(["sh", "-c", _START, REGISTRY_BINARY, f"{self.tmp}/config.yml",
                                   f"{self.tmp}/registry.log"], check=True).stdout.strip()
            ready = s.conn.run(["python3", "-c", _WAIT, s.fabric_address, str(self.port), "15"], timeout=30)
            if ready.returncode != 0:
                logtail = s.conn.run(["tail", "-n", "20", f"{self.tmp}/registry.log"]).stdout
                raise ImageError(f"the registry did not come up on {self.host}", where=f"[{s.name}] image copy",
                                 hint=f"is port {self.port} free on {s.fabric_address}? "
                                      "(SPARKCTL_REGISTRY_PORT picks another)", evidence=logtail)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        s = self.source
        if self.pid.isdigit():
            s.conn.run(["kill", self.pid], timeout=15)
        for ep in (s, *self.peers):
            ep.conn.run(["rm", "-rf", f"{CERTS_D}/{self.host}"], timeout=15)
        if self.tmp.startswith("/tmp/sparkctl-registry."):
            s.conn.run(["rm", "-rf", self.tmp], timeout=15)

    def ref(self, image: str) -> str:
        return f"{self.host}/{image}"

    def push(self, image: str) -> None:
        s, ref = self.source, self.ref(image)
        s.conn.run(["docker", "tag", image, ref], check=True)
        try:
            r = s.conn.run(["docker", "push", ref], timeout=7200, merge_stderr=True)
        finally:
            s.conn.run(["docker", "rmi", ref], timeout=60)
        if r.returncode != 0:
            hint = ("free disk space on the building node (registry cache " + self.storage + ")"
                    if _NO_SPACE.search(r.stdout) else "see the evidence")
            raise ImageError(f"pushing {image} to the fabric registry on {s.name} failed",
                             where=f"[{s.name}] image copy", hint=hint, evidence=r.stdout[-1500:])

    def manifest_layers(self, image: str) -> list[tuple[str, int]]:
        """(digest, compressed size) of each layer of ``image`` as the registry stores it."""
        repo, tag = image.rsplit(":", 1)
        root = f"{self.storage}/docker/registry/v2"
        link = self.source.conn.run(["cat", f"{root}/repositories/{repo}/_manifests/tags/{tag}/current/link"],
                                    check=True).stdout.strip()
        hexd = link.split(":", 1)[1]
        data = self.source.conn.run(["cat", f"{root}/blobs/sha256/{hexd[:2]}/{hexd}/data"], check=True).stdout
        return [(layer["digest"], int(layer["size"])) for layer in json.loads(data)["layers"]]

    def pull(self, peer: Endpoint, image: str, source_id: str) -> Transfer:
        ref = self.ref(image)
        layers = self.manifest_layers(image)
        before, t0 = rx_bytes(peer), time.monotonic()
        r = peer.conn.run(["docker", "pull", ref], timeout=7200, merge_stderr=True)
        seconds, after = time.monotonic() - t0, rx_bytes(peer)
        if r.returncode != 0:
            peer.conn.run(["docker", "rmi", ref], timeout=60)
            if _NO_SPACE.search(r.stdout):
                raise ImageError(f"{peer.name} ran out of disk space while receiving {image}",
                                 where=f"[{peer.name}] image copy",
                                 hint=f"free space in {peer.name}'s docker data root (docker system df; sparkctl "
                                      "image prune), then run again; the running deployment is untouched",
                                 evidence=r.stdout[-1500:])
            raise ImageError(f"{peer.name} could not pull {image} from {self.host}", where=f"[{peer.name}] image copy",
                             hint="check the fabric link between the nodes (ping the fabric address)",
                             evidence=r.stdout[-1500:])
        present = {m.group(1) for m in re.finditer(r"^([0-9a-f]{12}): Already exists", r.stdout, re.M)}
        moves = [LayerMove(d, size, d.split(":", 1)[1][:12] not in present) for d, size in layers]
        peer.conn.run(["docker", "tag", ref, image], check=True)
        peer.conn.run(["docker", "rmi", ref], timeout=60)
        got = image_id(peer.conn, image)
        if got != source_id:
            raise ImageError(f"{image} on {peer.name} has ID {str(got)[:19]} after the copy, {self.source.name} has "
                             f"{source_id[:19]}", where=f"[{peer.name}] image copy",
                             hint=f"docker rmi {image} on {peer.name} and run again")
        return Transfer(peer.name, image, got, moves, after - before, round(seconds, 3))


def distribute(images: list[str], source: Endpoint, peers: list[Endpoint], *,
               report: Callable[[str], None] = lambda _: None, port: int = PORT) -> list[Transfer]:
    """Give every peer ``images`` (in order, e.g. engine then launch) with the source's image IDs.

    No-op with a reason for a peer that already has them all; otherwise one short-lived registry on the
    source's fabric address serves every peer, and only missing layers cross the fabric.
    """
    ids = {}
    for image in images:
        ids[image] = image_id(source.conn, image)
        if not ids[image]:
            raise ImageError(f"image {image} is not on {source.name}, the building node", where=f"[{source.name}] image",
                             hint="sparkctl image build first")
    transfers: list[Transfer] = []
    todo: list[tuple[Endpoint, str]] = []
    for peer in peers:
        for image in images:
            have = image_id(peer.conn, image)
            if have == ids[image]:
                transfers.append(Transfer(peer.name, image, have, skipped=f"{peer.name} has {have[:19]}"))
            elif have:
                raise ImageError(f"{image} on {peer.name} is {have[:19]}, on {source.name} {ids[image][:19]}",
                                 where=f"[{peer.name}] image", hint=f"docker rmi {image} on {peer.name} and run again "
                                                                    "(a tag names one content; someone retagged it)")
            else:
                todo.append((peer, image))
    for t in transfers:
        report(t.line())
    if not todo:
        return transfers
    with Registry(source, sorted({p.name: p for p, _ in todo}.values(), key=lambda p: p.name), port) as reg:
        for image in dict.fromkeys(i for _, i in todo):
            reg.push(image)
        for peer, image in todo:
            report(f"{peer.name} <- {image}: pulling from {reg.host} over the fabric")
            t = reg.pull(peer, image, ids[image])
            for layer in t.layers:
                report(f"  {layer.digest[:19]} {layer.size / 1e6:9.1f} MB  {'sent' if layer.sent else 'present'}")
            report(t.line())
            transfers.append(t)
    return transfers
