"""Facts about a node: each one is a command (argv) plus a pure parser of what it prints.

The parsers never touch the network or the filesystem, so they are tested on real
captured output (`tests/unit/test_facts.py` feeds `tests/fixtures/captures/spark/*`).
Running the argv is the connector's job; deciding what a value means is preflight's
(`sparkctl.nodes.docker_runtime.DockerRuntime.preflight`).

Live commands prefer machine-readable forms (``docker info --format '{{json .}}'``,
``ip -j addr``, ``/proc/meminfo``, ``ss -H``); text parsers exist for the forms people
paste (``docker info``, ``ip link show``, ``ip -br addr``, ``free -h`` in any locale).

The facts host preparation (``sparkctl prepare``) establishes are here too, evaluated by
``sparkctl.deploy.host_checks``: ``model_manifest(dir)``, the checksum manifest next to a model directory,
recomputed on the node only when a file is newer than it (the same code as the playbooks' helper,
``sparkctl/prepare/model_manifest.py``); ``fabric_ssh(user, address)``, rank 0 reaching a peer over the fabric
with the dedicated key prepare made. The interface MTU comes from ``ip_addr`` (``Interface.mtu``).

What docker says of its daemon, images and containers is in ``sparkctl.nodes.docker_facts`` (facts the same way).

Example::

    fact = meminfo()
    value = fact.parse(connector.run(fact.argv).stdout)   # Memory(total=..., available=..., ...)
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Generic, TypeVar

T = TypeVar("T")


_SEPARATOR = "[...]"   # cut marker of the capture files; never printed by a tool


@dataclass(frozen=True)
class Fact(Generic[T]):
    """A command to run on a node and the pure function that turns its stdout into a value."""

    name: str
    argv: tuple[str, ...]
    parse: Callable[[str], T]


# ------------------------------------------------------------------------------------------------ memory
@dataclass(frozen=True)
class Memory:
    """Memory of a node in bytes, from ``/proc/meminfo``. ``available`` is the kernel's MemAvailable (its own
    estimate of what it could give without swapping, page cache counted); on GB10 the GPU shares this memory.

    ``free`` (MemFree), ``cached`` (Cached), ``shmem`` (Shmem) and ``swap_cached`` are None when the text did not
    have them (a pasted excerpt)."""

    total: int
    available: int
    swap_total: int | None = None
    swap_free: int | None = None
    free: int | None = None
    cached: int | None = None
    shmem: int | None = None
    swap_cached: int | None = None

    @property
    def evictable_cache(self) -> int | None:
        """Page cache that ``echo 3 > /proc/sys/vm/drop_caches`` could hand back: Cached minus Shmem.

        Shmem (tmpfs, /dev/shm, shared anonymous memory) is counted in Cached but no cache drop frees it. Buffers
        are left out (block-device metadata, small), and so is reclaimable slab: a lower bound on purpose, since
        dirty or mapped pages stay too. None when Cached is unknown (Shmem unknown counts as 0)."""
        if self.cached is None:
            return None
        return max(0, self.cached - (self.shmem or 0))

    @property
    def swap_used(self) -> int | None:
        """Swap holding pages now (SwapTotal - SwapFree); None when unknown."""
        if self.swap_total is None or self.swap_free is None:
            return None
        return max(0, self.swap_total - self.swap_free)


def meminfo() -> Fact[Memory]:
    return Fact("memory", ("cat", "/proc/meminfo"), parse_meminfo)


def parse_meminfo(text: str) -> Memory:
    """Parse ``/proc/meminfo`` (``Key:  123 kB``); other lines around it are ignored."""
    values: dict[str, int] = {}
    for ln in text.splitlines():
        m = re.match(r"^([A-Za-z][\w()]*):\s+(\d+)(?:\s+kB)?\s*$", ln)
        if m:
            values.setdefault(m.group(1), int(m.group(2)) * (1024 if ln.rstrip().endswith("kB") else 1))
    if "MemTotal" not in values or "MemAvailable" not in values:
        raise ValueError("MemTotal/MemAvailable missing from /proc/meminfo")
    return Memory(values["MemTotal"], values["MemAvailable"], values.get("SwapTotal"), values.get("SwapFree"),
                  free=values.get("MemFree"), cached=values.get("Cached"), shmem=values.get("Shmem"),
                  swap_cached=values.get("SwapCached"))


# ------------------------------------------------------------------------------------------------ network
@dataclass(frozen=True)
class Interface:
    """A network interface: operational state, flags, MTU, MAC and addresses (``a.b.c.d/prefix``)."""

    name: str
    state: str
    mtu: int | None = None
    flags: tuple[str, ...] = ()
    mac: str | None = None
    addresses: tuple[str, ...] = ()

    @property
    def up(self) -> bool:
        """Administratively up with carrier (``state UP``; a veth/port whose peer is down is LOWERLAYERDOWN)."""
        return self.state == "UP" or (self.state == "UNKNOWN" and "LOWER_UP" in self.flags)

    @property
    def ipv4(self) -> tuple[str, ...]:
        return tuple(a.split("/")[0] for a in self.addresses if ":" not in a)

    def describe(self) -> str:
        extra = " NO-CARRIER" if "NO-CARRIER" in self.flags else ""
        return (f"{self.name} state {self.state}{extra}" + (f" mtu {self.mtu}" if self.mtu else "")
                + (f" addr {', '.join(self.ipv4)}" if self.ipv4 else " no IPv4 address"))


def ip_addr() -> Fact[dict[str, Interface]]:
    """Every interface with its addresses (``ip -j addr show``; one fact, so a wrong name can list the others)."""
    return Fact("interfaces", ("ip", "-j", "addr", "show"), parse_ip_addr_json)


def ip_addr_dev(iface: str) -> Fact[dict[str, Interface]]:
    return Fact(f"interface {iface}", ("ip", "-j", "addr", "show", "dev", iface), parse_ip_addr_json)


def parse_ip_addr_json(text: str) -> dict[str, Interface]:
    """Parse ``ip -j addr show [dev X]`` (iproute2 JSON)."""
    text = text.strip()
    if not text:
        return {}
    out: dict[str, Interface] = {}
    for d in json.loads(text):
        if "ifname" not in d:
            continue
        addrs = tuple(f"{a['local']}/{a['prefixlen']}" for a in d.get("addr_info") or () if "local" in a)
        out[d["ifname"]] = Interface(name=d["ifname"], state=d.get("operstate", "UNKNOWN"), mtu=d.get("mtu"),
                                     flags=tuple(d.get("flags") or ()), mac=d.get("address"), addresses=addrs)
    return out


@dataclass(frozen=True)
class Ping:
    """One ``ping -c1`` result: did the reply come back, its round-trip time, and why not."""

    transmitted: int
    received: int
    rtt_ms: float | None = None
    error: str | None = None     # "message too long, mtu=1500" (don't-fragment and a smaller MTU on the path)

    @property
    def ok(self) -> bool:
        return self.received > 0


def ping(peer: str, *, size: int = 56, dont_fragment: bool = True) -> Fact[Ping]:
    """Ping ``peer`` once (1 s deadline). ``size`` = MTU - 28 with don't-fragment proves jumbo frames pass."""
    argv = ["ping", "-n", "-c1", "-W1"] + (["-M", "do"] if dont_fragment else []) + ["-s", str(size), peer]
    return Fact(f"ping {peer}", tuple(argv), parse_ping)


