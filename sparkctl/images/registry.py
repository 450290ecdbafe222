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
* Docker's pull skips a layer only when it pulled it before under the same compressed digest; a layer it loaded,
  built or pulled from elsewhere crosses again. So after each pull the peer records the layers it now knows by
  this registry's digests (``<host_paths.cache>/sparkctl-registry-pulled``, ``PULLED_FILE``),
  and the copy's choice counts only those as present when it prices the registry.

The registry is the exception: a peer gets its images as one stream over the fabric that leaves out the layers it
holds (`sparkctl.images.stream`) unless the registry would send at most half of them (the layers it holds came
through the registry before: a flag-only change) or there is no fabric SSH; which peer gets what, all at once, is
`sparkctl.images.copy.distribute`. Example::

    src = Endpoint.of(inventory, inventory.node("spark-a")); dst = Endpoint.of(inventory, inventory.node("spark-b"))
    for t in distribute([plan.engine_tag, plan.launch_tag], src, [dst], report=print):   # images.copy
        print(t.line())     # "spark-b <- sparkctl/sglang-gb10-launch:d5-...: 1 of 9 layers sent, 4.1 kB ..."
"""
from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.filesize import decimal

from sparkctl.errors import ImageError
from sparkctl.jsontypes import JSONObject
from sparkctl.nodes.ssh import connector_for

if TYPE_CHECKING:
    from sparkctl.config.inventory import Inventory, Node
    from sparkctl.nodes.ssh import SSHConnector

log = logging.getLogger("sparkctl.images")
PORT = int(os.environ.get("SPARKCTL_REGISTRY_PORT", "5055"))
# In a node's cache directory (host_paths.cache): the layers (diff IDs, a line each) its Docker pulled from the fabric
# registry, written after each pull. Docker's pull cache knows them by the digests this registry serves, so it sends
# them no more; any other layer it sends again (`sparkctl.images.stream.choose_copy` prices the registry with it).
PULLED_FILE = "sparkctl-registry-pulled"
REGISTRY_BINARY = "docker-registry"
CERTS_D = "/etc/docker/certs.d"
# Fixed shell scripts (one SSH round trip each); every value reaches them as a positional argument, never as text.
_WAIT = ("import socket,sys,time\nend=time.time()+float(sys.argv[3])\nwhile time.time()<end:\n"
         "    try:\n        socket.create_connection((sys.argv[1],int(sys.argv[2])),1).close();sys.exit(0)\n"
         "    except OSError:\n        time.sleep(0.1)\nsys.exit(1)\n")
_UP = r"""set -e
command -v "$0" >/dev/null || { echo "NO-REGISTRY"; exit 3; }
tmp=$(mktemp -d /tmp/sparkctl-registry.XXXXXX)
mkdir -p "$1" "$4"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=sparkctl-registry \
  -addext "subjectAltName=IP:$2" -keyout "$tmp/key.pem" -out "$tmp/cert.pem" 2>"$tmp/openssl.log"
printf 'version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s:%s\n  tls:\n    certificate: %s/cert.pem\n    key: %s/key.pem\n' \
  "$1" "$2" "$3" "$tmp" "$tmp" >"$tmp/config.yml"
