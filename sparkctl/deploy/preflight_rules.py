"""Preflight rules: judge one node's gathered facts (`NodeFacts`) against the inventory and the rank's launch.

Pure functions, no I/O: `evaluate(...)` returns every check with its severity (ok, warning, failure), what
was seen and what to do. Tested on captured output of real Sparks (tests/fixtures/captures/spark/).
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from sparkctl.deploy.preflight import ports_of
from sparkctl.nodes import docker_facts, facts
from sparkctl.nodes.node_facts import NodeFacts, host_model_path, model_paths
from sparkctl.nodes.ssh import CommandResult
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.sglang.render import MODELS_MOUNT
from sparkctl.state.records import CheckResult

if TYPE_CHECKING:
    from sparkctl.config.inventory import Inventory, Node

MIN_FABRIC_MTU = 9000


def evaluate(inventory: Inventory, spec: LaunchSpec, nf: NodeFacts,
             own_ports: set[tuple[str, int]]) -> list[CheckResult]:
    """Every check for rank `spec` on its node; `own_ports` are held by the active deployment (not a conflict)."""
    if nf.runtime == "process":
        return _process_checks(spec, nf, own_ports)
    node = inventory.node(spec.node)
    name = node.name
    if nf.unreachable is not None:
        return [CheckResult.failing(name, "ssh", nf.unreachable.message, nf.unreachable.hint or "")]
    peers = [p for p in inventory.nodes if p.name != name]
    out = nf.outputs
    checks = [CheckResult.passing(name, "ssh", f"{nf.reached} reachable")]
    checks += docker_checks(node, out["docker"])
    checks += gpu_checks(node, out["gpu"], out["docker"])
    smi = nf.parsed("smi", facts.parse_nvidia_smi)
    if smi is not None:   # no nvidia-smi: the gpu check above already said so
        checks.append(gpu_idle_check(name, smi, ours_running=bool(own_ports)))
    iface = fabric_checks(node, checks, out["ip"])
    checks += peer_checks(name, peers, iface, out)
    checks += port_checks(node, spec, nf.parsed("ss", facts.parse_ss_listen), out["ss"], own_ports)
    checks.append(memory_check(name, nf.parsed("mem", facts.parse_meminfo), mem_fraction_of(spec.argv),
                               ours_running=bool(own_ports)))
    ib = out["ib"].returncode == 0
    if node.roce_hcas and not ib:
        checks.append(CheckResult.failing(name, "infiniband", "roce_hcas is set but /dev/infiniband is missing",
                                 "install the MLNX/rdma-core drivers, or clear roce_hcas to use TCP sockets"))
    else:
        checks.append(CheckResult.passing(name, "infiniband", "/dev/infiniband present (passed to the container)" if ib
                               else "no /dev/infiniband (NCCL over TCP sockets)"))
    if node.roce_hcas:
        checks.append(hca_check(node, out["ibdev"]))
    for what, path in model_paths(spec.argv):
        checks.append(model_check(node, what, path, out[what]))
    return checks


# How the real-engine environment and tiny models of a local cluster are made (in a sparkctl checkout; the test
# rig is not in the wheel): testrig/realengine.
REAL_ENGINE_BUILD = "./.venv/bin/python -m testrig.realengine build (in a sparkctl checkout)"


def _process_checks(spec: LaunchSpec, nf: NodeFacts, own_ports: set[tuple[str, int]]) -> list[CheckResult]:
    """The embedded cluster: the engine can run (the emulator imports; the real engine's environment has SGLang,
    and its model and drafter are here), and the rank's ports are free (or held by our deployment)."""
    node = spec.node
    if nf.engine in ("sglang", "vllm"):
        build = REAL_ENGINE_BUILD.replace(" build", " build --engine vllm") if nf.engine == "vllm" else \
            REAL_ENGINE_BUILD
        checks = [CheckResult.passing(node, "engine", f"{nf.engine} found in the engine's environment (process "
                                                      f"runtime, real engine)") if nf.engine_error is None
                  else CheckResult.failing(node, "engine", f"real engine cannot run: {nf.engine_error}",
                                     f"build the environment: {build}, or fix sparkctl_engine_python")]
        for what, (path, present) in nf.local_paths.items():
            checks.append(CheckResult.passing(node, what, f"{path} present") if present else
                          CheckResult.failing(node, what, f"{what} {path} is missing (no config.json there)",
                                        f"build it: {build}, or fix host_paths.models / the profile's path"))
    else:
        checks = [CheckResult.passing(node, "engine", "sparkctl emulator importable (process runtime)")
                  if nf.engine_error is None else
                  CheckResult.failing(node, "engine", f"emulator not importable: {nf.engine_error}",
                                      "reinstall sparkctl")]
    for addr, port, what in ports_of(spec):
        if (addr, port) in own_ports:
            checks.append(CheckResult.passing(node, f"port {port}", f"{addr}:{port} held by the active deployment"))
        elif nf.ports_free.get((addr, port)):
            checks.append(CheckResult.passing(node, f"port {port}", f"{addr}:{port} free"))
        else:
            checks.append(_port_taken(node, addr, port, what, nf))
    if "mem" in nf.outputs:      # this machine's /proc/meminfo (the emulator takes none of it: warnings only)
        checks.append(memory_check(node, nf.parsed("mem", facts.parse_meminfo), mem_fraction_of(spec.argv),
                                   ours_running=bool(own_ports), embedded=True))
    return checks