def parse_ping(text: str) -> Ping:
    """Parse iputils ``ping`` (stdout and stderr together)."""
    m = re.search(r"(\d+) packets transmitted, (\d+) (?:packets )?received", text)
    tx, rx = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    rtt = re.search(r"= [\d.]+/([\d.]+)/", text)
    err = re.search(r"ping: (?:local error: )?(.+)", text)
    return Ping(tx, rx, float(rtt.group(1)) if rtt else None, err.group(1).strip() if err else None)


@dataclass(frozen=True)
class Listener:
    address: str     # 0.0.0.0, ::, *, or a specific address (zone suffix stripped)
    port: int


WILDCARDS = {"0.0.0.0", "::", "*", ""}


def listening() -> Fact[list[Listener]]:
    return Fact("listening ports", ("ss", "-Hltn"), parse_ss_listen)


def parse_ss_listen(text: str) -> list[Listener]:
    """Parse ``ss -Hltn``: ``LISTEN 0 4096 127.0.0.53%lo:53 0.0.0.0:*`` -> Listener('127.0.0.53', 53)."""
    out = []
    for ln in text.splitlines():
        parts = ln.split()
        if len(parts) < 5 or parts[0] != "LISTEN":
            continue
        addr, _, port = parts[3].rpartition(":")
        if not port.isdigit():
            continue
        addr = addr.strip("[]").split("%")[0]
        out.append(Listener(addr, int(port)))
    return out


def port_conflict(listeners: list[Listener], address: str, port: int) -> Listener | None:
    """The listener that would make binding (address, port) fail, if any (wildcards overlap everything)."""
    for ln in listeners:
        if ln.port != port:
            continue
        if ln.address in WILDCARDS or address in WILDCARDS or ln.address == address:
            return ln
    return None


@dataclass(frozen=True)
class RoceLink:
    hca: str
    port: int
    netdev: str
    up: bool


def ibdev2netdev() -> Fact[list[RoceLink]]:
    return Fact("ibdev2netdev", ("ibdev2netdev",), parse_ibdev2netdev)