cp "$tmp/cert.pem" "$4/ca.crt"
"$0" serve "$tmp/config.yml" >"$tmp/registry.log" 2>&1 </dev/null &
echo "TMP $tmp $!"
python3 -c "$5" "$2" "$3" 15 || { echo "NOT-READY"; tail -n 20 "$tmp/registry.log"; exit 4; }
cat "$tmp/cert.pem"
"""  # noqa: E501 - the registry's config.yml as one printf format
_TRUST = 'mkdir -p "$0" && cat >"$0/ca.crt"'
_DOWN = 'kill "$0" 2>/dev/null; rm -rf "$1" "$2"; true'
_PUSH = 'docker tag "$0" "$1" && docker push "$1" 2>&1; rc=$?; docker rmi "$1" >/dev/null 2>&1; exit $rc'
_MANIFEST = ('l=$(cat "$1/repositories/$0/current/link") && h=${l#sha256:} && '
             'cat "$1/blobs/sha256/${h%"${h#??}"}/$h/data"')
_SAMPLE = ("import sys,time\nf=open('/proc/net/dev');last=None\nwhile True:\n    f.seek(0)\n"
           "    for ln in f.read().splitlines():\n        n,_,c=ln.partition(':')\n"
           "        if n.strip()==sys.argv[1] and c.split():\n            v=c.split()[0]\n"
           "            if v!=last:\n                print(time.time(),v,flush=True);last=v\n"
           "    time.sleep(0.005)\n")
_PULL = r"""cat /proc/net/dev
s=$(mktemp /tmp/sparkctl-rx.XXXXXX)
python3 -c "$3" "$2" >"$s" 2>/dev/null & sampler=$!
echo "===START $(date +%s.%N)"
docker pull "$0" 2>&1; rc=$?
echo "===END $rc $(date +%s.%N)"
kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
echo "===RX"; cat "$s"; rm -f "$s"; echo "===RXEND"
cat /proc/net/dev
if [ $rc = 0 ]; then docker tag "$0" "$1" && docker image inspect --format '===ID {{.Id}}' "$1"; fi
if [ $rc = 0 ] && mkdir -p "$4" 2>/dev/null && t=$(mktemp "$4/.pulled.XXXXXX" 2>/dev/null); then
  { cat -- "$4/$5" 2>/dev/null; docker image inspect --format '{{range .RootFS.Layers}}{{println .}}{{end}}' "$1"; } \
    | grep -E '^sha256:[0-9a-f]{64}$' | sort -u | tail -n 20000 >"$t" && mv -f "$t" "$4/$5" || rm -f "$t"
fi
docker rmi "$0" >/dev/null 2>&1
exit $rc
"""
_IDS = 'for r; do docker image inspect --format "{{.Id}}" "$r" 2>/dev/null || echo -; done'

_NO_SPACE = re.compile(r"no space left on device", re.I)
# docker push/pull status lines without a terminal (no byte counters then): one per layer and state
_LAYER_STATUS = re.compile(r"^([0-9a-f]{12}): (Pushed|Layer already exists|Download complete|Pull complete|"
                           r"Already exists)$")
_SAID = {"Pushed": "compressed and stored in the fabric registry", "Layer already exists": "already in the registry",
         "Download complete": "received", "Pull complete": "unpacked", "Already exists": "already here"}


def _layer_progress(node: str, report: Callable[[str], None], sizes: dict[str, int] | None = None
                    ) -> Callable[[str], None]:
    """An ``on_line`` for docker push/pull: each layer's state change as a progress line, as it happens."""
    def on_line(line: str) -> None:
        m = _LAYER_STATUS.match(line.strip())
        if m:
            size = f" {decimal(sizes[m.group(1)]):>9}" if sizes and m.group(1) in sizes else ""
            report(f"  [{node}] layer {m.group(1)}{size}: {_SAID[m.group(2)]}")
    return on_line