def _port_taken(node: str, addr: str, port: int, what: str, nf: NodeFacts) -> CheckResult:
    """A port of the rank that something holds: named when this user can see it, and said to be sparkctl's own when
    it is a leftover of one of its engines (then `down` is the fix, not another port)."""
    holder = nf.port_holders.get((addr, port))
    whose = nf.leftover_pids.get(holder[0]) if holder else None
    if holder and whose:
        return CheckResult.failing(node, f"port {port}", f"{addr}:{port} ({what}) is held by pid {holder[0]} "
                                   f"({holder[1]}), a leftover of sparkctl's {whose} that outlived its engine",
                                   "`sparkctl down` stops it (and `sparkctl up` settles it before it deploys)")
    by = f" (pid {holder[0]}: {holder[1]})" if holder else ""
    return CheckResult.failing(node, f"port {port}", f"{addr}:{port} ({what}) is already in use by another "
                               f"program{by}", f"stop what listens there (ss -ltnp 'sport = :{port}') or change "
                               f"api.port / api.dist_port in the profile")


def docker_checks(node: Node, res: CommandResult) -> list[CheckResult]:
    """The daemon answers (`docker info` JSON) and the node's gpu_runtime is registered."""
    name = node.name
    info = None
    with contextlib.suppress(ValueError):
        info = docker_facts.parse_docker_info_json(res.stdout)
    if info is None or not info.answering:
        why = (res.stderr.strip() or res.stdout.strip() or f"exit {res.returncode}").splitlines()[-1]
        return [CheckResult.failing(name, "docker", f"docker daemon does not answer: {why}",
                           "start it (sudo systemctl start docker) and make sure the SSH user may use it "
                           "(member of the docker group)")]
    out = [CheckResult.passing(name, "docker", f"docker {info.server_version} on {info.name or '?'} "
                                    f"({info.architecture or '?'}; runtimes {', '.join(info.runtimes)}; "
                                    f"default {info.default_runtime})")]
    want = node.gpu_runtime
    if want == "nvidia":
        if "nvidia" in info.runtimes:
            alias = info.runtime_is_runc_alias("nvidia")
            out.append(CheckResult.passing(name, "gpu runtime", "nvidia runtime registered"
                                + (" (mapped to plain runc: test node, no GPU)" if alias else "")))
        else:
            out.append(CheckResult.failing(name, "gpu runtime", f"the nvidia runtime is not registered with docker "
                                  f"(runtimes: {', '.join(info.runtimes)})",
                                  "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart "
                                  "docker (or set gpu_runtime: gpus-all for this node)"))
    elif want == "gpus-all":
        out.append(CheckResult.passing(name, "gpu runtime", "--gpus all (needs nvidia-container-toolkit; not checked)"))
    else:
        out.append(CheckResult.passing(name, "gpu runtime", "gpu_runtime none: the container gets no GPU"))
    return out