def parse_ibdev2netdev(text: str) -> list[RoceLink]:
    """Parse ``ibdev2netdev``: ``rocep1s0f0 port 1 ==> enp1s0f0np0 (Up)``, in the order printed."""
    out = []
    for ln in text.splitlines():
        m = re.match(r"^(\S+) port (\d+) ==> (\S+) \((\w+)\)\s*$", ln)
        if m:
            out.append(RoceLink(m.group(1), int(m.group(2)), m.group(3), m.group(4).lower() == "up"))
    return out


def dir_entries(path: str) -> Fact[list[str]]:
    """Names in a directory (``ls -1A``); exit code 2 when absent. Used for /dev/infiniband."""
    return Fact(f"ls {path}", ("ls", "-1A", path), lambda text: [ln for ln in text.splitlines() if ln])


# ------------------------------------------------------------------------------------------------ GPU
@dataclass(frozen=True)
class Gpu:
    name: str
    driver_version: str | None = None

    @property
    def is_gb10(self) -> bool:
        return "GB10" in self.name


def gpu_query() -> Fact[list[Gpu]]:
    return Fact("gpu", ("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"), parse_gpu_query)


def parse_gpu_query(text: str) -> list[Gpu]:
    """Parse ``nvidia-smi --query-gpu=name[,driver_version] --format=csv,noheader`` (one GPU per line)."""
    out = []
    for ln in text.splitlines():
        ln = ln.strip()
        if not ln or ln == _SEPARATOR:
            continue
        fields = [f.strip() for f in ln.split(",")]
        out.append(Gpu(fields[0], fields[1] if len(fields) > 1 and fields[1] else None))
    return out


@dataclass(frozen=True)
class GpuProcess:
    gpu: int
    pid: int
    type: str           # C compute, G graphics, C+G
    name: str
    memory_mib: int | None


@dataclass(frozen=True)
class NvidiaSmi:
    """The ``nvidia-smi`` table: versions, GPUs (index, name, bus id) and processes."""

    driver_version: str | None
    cuda_version: str | None
    gpus: list[tuple[int, str, str]]
    processes: list[GpuProcess]

    @property
    def compute_processes(self) -> list[GpuProcess]:
        return [p for p in self.processes if "C" in p.type]


def nvidia_smi() -> Fact[NvidiaSmi]:
    return Fact("nvidia-smi", ("nvidia-smi",), parse_nvidia_smi)


def parse_nvidia_smi(text: str) -> NvidiaSmi:
    """Parse the default ``nvidia-smi`` table (driver 580.x layout, as on GB10)."""
    drv = re.search(r"Driver Version:\s*(\S+)", text)
    cuda = re.search(r"CUDA Version:\s*(\S+)", text)
    gpus = [(int(m.group(1)), m.group(2).strip(), m.group(3)) for m in re.finditer(
        r"^\|\s+(\d+)\s+(.+?)\s+(?:On|Off)\s+\|\s+([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)", text, re.M)]
    procs = []
    in_procs = False
    for ln in text.splitlines():
        if "Processes:" in ln:
            in_procs = True
            continue
        if not in_procs:
            continue
        m = re.match(r"^\|\s+(\d+)\s+\S+\s+\S+\s+(\d+)\s+(C\+G|C|G)\s+(.+?)\s+(\d+)MiB\s+\|$", ln.rstrip())
        if m:
            procs.append(GpuProcess(int(m.group(1)), int(m.group(2)), m.group(3), m.group(4), int(m.group(5))))
    return NvidiaSmi(drv.group(1) if drv else None, cuda.group(1) if cuda else None, gpus, procs)


# ------------------------------------------------------------------------------------------------ GPU sensors
@dataclass(frozen=True)
class GpuSensors:
    """One GPU's temperature (C), power draw (W) and SM clock (MHz) as nvidia-smi reports them; a field nvidia-smi
    reports as ``[N/A]`` or ``[Not Supported]`` (GB10 reports its memory that way) is None, never a guess."""

    index: int
    temperature_c: float | None
    power_w: float | None
    sm_clock_mhz: float | None


def gpu_sensors() -> Fact[list[GpuSensors]]:
    return Fact("gpu-sensors", ("nvidia-smi", "--query-gpu=index,temperature.gpu,power.draw,clocks.sm",
                                "--format=csv,noheader,nounits"), parse_gpu_sensors)


def _reading(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None          # "[N/A]", "N/A", "[Not Supported]", "[Unknown Error]"


def parse_gpu_sensors(text: str) -> list[GpuSensors]:
    """Parse ``nvidia-smi --query-gpu=index,temperature.gpu,power.draw,clocks.sm --format=csv,noheader,nounits``."""
    out = []
    for ln in text.splitlines():
        fields = [f.strip() for f in ln.split(",")]
        if len(fields) != 4 or not fields[0].isdigit():
            continue
        out.append(GpuSensors(int(fields[0]), _reading(fields[1]), _reading(fields[2]), _reading(fields[3])))
    return out


# ----------------------------------------------------------------------------------- host preparation
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