@dataclass
class Endpoint:
    """A node as the copy sees it: its connection (``.run``/``.put``), fabric address and interface, cache dir."""

    name: str
    conn: SSHConnector
    fabric_address: str
    fabric_iface: str
    cache_dir: str
    user: str = "root"          # SSH user on this node (the fabric stream logs in as it)

    @classmethod
    def of(cls, inventory: Inventory, node: Node) -> Endpoint:
        return cls(node.name, connector_for(inventory, node), node.fabric_address, node.fabric_interface,
                   node.host_paths.cache, node.ssh.user)


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
    seconds: float = 0.0        # the whole pull: download + decompress + unpack on the peer
    skipped: str | None = None
    wire_seconds: float = 0.0   # first to last byte received on the fabric interface (sampled every 5 ms)
    via: str = "registry"       # registry (missing layers) | stream (sparkctl.images.stream) | assembled (the
                                # launch image: sparkctl.images.assemble, loaded over the node's SSH connection)
    streamed_with: tuple[str, ...] = ()   # a stream's other images (its bytes and time are on its last image)
    stream_layers: tuple[int, int] | None = None   # a stream that left held layers out: (layers sent, layers)
    left_out_bytes: int = 0     # what it left out (uncompressed; on the stream's last image)

    @property
    def sent_bytes(self) -> int:
        return sum(layer.size for layer in self.layers if layer.sent)

    def line(self) -> str:
        if self.skipped:
            return f"{self.node} <- {self.image}: nothing to send ({self.skipped})"
        if self.via == "assembled":
            return (f"{self.node} <- {self.image}: assembled by sparkctl, {decimal(self.rx_bytes)} loaded over SSH in "
                    f"{self.seconds:.1f}s (the engine's layers were there)")
        if self.via == "stream":
            rate = self.rx_bytes / self.seconds / 1e6 if self.seconds else 0.0
            also = f" (with {', '.join(self.streamed_with)})" if self.streamed_with else ""
            if self.stream_layers is not None:
                crossed, total = self.stream_layers
                return (f"{self.node} <- {self.image}{also}: {crossed} of {total} layers sent, "
                        f"{decimal(self.rx_bytes)} "
                        f"over the fabric in {self.seconds:.1f}s ({rate:.1f} MB/s); "
                        f"{decimal(self.left_out_bytes)} held there left out") if self.seconds else \
                    f"{self.node} <- {self.image}: {crossed} of {total} layers sent, in the same stream as the next " \
                    "image"
            return (f"{self.node} <- {self.image}{also}: streamed whole, {decimal(self.rx_bytes)} over the fabric in "
                    f"{self.seconds:.1f}s ({rate:.1f} MB/s)") if self.seconds else \
                f"{self.node} <- {self.image}: in the same stream as the next image"
        sent = [x for x in self.layers if x.sent]
        rate = self.rx_bytes / self.seconds / 1e6 if self.seconds else 0.0
        return (f"{self.node} <- {self.image}: {len(sent)} of {len(self.layers)} layers sent, "
                f"{decimal(self.sent_bytes)} compressed, {decimal(self.rx_bytes)} on the fabric in "
                f"{self.seconds:.1f}s ({rate:.1f} MB/s)")


def _rx(proc_net_dev: str, iface: str) -> int | None:
    """Received bytes of ``iface`` in a ``/proc/net/dev`` text (per network namespace, unlike /sys/class/net in a
    process that entered only a network namespace)."""
    for line in proc_net_dev.splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == iface and counters.split():
            return int(counters.split()[0])
    return None


def _wire_window(samples: str, before: int | None, after: int | None) -> float:
    """Seconds from the sample that first saw rx above ``before`` to the first that saw 99% of the pull's bytes."""
    if before is None or after is None or after <= before:
        return 0.0
    points = [(float(t), int(v)) for t, v in (ln.split() for ln in samples.splitlines() if len(ln.split()) == 2)]
    target = before + 0.99 * (after - before)
    first = next((t for t, v in points if v > before), None)
    last = next((t for t, v in points if v >= target), None)
    return round(last - first, 4) if first is not None and last is not None and last > first else 0.0


def image_ids(conn: SSHConnector, refs: list[str]) -> dict[str, str | None]:
    """{ref: image id or None} on one node, in one round trip."""
    r = conn.run(["sh", "-c", _IDS, "sh", *refs], timeout=60)
    values = r.stdout.split()
    if r.returncode != 0 or len(values) != len(refs):
        raise ImageError(f"docker image inspect failed on {getattr(conn, 'name', '?')}", evidence=r.output[-800:])
    return {ref: (v if v != "-" else None) for ref, v in zip(refs, values)}