def gpu_checks(node: Node, res: CommandResult, docker_res: CommandResult) -> list[CheckResult]:
    """GPU model/driver. No nvidia-smi is a failure on a real node, a warning on a test node (whose nvidia
    runtime is plain runc) or when gpu_runtime is none."""
    name = node.name
    if res.returncode != 0:
        try:
            test_node = docker_facts.parse_docker_info_json(docker_res.stdout).runtime_is_runc_alias("nvidia")
        except (ValueError, AttributeError):
            test_node = False
        missing = res.returncode == 127 or "not found" in res.stderr
        seen = ("no nvidia-smi (not a GB10?)" if missing else
                f"nvidia-smi failed: {res.output.strip().splitlines()[-1] if res.output.strip() else res.returncode}")
        if node.gpu_runtime == "none" or test_node:
            return [CheckResult.warning(name, "gpu", seen)]
        return [CheckResult.failing(name, "gpu", seen,
                                    "install the NVIDIA driver (DGX OS ships it) and check `nvidia-smi` "
                                              "works on the node")]
    gpus = facts.parse_gpu_query(res.stdout)
    if not gpus:
        return [CheckResult.failing(name, "gpu", "nvidia-smi lists no GPU",
                                    "check the driver (nvidia-smi) on the node")]
    g = gpus[0]
    notes = []
    if not g.is_gb10:
        notes.append("not a GB10")
    if g.driver_version and g.driver_version.startswith("590."):
        # sglang issue reports: driver 590 deadlocks in CUDA-graph capture on GB10
        notes.append("driver 590 deadlocks in CUDA-graph capture on GB10 in one report; 580.x is known good")
    seen = f"{g.name}, driver {g.driver_version or '?'}" + (f" ({'; '.join(notes)})" if notes else "")
    return [CheckResult.warning(name, "gpu", seen) if notes else CheckResult.passing(name, "gpu", seen)]


def gpu_idle_check(node: str, smi: facts.NvidiaSmi, *, ours_running: bool) -> CheckResult:
    """The GPU must be idle before boot (unified memory: another compute process shrinks what the engine gets).

    Graphics processes (Xorg, gnome-shell on a desktop Spark) only warn. When sparkctl's own deployment runs,
    its engine is expected on the GPU (it is stopped before the new boot), so compute processes only warn.
    """
    compute = smi.compute_processes
    shown = ", ".join(f"pid {p.pid} {p.name} ({p.memory_mib} MiB)" for p in compute)
    graphics = [p for p in smi.processes if p not in compute]
    if not compute:
        if graphics:
            return CheckResult.warning(node, "gpu idle", f"no compute process on the GPU ({len(graphics)} graphics "
                                                f"processes: {', '.join(p.name for p in graphics)})")
        return CheckResult.passing(node, "gpu idle", "no compute process on the GPU")
    if ours_running:
        return CheckResult.warning(node, "gpu idle",
                                   f"in use by {shown} (the active deployment's engine is expected here; "
                                            f"it is stopped before the new boot)")
    return CheckResult.failing(node, "gpu idle", f"GPU busy: {shown}",
                      f"stop those processes on {node} first: on unified memory they take what the engine needs")


