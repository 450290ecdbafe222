"""A first copy as one stream node to node over the fabric, and the choice between it and the registry.

The registry (`sparkctl.images.registry`) moves only the layers a peer lacks, but every layer it moves is gzipped
on the building node and gunzipped on the peer: for a peer that has (almost) nothing of the image that costs more
than it saves (a 386 MB first copy: 25.9 s through the registry against 12.1 s for a plain ``docker save |
docker load``). So a peer that lacks most of the image's bytes gets the whole images as one ``docker save`` on the
building node piped into ``docker load`` on the peer, over SSH on the fabric with the fabric key ``sparkctl
prepare --tags fabric-ssh`` made (host keys pinned in its known_hosts, as `sparkctl.nodes.host_facts.fabric_ssh`
checks them); any other peer pulls the missing layers from the registry.

What a peer holds is measured, not guessed: Docker stores layers by chain (a layer and every layer under it), so
what two images share is a common prefix of their ``RootFS.Layers``, and the bytes of a prefix are the ``Size`` of
an image made of exactly those layers. ``shared_bytes`` takes the largest peer image that is a prefix of ours
(the base, the previous engine image, an intermediate build image); layers it cannot account for count as
missing (the stream is then chosen a little early, never the registry for a peer that lacks most).

Example::

    img = ImageLayers(("sha256:a", "sha256:b"), 400_000_000)
    choose_copy([img], [ImageLayers(("sha256:a",), 380_000_000)], stream_ok=True).method   # 'registry'
    choose_copy([img], [], stream_ok=True).method                                          # 'stream'
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from sparkctl.errors import ImageError
from sparkctl.nodes.host_facts import FABRIC_KEY, FABRIC_KNOWN_HOSTS

STREAM_FRACTION = 0.5          # stream when the peer lacks more than this share of the image's bytes
# AES-GCM first: the CPUs of a Spark (and of CI machines) have AES instructions, so it costs less CPU per byte than
# OpenSSH's default chacha20-poly1305; both are authenticated ciphers, the host key is verified either way.
CIPHERS = "aes128-gcm@openssh.com,chacha20-poly1305@openssh.com"


@dataclass(frozen=True)
class ImageLayers:
    """One image as Docker stores it: its layer diff IDs (base first) and its total size in bytes."""

    layers: tuple[str, ...]
    size: int


@dataclass(frozen=True)
class CopyChoice:
    method: str              # stream | registry
    missing_bytes: int       # of the largest image of the copy
    total_bytes: int
    reason: str

    @property
    def missing_share(self) -> float:
        return self.missing_bytes / self.total_bytes if self.total_bytes else 0.0


def shared_bytes(image: ImageLayers, held: Iterable[ImageLayers]) -> int:
    """Bytes of ``image`` the peer already stores: all of them when ``image``'s layers are a prefix of (or equal to)
    a held image's, else the size of the largest held image whose layers are a prefix of ``image``'s, else 0."""
    n, best = len(image.layers), 0
    for h in held:
        m = len(h.layers)
        if m >= n and h.layers[:n] == image.layers:
            return image.size
        if m < n and image.layers[:m] == h.layers:
            best = max(best, min(h.size, image.size))
    return best


def choose_copy(images: list[ImageLayers], held: Iterable[ImageLayers], *, stream_ok: bool,
                stream_fraction: float = STREAM_FRACTION, why_not_stream: str = "") -> CopyChoice:
    """How one peer gets ``images`` (one copy's images share their layers: engine under launch): measured on the
    largest, a stream when the peer lacks more than ``stream_fraction`` of its bytes and the fabric SSH works,
    else the registry (only the missing layers, compressed)."""
    if not images:
        raise ValueError("choose_copy needs at least one image")
    held = list(held)
    top = max(images, key=lambda i: (i.size, len(i.layers)))
    missing = top.size - shared_bytes(top, held)
    share = missing / top.size if top.size else 0.0
    lacks = f"lacks {share:.0%} of {_mb(top.size)}"
    if share <= stream_fraction:
        return CopyChoice("registry", missing, top.size, f"{lacks}: only the missing layers through the registry")
    if not stream_ok:
        return CopyChoice("registry", missing, top.size,
                          f"{lacks}, but no fabric SSH for a whole-image stream ({why_not_stream or 'unavailable'}; "
                          f"sparkctl prepare --tags fabric-ssh): through the registry")
    return CopyChoice("stream", missing, top.size, f"{lacks}: one docker save | docker load stream over the fabric")


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


# ------------------------------------------------------------------------------------------------ survey
# Every image on the node (intermediate ones too: a legacy build's parents are prefixes), as "size layers-json".
_HELD = 'docker image ls -aq --no-trunc | sort -u | xargs -r docker image inspect --format "{{.Size}} {{json .RootFS.Layers}}"'


def parse_held(text: str) -> list[ImageLayers]:
    """Lines ``<size> ["sha256:..", ...]`` (the ``_HELD`` survey) as ImageLayers; other lines are skipped."""
    out = []
    for line in text.splitlines():
        size, _, layers = line.strip().partition(" ")
        if size.isdigit() and layers.startswith("["):
            out.append(ImageLayers(tuple(json.loads(layers)), int(size)))
    return out


def held_images(conn: Any) -> list[ImageLayers]:
    """What a node stores: every image's layers and size, in one round trip."""
    r = conn.run(["sh", "-c", _HELD], timeout=120)
    if r.returncode != 0:
        raise ImageError(f"listing the images on {getattr(conn, 'name', '?')} failed", evidence=r.output[-800:])
    return parse_held(r.stdout)


def image_layers_of(conn: Any, images: list[str]) -> list[ImageLayers]:
    """Layers and size of each of ``images`` on one node (they exist: the caller checked their IDs)."""
    r = conn.run(["docker", "image", "inspect", "--format", "{{.Size}} {{json .RootFS.Layers}}", *images], timeout=60)
    got = parse_held(r.stdout)
    if r.returncode != 0 or len(got) != len(images):
        raise ImageError(f"docker image inspect of {', '.join(images)} failed", evidence=r.output[-800:])
    return got


def fabric_ssh_argv(user: str, address: str) -> list[str]:
    """``ssh`` from the building node to a peer's fabric address with the fabric key, pinned host keys, no
    compression (the layers are tar, the link is fast) and a hardware-friendly cipher; a remote command follows."""
    return ["ssh", "-i", FABRIC_KEY, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={FABRIC_KNOWN_HOSTS}",
            "-o", "ConnectTimeout=5", "-o", "Compression=no", "-c", CIPHERS, f"{user}@{address}"]


# ------------------------------------------------------------------------------------------------ the stream
# Runs on the building node: docker save -> (counted here) -> ssh peer docker load, both argv lists; progress lines
# every 2 s, then one result line and the two commands' error tails.
_PUMP = r"""import json,os,subprocess,sys,tempfile,time
a=json.loads(sys.argv[1])
ein,eout=tempfile.TemporaryFile(),tempfile.TemporaryFile()
ssh=subprocess.Popen(a["ssh"]+["docker","load"],stdin=subprocess.PIPE,stdout=eout,stderr=subprocess.STDOUT)
save=subprocess.Popen(["docker","save"]+a["images"],stdout=subprocess.PIPE,stderr=ein)
src,dst=save.stdout.fileno(),ssh.stdin.fileno()
n,t0,shown,broken=0,time.time(),time.time(),False
while True:
    b=os.read(src,1<<20)
    if not b:
        break
    try:
        v=memoryview(b)
        while v:
            v=v[os.write(dst,v):]
    except BrokenPipeError:
        broken=True
        save.kill()
        break
    n+=len(b)
    if time.time()-shown>=2:
        shown=time.time();print("===PROGRESS",n,round(shown-t0,3),flush=True)
try:
    ssh.stdin.close()
except BrokenPipeError:
    broken=True
src_rc,dst_rc=save.wait(),ssh.wait()
t=time.time()-t0
ein.seek(0);eout.seek(0)
print("===DONE",src_rc,dst_rc,n,round(t,3),int(broken),flush=True)
print("===SAVE");print(ein.read().decode("utf-8","replace")[-1500:])
print("===LOAD");print(eout.read().decode("utf-8","replace")[-1500:])
"""


@dataclass
class StreamResult:
    bytes: int
    seconds: float
    load_output: str


def stream_images(source: Any, peer: Any, images: list[str], report: Callable[[str], None] = lambda _: None,
                  *, timeout: float = 7200) -> StreamResult:
    """``docker save images`` on ``source`` piped into ``docker load`` on ``peer`` over the fabric (both
    `sparkctl.images.registry.Endpoint`s); ImageError naming the peer (disk full, fabric SSH refused) otherwise."""
    from sparkctl.images.registry import _NO_SPACE, human

    arg = json.dumps({"ssh": fabric_ssh_argv(peer.user, peer.fabric_address), "images": images})

    def on_line(line: str) -> None:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "===PROGRESS":
            sent, secs = int(parts[1]), float(parts[2])
            report(f"  [{peer.name}] streamed {human(sent):>9} ({sent / max(secs, 1e-6) / 1e6:.0f} MB/s)")

    r = source.conn.run(["python3", "-c", _PUMP, arg], timeout=timeout, on_line=on_line)
    done = next((ln.split() for ln in r.stdout.splitlines() if ln.startswith("===DONE ")), None)
    save_err = r.stdout.partition("===SAVE\n")[2].partition("===LOAD\n")[0].strip()
    load_out = r.stdout.partition("===LOAD\n")[2].strip()
    where = f"[{peer.name}] image copy"
    if r.returncode != 0 or done is None or len(done) != 6:
        raise ImageError(f"streaming {', '.join(images)} from {source.name} to {peer.name} did not run",
                         where=where, hint="is python3 on the building node? see the evidence", evidence=r.output[-1500:])
    save_rc, load_rc, sent, secs = int(done[1]), int(done[2]), int(done[3]), float(done[4])
    if load_rc != 0:
        if _NO_SPACE.search(load_out):
            raise ImageError(f"{peer.name} ran out of disk space while receiving {', '.join(images)}", where=where,
                             hint=f"free space in {peer.name}'s docker data root (docker system df; sparkctl image "
                                  "prune), then run again; the running deployment is untouched", evidence=load_out)
        if load_rc == 255:
            raise ImageError(f"{source.name} could not SSH to {peer.name} over the fabric ({peer.fabric_address})",
                             where=where, hint="sparkctl prepare --tags fabric-ssh (the fabric key and host keys), "
                                               "and check the fabric link", evidence=load_out)
        raise ImageError(f"docker load of {', '.join(images)} failed on {peer.name}", where=where,
                         hint="see the evidence", evidence=load_out)
    if save_rc != 0:
        raise ImageError(f"docker save of {', '.join(images)} failed on {source.name}", where=f"[{source.name}] image copy",
                         hint="see the evidence", evidence=save_err or r.output[-1500:])
    return StreamResult(sent, secs, load_out)