_PRUNE_CACHE = """import json,os,shutil,subprocess,sys,tempfile
root, binary, dry, keep = sys.argv[1], sys.argv[2], sys.argv[3] == "1", set(sys.argv[4:])
repos = os.path.join(root, "docker/registry/v2/repositories")
def size():
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
removed, before = [], (size() if os.path.isdir(root) else 0)
for d, subdirs, _ in os.walk(repos):
    if os.path.basename(d) == "tags" and os.path.basename(os.path.dirname(d)) == "_manifests":
        repo = os.path.relpath(os.path.dirname(os.path.dirname(d)), repos)
        for tag in sorted(subdirs):
            if repo + ":" + tag not in keep:
                removed.append(repo + ":" + tag)
                if not dry:
                    shutil.rmtree(os.path.join(d, tag))
        subdirs[:] = []
if removed and not dry:
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as cfg:
        cfg.write("version: 0.1\\nstorage:\\n  filesystem:\\n    rootdirectory: " + root + "\\n")
        cfg.flush()
        subprocess.run([binary, "garbage-collect", "--delete-untagged", cfg.name], check=True,
                       stdout=subprocess.DEVNULL)
print(json.dumps({"removed": removed, "freed": before - (size() if os.path.isdir(root) else 0)}))
"""


def prune_cache(endpoint: Endpoint, keep: set[str], *, dry_run: bool = False) -> JSONObject:
    """Drop from the node's registry cache every image not in ``keep`` (tags), then the blobs only they used.

    The cache makes a re-push of unchanged layers free; what no kept image references is dead weight (a real
    engine image is tens of GB). Returns {"removed": [repo:tag ...], "freed": bytes}. Run it while no copy is
    under way (``image prune`` holds the cluster lock, as a copy does).
    """
    storage = f"{endpoint.cache_dir.rstrip('/')}/sparkctl-registry"
    r = endpoint.conn.run(["python3", "-c", _PRUNE_CACHE, storage, REGISTRY_BINARY, "1" if dry_run else "0",
                           *sorted(keep)], timeout=1800)
    if r.returncode != 0:
        raise ImageError(f"pruning the registry cache {storage} failed", where=f"[{endpoint.name}] image prune",
                         hint=f"see the evidence; removing {storage} by hand is safe (the next copy pushes again)",
                         evidence=r.output[-1500:])
    return json.loads(r.stdout)