def fabric_checks(node: Node, checks: list[CheckResult], res: CommandResult) -> facts.Interface | None:
    """The fabric interface exists, is up, carries fabric_address; its MTU. Returns it when up."""
    n = node
    if res.returncode != 0:
        checks.append(CheckResult.failing(n.name, "fabric interface", f"ip failed: {res.output.strip()}",
                                 "install iproute2 on the node"))
        return None
    ifaces = facts.parse_ip_addr_json(res.stdout)
    iface = ifaces.get(n.fabric_interface)
    if iface is None:
        others = ", ".join(f"{i.name} ({', '.join(i.ipv4) or 'no IPv4'})" for i in ifaces.values() if i.name != "lo")
        checks.append(CheckResult.failing(n.name, "fabric interface",
                                 f"interface {n.fabric_interface} does not exist on {n.name} (interfaces: {others})",
                                 f"set fabric_interface for {n.name} in the inventory to the cabled CX-7 netdev "
                                 f"(see `ibdev2netdev` on the node)"))
        return None
    ok = True
    if not iface.up:
        ok = False
        checks.append(CheckResult.failing(n.name, "fabric interface", f"{n.fabric_interface} on {n.name} is not up: "
                                 f"{iface.describe()}",
                                 f"check the QSFP cable and `ip link set {n.fabric_interface} up` on {n.name}"
                                 + (" (NO-CARRIER: the link or the peer's port is down)"
                                    if iface.state == "LOWERLAYERDOWN" or "NO-CARRIER" in iface.flags else "")))
    if n.fabric_address not in iface.ipv4:
        ok = False
        checks.append(CheckResult.failing(n.name, "fabric address",
                                 f"{n.fabric_interface} on {n.name} has {', '.join(iface.ipv4) or 'no IPv4 address'}, "
                                 f"not the inventory's fabric_address {n.fabric_address}",
                                 f"configure {n.fabric_address} on {n.fabric_interface} (netplan), or fix "
                                 f"fabric_address in the inventory"))
    if ok:
        checks.append(CheckResult.passing(n.name, "fabric interface", iface.describe()))
    if iface.mtu is not None:
        if iface.mtu < MIN_FABRIC_MTU:
            checks.append(CheckResult.warning(n.name, "fabric mtu", f"mtu {iface.mtu} (the community default is "
                                                            f"{MIN_FABRIC_MTU} on both ends)"))
        else:
            checks.append(CheckResult.passing(n.name, "fabric mtu", f"mtu {iface.mtu}"))
    return iface if iface.up else None


def peer_checks(name: str, peers: list[Node], iface: facts.Interface | None,
                out: dict[str, CommandResult]) -> list[CheckResult]:
    """Each peer's fabric address answers a ping, and full-MTU packets pass unfragmented when they were tried."""
    checks: list[CheckResult] = []
    for p in peers:
        r = facts.parse_ping(out[f"ping:{p.name}"].output)
        if not r.ok:
            checks.append(CheckResult.failing(name, f"fabric peer {p.name}",
                                     f"{p.name}'s fabric address {p.fabric_address} does not answer from {name}"
                                     + (f" ({r.error})" if r.error else ""),
                                     f"check the cable and both ends' fabric_interface/fabric_address; "
                                     f"`ping {p.fabric_address}` on {name}"))
            continue
        big = out.get(f"bigping:{p.name}")
        if big is None or iface is None:
            checks.append(CheckResult.passing(name, f"fabric peer {p.name}",
                                              f"{p.fabric_address} answers ({r.rtt_ms} ms)"))
            continue
        b = facts.parse_ping(big.output)
        if b.ok:
            checks.append(CheckResult.passing(name, f"fabric peer {p.name}",
                                              f"{p.fabric_address} answers ({r.rtt_ms} ms; "
                                   f"{iface.mtu}-byte packets pass unfragmented)"))
        else:
            checks.append(CheckResult.failing(name, f"fabric peer {p.name}",
                                     f"{p.fabric_address} answers small pings but not {iface.mtu}-byte packets with "
                                     f"don't-fragment" + (f" ({b.error})" if b.error else ""),
                                     "set the same MTU on both ends of the fabric (and any switch between)"))
    return checks


