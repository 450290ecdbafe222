"""A copy as one stream node to node over the fabric, and the choice between it and the registry.

The registry (`sparkctl.images.registry`) moves only the layers a peer lacks, but every layer it moves is gzipped
on the building node and gunzipped on the peer: for a peer that has (almost) nothing of the image that costs more
than it saves (a 386 MB first copy: 25.9 s through the registry against 12.1 s for a plain ``docker save |
docker load``). And Docker's pull knows a layer the peer already stores only by the compressed digest it pulled it
under: a layer the peer loaded, built or pulled from elsewhere (the base from NGC, an earlier stream) is sent again,
whole (measured on the real-engine base: a first copy of 537.7 s through the registry against 59.3 s for the same
bytes by hand). So the stream is the rule and the registry the exception:

* a peer gets the images as one ``docker save`` on the building node piped into ``docker load`` on the peer, over
  SSH on the fabric with the fabric key ``sparkctl prepare --tags fabric-ssh`` made (host keys pinned in its
  known_hosts, as `sparkctl.nodes.facts.fabric_ssh` checks them). When the peer holds a prefix of the image's
  layers, the stream leaves those layers out (`docker load` takes an archive whose manifest names layers it
  already stores by chain; measured on Docker 20.10): only the layers it lacks cross the fabric.
* the registry is chosen when it would send at most ``STREAM_FRACTION`` of the image: when the layers the peer holds
  came to it through the fabric registry before (the peer's record of what it pulled,
  `sparkctl.images.registry.PULLED_FILE` in its cache directory, written by the registry pull), an image one layer
  apart from what the peer pulled costs one thin compressed layer and no ``docker save`` of the whole image on the
  building node. (The pipeline's launch image is not copied at all: `sparkctl.images.assemble` loads it on every
  node from the engine image the node holds.) Without fabric
  SSH the registry is used whatever it costs.

What a peer holds is measured, not guessed: Docker stores layers by chain (a layer and every layer under it), so
what two images share is a common prefix of their ``RootFS.Layers``, and the bytes of a prefix are the ``Size`` of
an image made of exactly those layers. ``shared_bytes`` takes the largest peer image that is a prefix of ours
(the base, the previous engine image, an intermediate build image); layers it cannot account for count as
missing. A wrong guess costs time, never the image: ``docker load`` checks every layer it reads against the image's
diff IDs, and a layer left out that the peer turns out not to have fails the load, which `sparkctl.images.copy`
retries through the registry.

Example::

    img = ImageLayers(("sha256:a", "sha256:b"), 400_000_000)
    base = ImageLayers(("sha256:a",), 380_000_000)
    choose_copy([img], [base], stream_ok=True).method                           # 'stream', without sha256:a
    choose_copy([img], [base], stream_ok=True, pulled={"sha256:a"}).method      # 'registry'
    choose_copy([img], [], stream_ok=True).method                               # 'stream'
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkctl.errors import ImageError
from sparkctl.images.registry import _NO_SPACE, PULLED_FILE
from sparkctl.nodes.facts import FABRIC_KEY, FABRIC_KNOWN_HOSTS
from sparkctl.untrusted import clean

if TYPE_CHECKING:
    from sparkctl.images.registry import Endpoint
    from sparkctl.nodes.ssh import SSHConnector

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
    missing_bytes: int       # of the largest image of the copy, what the chosen way sends
    total_bytes: int
    reason: str
    held: tuple[str, ...] = ()   # a stream's: the layers the peer holds (by chain), left out of it

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


def held_prefix(image: ImageLayers, held: Iterable[ImageLayers]) -> tuple[str, ...]:
    """The longest prefix of ``image``'s layers that one held image stores (a chain the peer's Docker has)."""
    best: tuple[str, ...] = ()
    for h in held:
        n = 0
        for a, b in zip(image.layers, h.layers):
            if a != b:
                break
            n += 1
        if n > len(best):
            best = image.layers[:n]
    return best


def choose_copy(images: list[ImageLayers], held: Iterable[ImageLayers], *, stream_ok: bool,
                pulled: Iterable[str] = (), stream_fraction: float = STREAM_FRACTION,
                why_not_stream: str = "") -> CopyChoice:
    """How one peer gets ``images`` (one copy's images share their layers: engine under launch), measured on the
    largest: the registry when it would send at most ``stream_fraction`` of its bytes (the held images whose layers
    the peer all ``pulled`` through the fabric registry count; Docker's pull sends any other layer again), else a
    stream leaving out the layers the peer holds, when the fabric SSH works; else the registry."""
    if not images:
        raise ValueError("choose_copy needs at least one image")
    held, known = list(held), set(pulled)
    top = max(images, key=lambda i: (i.size, len(i.layers)))
    missing = top.size - shared_bytes(top, held)
    by_registry = top.size - shared_bytes(top, [h for h in held if h.layers and known.issuperset(h.layers)])
    share, registry_share = (missing / top.size, by_registry / top.size) if top.size else (0.0, 0.0)
    lacks = f"lacks {share:.0%} of {_mb(top.size)}"
    if registry_share <= stream_fraction:
        return CopyChoice("registry", by_registry, top.size, f"{lacks}: only the missing layers through the registry")
    if not stream_ok:
        return CopyChoice("registry", by_registry, top.size,
                          f"{lacks}, but no fabric SSH for a stream ({why_not_stream or 'unavailable'}; "
                          f"sparkctl prepare --tags fabric-ssh): through the registry")
    prefix = held_prefix(top, held) if missing < top.size else ()
    later = set(top.layers[len(prefix):])     # a layer found again above the prefix (same content) still crosses
    keep = tuple(x for x in prefix if x not in later)
    if not keep:
        return CopyChoice("stream", missing, top.size, f"{lacks}: one docker save | docker load stream over the fabric")
    return CopyChoice("stream", missing, top.size,
                      f"{lacks} (the registry would send {registry_share:.0%}: Docker's pull cache does not know the "
                      f"{len(keep)} layers it holds): one docker save | docker load stream over the fabric, without "
                      f"those layers", keep)


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


# ------------------------------------------------------------------------------------------------ survey
# Every image on the node (intermediate ones too: a legacy build's parents are prefixes), as "size layers-json".
_HELD = ('docker image ls -aq --no-trunc | sort -u | '
         'xargs -r docker image inspect --format "{{.Size}} {{json .RootFS.Layers}}"')


def parse_held(text: str) -> list[ImageLayers]:
    """Lines ``<size> ["sha256:..", ...]`` (the ``_HELD`` survey) as ImageLayers; other lines are skipped."""
    out = []
    for line in text.splitlines():
        size, _, layers = line.strip().partition(" ")
        if size.isdigit() and layers.startswith("["):
            out.append(ImageLayers(tuple(json.loads(layers)), int(size)))
    return out


_DIFF_ID = re.compile(r"^sha256:[0-9a-f]{64}$")

# Each ref's "id size layers-json" (or "-" when absent), then, with "held=FILE", what the node pulled from the fabric
# registry (FILE: `sparkctl.images.registry.PULLED_FILE` in its cache directory) and every image it stores.
# (docker prints an empty line for a missing image before failing: hence the capture)
# With "fabric=ADDR,ADDR" as $0 instead (the building node): for each peer address whether the fabric key is there and
# the peer's fabric host key is pinned (preflight's fabric-ssh check has tried the login itself).
_SURVEY = ('case "$0" in fabric=*) for a in $(echo "${0#fabric=}" | tr , " "); do '
           'if [ -r "$HOME/.ssh/sparkctl_fabric_ed25519" ] && ssh-keygen -F "$a" '
           '-f "$HOME/.ssh/sparkctl_fabric_known_hosts" >/dev/null 2>&1; then echo "===FABRIC $a ok"; '
           'elif [ -r "$HOME/.ssh/sparkctl_fabric_ed25519" ]; then echo "===FABRIC $a host-key"; '
           'else echo "===FABRIC $a key"; fi; done;; esac; '
           'for r; do o=$(docker image inspect --format "{{.Id}} {{.Size}} {{json .RootFS.Layers}}" "$r" 2>/dev/null) '
           '&& echo "$o" || echo -; done; case "$0" in held=*) ;; *) exit 0;; esac; echo ===PULLED; '
           'cat -- "${0#held=}" 2>/dev/null; echo ===HELD; ' + _HELD)


@dataclass(frozen=True)
class Survey:
    """What one node says about the copy's images (ID and layers, None when absent) and, asked, all it stores."""

    ids: dict[str, str | None]
    layers: dict[str, ImageLayers | None]
    held: list[ImageLayers]
    fabric: dict[str, str] = field(default_factory=dict)   # peer fabric address -> ok | key | host-key
    pulled: frozenset[str] = frozenset()                   # layers it pulled from the fabric registry (PULLED_FILE)


def survey(conn: SSHConnector, refs: list[str], *, held_in: str | None = None,
           fabric_peers: Sequence[str] = ()) -> Survey:
    """One round trip: each ref's image ID and layers on the node, and (``held_in``: a peer, its cache directory)
    every image it stores and what it pulled from the fabric registry, or (``fabric_peers``: the building node)
    whether its fabric key and each peer's fabric host key are in place."""

    if held_in is not None and fabric_peers:
        raise ValueError("survey: held_in (a peer) or fabric_peers (the building node), not both")
    mode = f"held={held_in.rstrip('/')}/{PULLED_FILE}" if held_in is not None else \
        f"fabric={','.join(fabric_peers)}" if fabric_peers else "-"
    r = conn.run(["sh", "-c", _SURVEY, mode, *refs], timeout=120)
    fabric = {ln.split()[1]: ln.split()[2] for ln in r.stdout.splitlines()
              if ln.startswith("===FABRIC ") and len(ln.split()) == 3}
    mine, _, rest = r.stdout.partition("===HELD\n")
    mine, _, pulled_text = mine.partition("===PULLED\n")
    pulled = frozenset(ln.strip() for ln in pulled_text.splitlines() if _DIFF_ID.match(ln.strip()))
    lines = [ln for ln in mine.splitlines() if not ln.startswith("===FABRIC ")]
    if r.returncode != 0 or len(lines) != len(refs):
        raise ImageError(f"docker image inspect failed on {getattr(conn, 'name', '?')}", evidence=r.output[-800:])
    ids: dict[str, str | None] = {}
    layers: dict[str, ImageLayers | None] = {}
    for ref, line in zip(refs, lines):
        iid, _, info = line.strip().partition(" ")
        parsed = parse_held(info)
        ids[ref], layers[ref] = (iid, parsed[0]) if iid.startswith("sha256:") and parsed else (None, None)
    return Survey(ids, layers, parse_held(rest), fabric, pulled)


def fabric_ssh_argv(user: str, address: str) -> list[str]:
    """``ssh`` from the building node to a peer's fabric address with the fabric key, pinned host keys, no
    compression (the layers are tar, the link is fast) and a hardware-friendly cipher; a remote command follows."""
    return ["ssh", "-i", FABRIC_KEY, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={FABRIC_KNOWN_HOSTS}",
            "-o", "ConnectTimeout=5", "-o", "Compression=no", "-c", CIPHERS, f"{user}@{address}"]


# ------------------------------------------------------------------------------------------------ the stream
# Runs on the building node: one `docker save`, its bytes written to every peer's `ssh ... docker load` (argv lists;
# the remote command is one shlex-quoted argv, as sparkctl's own SSH connector sends it). A peer whose ssh dies is
# dropped and the others go on. One peer and nothing left out: docker save writes straight into ssh (no copy here;
# the byte count is docker save's wchar). With "skip" (diff IDs the peers hold): the archive is read member by member
# and written again without those layers: a layer named by its digest (Docker >= 25: blobs/sha256/<diff ID>) is
# dropped by name; a legacy `<v1 id>/layer.tar` by the diff ID its directory is known to hold (SAVE_LAYERS_FILE in the
# spool directory: a v1 id is a hash over its layer's chain, so one name always means one layer), else by the sha256
# of its bytes, spooled to a file there first (a spool whose disk is full costs bytes, not the copy: that layer is sent
# whole, "===SPOOLFULL n error"). Progress every 2 s; then "===DROPPED layers bytes", per peer
# "===PEER i rc bytes seconds" and its output, "===SAVE rc bytes".
SAVE_LAYERS_FILE = "sparkctl-save-layers.json"
_PUMP = r"""import contextlib,hashlib,io,json,os,shlex,subprocess,sys,tarfile,tempfile,time
a=json.loads(sys.argv[1])
skip=set(a.get("skip") or ())
remote=shlex.join(["sh","-c",'docker load && docker image inspect --format "===ID {{.Id}}" "$@"',"sh"]+a["images"])
peers=[]
for argv in a["ssh"]:
    out=tempfile.TemporaryFile()
    peers.append({"p":subprocess.Popen(argv+[remote],stdin=subprocess.PIPE,stdout=out,stderr=subprocess.STDOUT),
                  "out":out,"n":0,"t":None,"live":True})
err=tempfile.TemporaryFile()
one=len(peers)==1 and not skip
save=subprocess.Popen(["docker","save"]+a["images"],stdout=peers[0]["p"].stdin if one else subprocess.PIPE,stderr=err)
n,t0,shown=0,time.time(),time.time()
dropped=[0,0]
def wrote():
    try:
        return int(open("/proc/%d/io"%save.pid).read().split("wchar:")[1].split()[0])
    except (OSError,IndexError,ValueError):
        return peers[0]["n"]
def exited(p):   # without reaping it: a zombie's /proc/PID/io still holds its final count
    return os.waitid(os.P_PID,p.pid,os.WEXITED|os.WNOHANG|os.WNOWAIT) is not None
def send(b):     # to every live peer; False once none is left
    global n,shown
    n+=len(b)
    for p in peers:
        if not p["live"]:
            continue
        try:
            v,fd=memoryview(b),p["p"].stdin.fileno()
            while v:
                v=v[os.write(fd,v):]
            p["n"]+=len(b)
        except BrokenPipeError:
            p["live"]=False;p["t"]=time.time()-t0
    if time.time()-shown>=2:
        shown=time.time();print("===PROGRESS",round(shown-t0,3)," ".join(str(p["n"]) for p in peers),flush=True)
    return any(p["live"] for p in peers)
class Out:
    def write(self,b):
        if not send(bytes(b)):
            raise BrokenPipeError("every peer is gone")
        return len(b)
class Chain:     # a layer's bytes again: what the spool holds, then what it could not take, then the rest unread
    def __init__(self,parts):
        self.parts=parts;self.spool=parts[0]
    def read(self,k=-1):
        out=b""
        while self.parts and (k<0 or len(out)<k):
            b=self.parts[0].read(-1 if k<0 else k-len(out))
            if b:
                out+=b
            else:
                self.parts.pop(0)
        return out
    def close(self):
        self.spool.close()
spool_full=[]
def spooled(f,where):
    # (its diff ID, its bytes to send); (None, its bytes) when the spool's disk is full: the layer is sent whole
    h,t=hashlib.sha256(),tempfile.TemporaryFile(dir=where,buffering=0)
    pending=b""
    try:
        while True:
            b=f.read(1<<20)
            if not b:
                break
            h.update(b);pending=b
            while pending:
                pending=pending[t.write(pending):]
    except OSError as e:
        spool_full.append(str(e))
        t.seek(0)
        return None,Chain([t,io.BytesIO(pending),f])
    t.seek(0)
    return "sha256:"+h.hexdigest(),Chain([t])
def known_layers(path):
    try:
        fd=os.open(path,os.O_RDONLY|os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            got=json.loads(f.read(8<<20))
        return {str(k):str(v) for k,v in got.items()} if isinstance(got,dict) else {}
    except (OSError,ValueError):
        return {}
def keep_known(path,known):
    try:
        items=list(known.items())[-4096:]
        fd,tmp=tempfile.mkstemp(dir=os.path.dirname(path),prefix=".save-layers.")
        with os.fdopen(fd,"w") as f:
            json.dump(dict(items),f)
        os.replace(tmp,path)
    except OSError:
        pass
def filtered():
    where=a["spool"]
    try:
        os.makedirs(where,mode=0o700,exist_ok=True)
    except OSError:
        where=None
    path=os.path.join(where or tempfile.gettempdir(),a["layers_file"])
    known=known_layers(path) if where else {}
    before=dict(known)
    src=tarfile.open(fileobj=save.stdout,mode="r|",bufsize=1<<20)
    dst=tarfile.open(fileobj=Out(),mode="w|",bufsize=1<<20,format=tarfile.PAX_FORMAT)
    try:
        for m in src:
            f=src.extractfile(m) if m.isfile() else None
            name,base=m.name,os.path.basename(m.name)
            if f is not None and name.startswith("blobs/sha256/") and "sha256:"+base in skip:
                dropped[0]+=1;dropped[1]+=m.size
                continue
            if f is not None and base=="layer.tar":
                d=known.get(os.path.dirname(name))
                if d is None:
                    d,t=spooled(f,where)
                    if d is not None:
                        known[os.path.dirname(name)]=d
                    with contextlib.closing(t):
                        if d in skip:
                            dropped[0]+=1;dropped[1]+=m.size
                        else:
                            dst.addfile(m,t)
                    continue
                if d in skip:
                    dropped[0]+=1;dropped[1]+=m.size
                    continue
            dst.addfile(m,f)
        dst.close()
    except BrokenPipeError:
        pass
    if where and known!=before:
        keep_known(path,known)
if one:
    peers[0]["p"].stdin.close()
    while not exited(save) and peers[0]["p"].poll() is None:
        time.sleep(0.1);n=max(n,wrote())
        if time.time()-shown>=2:
            shown=time.time();print("===PROGRESS",round(shown-t0,3),n,flush=True)
    peers[0]["n"]=n=max(n,wrote())
    if not exited(save):
        save.kill()
elif skip:
    filtered()
    while any(p["live"] for p in peers) and os.read(save.stdout.fileno(),1<<20):
        pass      # what docker save writes after the archive's end (padding): read, so that it exits
else:
    while any(p["live"] for p in peers):
        b=os.read(save.stdout.fileno(),1<<20)
        if not b or not send(b):
            break
if not one and not any(p["live"] for p in peers):
    save.kill()
for p in peers:
    try:
        p["p"].stdin.close()
    except BrokenPipeError:
        pass
save_rc=save.wait()
print("===DROPPED",dropped[0],dropped[1],flush=True)
if spool_full:
    print("===SPOOLFULL",len(spool_full),spool_full[0],flush=True)
for i,p in enumerate(peers):
    rc=p["p"].wait()
    p["out"].seek(0)
    print("===PEER",i,rc,p["n"],round(p["t"] or time.time()-t0,3),flush=True)
    print(p["out"].read().decode("utf-8","replace")[-3000:]);print("===END")
err.seek(0)
print("===SAVE",save_rc,n);print(err.read().decode("utf-8","replace")[-1500:])
"""


class StreamFailed(ImageError):
    """The stream itself did not get the images there (the pump did not run, the fabric SSH was refused, docker save
    or docker load failed): the registry may still, and `sparkctl.images.copy` tries it. A peer that ran out of disk
    space gets a plain ImageError (the registry would fail the same way)."""


@dataclass
class StreamResult:
    bytes: int
    seconds: float
    image_ids: list[str]          # what the peer's docker says after the load, in the images' order
    left_out: int = 0             # layers the stream left out (the peer holds them)
    left_out_bytes: int = 0


def stream_images(source: Endpoint, peers: list[Endpoint], images: list[str],
                  report: Callable[[str], None] = lambda _: None,
                  *, skip: Sequence[str] = (), timeout: float = 7200) -> dict[str, StreamResult | ImageError]:
    """``docker save images`` once on ``source`` into ``docker load`` on every peer over the fabric (all
    `sparkctl.images.registry.Endpoint`s), without the layers ``skip`` names (diff IDs every one of these peers
    holds by chain). Returns each peer's result, or the ImageError naming what went wrong there (disk full, fabric
    SSH refused, load failed); a failed ``docker save`` or pump is every peer's error."""
    from rich.filesize import decimal


    arg = json.dumps({"ssh": [fabric_ssh_argv(p.user, p.fabric_address) for p in peers], "images": images,
                      "skip": list(skip), "spool": source.cache_dir, "layers_file": SAVE_LAYERS_FILE})

    def on_line(line: str) -> None:
        parts = line.split()
        if len(parts) == 2 + len(peers) and parts[0] == "===PROGRESS":
            secs = float(parts[1])
            for p, sent in zip(peers, map(int, parts[2:])):
                report(f"  [{p.name}] streamed {decimal(sent):>9} ({sent / max(secs, 1e-6) / 1e6:.0f} MB/s)")

    r = source.conn.run(["python3", "-c", _PUMP, arg], timeout=timeout, on_line=on_line)
    what = ", ".join(images)
    sections = r.stdout.split("===PEER ")[1:]
    save = r.stdout.rpartition("===SAVE ")[2]
    save_rc = save.split(None, 1)[0] if save.strip() else ""
    if r.returncode != 0 or len(sections) != len(peers) or not save_rc.lstrip("-").isdigit():
        err = StreamFailed(f"streaming {what} from {source.name} did not run", where=f"[{source.name}] image copy",
                         hint="is python3 on the building node? see the evidence", evidence=r.output[-1500:])
        return {p.name: err for p in peers}
    full = r.stdout.rpartition("===SPOOLFULL ")[2].split("\n", 1)[0].split(None, 1) if "===SPOOLFULL " in r.stdout \
        else []
    if len(full) == 2:
        report(f"  [{source.name}] {full[0]} layer(s) sent whole: the spool in {source.cache_dir} could not hold them "
               f"to hash ({clean(full[1], 200)}); free space there to leave out what peers hold")
    dropped = r.stdout.rpartition("===DROPPED ")[2].split("\n", 1)[0].split()
    left_out, left_out_bytes = (int(dropped[0]), int(dropped[1])) if len(dropped) == 2 and \
        all(x.isdigit() for x in dropped) else (0, 0)
    out: dict[str, StreamResult | ImageError] = {}
    for p, sec in zip(peers, sections):
        head, _, body = sec.partition("\n")
        body = body.partition("===END")[0].strip()
        _, rc, sent, secs = head.split()
        where = f"[{p.name}] image copy"
        ids = [ln.split()[1] for ln in body.splitlines() if ln.startswith("===ID ")]
        if int(rc) == 0 and len(ids) == len(images):
            out[p.name] = StreamResult(int(sent), float(secs), ids, left_out, left_out_bytes)
        elif _NO_SPACE.search(body):
            out[p.name] = ImageError(f"{p.name} ran out of disk space while receiving {what}", where=where,
                                     hint=f"free space in {p.name}'s docker data root (docker system df; sparkctl "
                                          "image prune), then run again; the running deployment is untouched",
                                     evidence=body[-1500:])
        elif int(rc) == 255:
            out[p.name] = StreamFailed(f"{source.name} could not SSH to {p.name} over the fabric ({p.fabric_address})",
                                     where=where, hint="sparkctl prepare --tags fabric-ssh (the fabric key and host "
                                                       "keys), and check the fabric link", evidence=body[-1500:])
        elif int(save_rc) != 0:
            out[p.name] = StreamFailed(f"docker save of {what} failed on {source.name}",
                                     where=f"[{source.name}] image copy", hint="see the evidence",
                                     evidence=save.partition("\n")[2].strip()[-1500:] or r.output[-1500:])
        else:
            out[p.name] = StreamFailed(f"docker load of {what} failed on {p.name}", where=where,
                                     hint="see the evidence", evidence=body[-1500:])
    return out