class Registry:
    """The short-lived TLS registry on ``source``'s fabric address (a context manager; stops and cleans up)."""

    def __init__(self, source: Endpoint, peers: list[Endpoint], port: int = PORT) -> None:
        self.source, self.peers, self.port = source, peers, port
        self.host = f"{source.fabric_address}:{port}"
        self.storage = f"{source.cache_dir.rstrip('/')}/sparkctl-registry"
        self.tmp = ""
        self.pid = ""

    def __enter__(self) -> Registry:
        s = self.source
        certs = f"{CERTS_D}/{self.host}"
        r = s.conn.run(["sh", "-c", _UP, REGISTRY_BINARY, self.storage, s.fabric_address, str(self.port), certs, _WAIT],
                       timeout=90)
        head = r.stdout.split("\n", 1)[0].split()
        if len(head) == 3 and head[0] == "TMP":
            self.tmp, self.pid = head[1], head[2]
        if "NO-REGISTRY" in r.stdout:
            raise ImageError(f"{REGISTRY_BINARY} is not installed on {s.name}", where=f"[{s.name}] image copy",
                             hint=f"apt-get install docker-registry on {s.name} (Debian/Ubuntu package: the copy "
                                  "to the peer runs it for a few seconds on the fabric address)")
        try:
            if r.returncode != 0 or "-----BEGIN CERTIFICATE-----" not in r.stdout:
                raise ImageError(f"the registry did not come up on {self.host}", where=f"[{s.name}] image copy",
                                 hint=f"is port {self.port} free on {s.fabric_address}? (SPARKCTL_REGISTRY_PORT "
                                      "picks another); is openssl installed?", evidence=r.output[-1500:])
            cert = r.stdout[r.stdout.index("-----BEGIN CERTIFICATE-----"):]
            for ep in self.peers:
                ep.conn.run(["sh", "-c", _TRUST, certs], stdin=cert, check=True, timeout=30)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        certs = f"{CERTS_D}/{self.host}"
        tmp = self.tmp if self.tmp.startswith("/tmp/sparkctl-registry.") else ""
        self.source.conn.run(["sh", "-c", _DOWN, self.pid if self.pid.isdigit() else "", tmp, certs], timeout=30)
        for ep in self.peers:
            ep.conn.run(["rm", "-rf", certs], timeout=15)

    def ref(self, image: str) -> str:
        return f"{self.host}/{image}"

    def push(self, image: str, report: Callable[[str], None] = lambda _: None) -> None:
        s = self.source
        r = s.conn.run(["sh", "-c", _PUSH, image, self.ref(image)], timeout=7200,
                       on_line=_layer_progress(s.name, report))
        if r.returncode != 0:
            hint = ("free disk space on the building node (registry cache " + self.storage + ")"
                    if _NO_SPACE.search(r.output) else "see the evidence")
            raise ImageError(f"pushing {image} to the fabric registry on {s.name} failed",
                             where=f"[{s.name}] image copy", hint=hint, evidence=r.output[-1500:])

    def manifest_layers(self, image: str) -> list[tuple[str, int]]:
        """(digest, compressed size) of each layer of ``image`` as the registry stores it."""
        repo, tag = image.rsplit(":", 1)
        r = self.source.conn.run(["sh", "-c", _MANIFEST, f"{repo}/_manifests/tags/{tag}",
                                  f"{self.storage}/docker/registry/v2"], check=True, timeout=30)
        return [(layer["digest"], int(layer["size"])) for layer in json.loads(r.stdout)["layers"]]

    def pull(self, peer: Endpoint, image: str, source_id: str, report: Callable[[str], None] = lambda _: None
             ) -> Transfer:
        layers = self.manifest_layers(image)
        sizes = {d.split(":", 1)[1][:12]: size for d, size in layers}
        r = peer.conn.run(["sh", "-c", _PULL, self.ref(image), image, peer.fabric_iface, _SAMPLE, peer.cache_dir,
                           PULLED_FILE], timeout=7200,
                          on_line=_layer_progress(peer.name, report, sizes))
        before_text, _, rest = r.stdout.partition("===START ")
        started, _, rest = rest.partition("\n")
        pull_out, _, rest = rest.partition("===END ")
        end_line, _, rest = rest.partition("\n")
        samples, _, after_text = rest.partition("===RX\n")[2].partition("===RXEND\n")
        end = end_line.split()
        before, after = _rx(before_text, peer.fabric_iface), _rx(after_text, peer.fabric_iface)
        if r.returncode != 0:
            text = pull_out or r.output
            if _NO_SPACE.search(text):
                raise ImageError(f"{peer.name} ran out of disk space while receiving {image}",
                                 where=f"[{peer.name}] image copy",
                                 hint=f"free space in {peer.name}'s docker data root (docker system df; sparkctl "
                                      "image prune), then run again; the running deployment is untouched",
                                 evidence=text[-1500:])
            raise ImageError(f"{peer.name} could not pull {image} from {self.host}", where=f"[{peer.name}] image copy",
                             hint="check the fabric link between the nodes (ping the fabric address)",
                             evidence=text[-1500:])
        if before is None or after is None:
            raise ImageError(f"fabric interface {peer.fabric_iface} not found on {peer.name}",
                             where=f"[{peer.name}] fabric", hint="check fabric_interface in the inventory")
        got = next((ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("===ID ")), None)
        if got != source_id:
            raise ImageError(f"{image} on {peer.name} has ID {str(got)[:19]} after the copy, {self.source.name} has "
                             f"{source_id[:19]}", where=f"[{peer.name}] image copy",
                             hint=f"docker rmi {image} on {peer.name} and run again")
        fetched = {m.group(1) for m in re.finditer(r"^([0-9a-f]{12}): Pull complete", pull_out, re.M)}
        moves = [LayerMove(d, size, d.split(":", 1)[1][:12] in fetched) for d, size in layers]
        seconds = float(end[1]) - float(started) if len(end) == 2 else 0.0
        return Transfer(peer.name, image, got, moves, after - before, round(seconds, 3),
                        wire_seconds=_wire_window(samples, before, after))