def port_checks(node: Node, spec: LaunchSpec, listeners: list[facts.Listener] | None, ss: CommandResult,
                own_ports: set[tuple[str, int]]) -> list[CheckResult]:
    checks = []
    for addr, port, what in ports_of(spec):
        if (addr, port) in own_ports:
            checks.append(CheckResult.passing(node.name, f"port {port}",
                                              f"{addr}:{port} held by the active deployment"))
        elif listeners is None:
            checks.append(CheckResult.failing(node.name, f"port {port}", f"ss failed: {ss.output.strip()}",
                                     "install iproute2 on the node"))
        elif (hit := facts.port_conflict(listeners, addr, port)) is not None:
            checks.append(CheckResult.failing(node.name, f"port {port}",
                                     f"{addr}:{port} ({what}) is in use (listener on {hit.address}:{hit.port})",
                                     f"stop what listens there (ssh {node.ssh.host} ss -ltnp 'sport = :{port}') or "
                                     "change api.port / api.dist_port in the profile"))
        else:
            checks.append(CheckResult.passing(node.name, f"port {port}", f"{addr}:{port} free"))
    return checks


GIB = 2**30
SWAP_NOTE_BYTES = GIB        # swap in use from here on is worth a warning: the host is already under pressure
MIN_USEFUL_FRACTION = 0.3   # below it, "lower the fraction" is no advice: free the memory instead
DROP_CACHES = "sync; echo 3 | sudo tee /proc/sys/vm/drop_caches"


def mem_fraction_of(argv: list[str]) -> float | None:
    """The --mem-fraction-static the rank is launched with (`--flag X` or `--flag=X`); None when SGLang picks it."""
    for i, arg in enumerate(argv):
        opt, eq, value = arg.partition("=")
        if opt == "--mem-fraction-static":
            raw = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            try:
                return float(raw)
            except ValueError:
                return None
    return None


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def memory_check(name: str, mem: facts.Memory | None, mem_fraction: float | None = None, *,
                 ours_running: bool = False, embedded: bool = False) -> CheckResult:
    """What the boot will find in the node's memory (GB10: one unified pool for the host and the GPU).

    SGLang takes ``mem_fraction_static`` x total for weights and KV cache and leaves the rest to everything else, so
    whatever already holds memory when it starts comes out of its KV pool (or the host's share, then the OOM-killer
    ends the boot). Judged from /proc/meminfo:

    * MemFree >= fraction x MemTotal: enough without evicting anything (ok);
    * MemFree + droppable page cache (Cached - Shmem, see `facts.Memory.evictable_cache`) >= it: enough only once
      the page cache is evicted, which GB10 owners report the CUDA allocator does not reliably get (operations.md:
      boots fail on page cache): a warning whose text says how to drop it;
    * less: not enough even then, a failure naming what to stop or the fraction that fits.

    Swap in use (>= 1 GiB) adds a warning: the host is under memory pressure before the boot. Without a fraction in
    the argv (SGLang sizes it itself) the old rule stays: a warning under a quarter free. `ours_running`: the
    active deployment's engine holds the memory now and is stopped before the boot, so nothing fails. `embedded`:
    the process runtime's emulator allocates nothing, so a shortfall only warns.
    """
    if mem is None:
        return CheckResult.failing(name, "memory", "cannot read /proc/meminfo", "check the node")
    seen = f"{_gib(mem.available)} available of {_gib(mem.total)}"
    notes: list[str] = []
    swap = mem.swap_used
    if swap is not None and swap >= SWAP_NOTE_BYTES:
        notes.append(f"{_gib(swap)} of swap in use: the host is under memory pressure before the boot")
    if mem_fraction is None:
        if mem.available < mem.total * 0.25:
            notes.insert(0, "less than a quarter free: page cache and other programs share the GPU's memory")
        return CheckResult.warning(name, "memory", seen + f" ({'; '.join(notes)})") if notes else \
            CheckResult.passing(name, "memory", seen)
    need = mem_fraction * mem.total
    free = mem.free if mem.free is not None else mem.available
    droppable = mem.evictable_cache or 0
    reachable = free + droppable if mem.free is not None else mem.available
    seen = (f"mem_fraction_static {mem_fraction:g} x {_gib(mem.total)} = {_gib(int(need))} for the engine; "
            f"{_gib(free)} free" + (f", {_gib(droppable)} more in droppable page cache" if droppable else "")
            + f" (MemAvailable {_gib(mem.available)})")
    if ours_running and free < need:
        notes.insert(0, "the active deployment's engine holds memory now; it is stopped before the new boot")
        return CheckResult.warning(name, "memory", seen + f" ({'; '.join(notes)})")
    if reachable < need:
        fits = max(0.0, int((reachable / mem.total - 0.02) * 100) / 100)
        fix = (f"free memory on {name}: stop what holds it (a leftover engine or container: `free -h`, `docker ps`, "
               f"`ps aux --sort=-rss | head`) and drop the page cache ({DROP_CACHES})"
               + (f", or lower server.mem_fraction_static to {fits:.2f} or less" if fits >= MIN_USEFUL_FRACTION else
                  "; no smaller fraction would hold a model here"))
        short = f"{_gib(int(need - reachable))} short even with the page cache dropped"
        if embedded:
            return CheckResult.warning(name, "memory", seen + f" ({short}; embedded cluster: the emulator does not "
                                                               f"take it, a real engine would)", fix)
        return CheckResult.failing(name, "memory", seen + f": {short}" + (f"; {notes[0]}" if notes else ""), fix)
    if free < need:
        fix = (f"drop the page cache on {name} before the boot: {DROP_CACHES} (`sparkctl watch` does it before its "
               f"restarts where `prepare_drop_caches: true` and `sparkctl prepare --tags drop-caches` granted it)")
        notes.insert(0, f"enough only once {_gib(int(need - free))} of page cache is evicted, which the GPU's "
                        f"allocator on GB10 does not reliably get; to drop it: {DROP_CACHES}")
        return CheckResult.warning(name, "memory", seen + f" ({'; '.join(notes)})", fix)
    if notes:
        return CheckResult.warning(name, "memory", seen + f" ({'; '.join(notes)})",
                     f"find what was swapped out on {name} (`free -h`, `smem` or `ps aux --sort=-rss`) and stop it, or "
                     f"`sudo swapoff -a && sudo swapon -a` once memory is free")
    return CheckResult.passing(name, "memory", seen)


def hca_check(node: Node, res: CommandResult) -> CheckResult:
    n = node
    if res.returncode != 0:
        return CheckResult.warning(n.name, "roce hcas", "ibdev2netdev not available; roce_hcas not verified")
    links = {ln.hca: ln for ln in facts.parse_ibdev2netdev(res.stdout)}
    bad = [h for h in n.roce_hcas if h not in links or not links[h].up]
    if bad:
        return CheckResult.failing(n.name, "roce hcas",
                          "; ".join(f"{h}: " + (f"{links[h].netdev} down" if h in links else "not present")
                                    for h in bad),
                          "set roce_hcas to the HCAs of the cabled port (ibdev2netdev shows which are Up)")
    return CheckResult.passing(n.name, "roce hcas", ", ".join(f"{h} -> {links[h].netdev} (Up)" for h in n.roce_hcas))


def model_check(node: Node, what: str, path: str, res: CommandResult) -> CheckResult:
    n = node
    host = host_model_path(path, n.host_paths.models)
    if host is None:
        return CheckResult.warning(n.name, what, f"{path} is not under {MODELS_MOUNT}, so no host directory is mounted "
                                        f"there; the engine will not see it")
    if res.returncode == 0:
        return CheckResult.passing(n.name, what, f"{path} present ({host} on {n.name})")
    return CheckResult.failing(n.name, what, f"{path} not found: {host} does not exist on {n.name}",
                      f"sync it to {host} on this node (every node mounts host_paths.models at {MODELS_MOUNT})")
