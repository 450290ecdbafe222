#!/usr/bin/python3
"""Stand-ins for hardware tools on a test-cluster node (installed by testrig/rootfs.py as
/opt/sparkctl-standins/bin/{nvidia-smi,ibdev2netdev,netplan,systemctl}; dispatches on its own name).

They print captured real output (``../captures/``, sources in each file's header) or, for netplan, run the
real ``/usr/sbin/netplan generate`` to validate before applying addresses and MTU with ``ip``. Every output
line a stand-in makes up itself starts with ``stand-in:`` on stderr, so nobody mistakes it for the real tool.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
NODE = json.loads((HERE / "node.json").read_text())


def capture(key: str) -> list[str]:
    """The capture's body: header comments and the ``[...]`` cut markers dropped."""
    text = (HERE / "captures" / NODE["captures"][key]).read_text()
    return [ln for ln in text.splitlines() if not ln.startswith("# ") and ln.strip() != "[...]"]


def nvidia_smi(args: list[str]) -> int:
    if not args:
        print("\n".join(capture("nvidia-smi")))
        return 0
    if args == ["--query-gpu=name", "--format=csv,noheader"]:
        lines = capture("nvidia-smi-query-name")
        print(lines[-1])     # the capture ends with the query's answer
        return 0
    print(f"stand-in: no captured output for nvidia-smi {' '.join(args)}", file=sys.stderr)
    return 2


def ibdev2netdev(args: list[str]) -> int:
    lines = capture("ibdev2netdev")
    first = []
    for ln in lines[1:]:            # first host's listing, up to the next shell prompt
        if "$ " in ln:
            break
        first.append(ln)
    print("\n".join(first))
    return 0


def netplan(args: list[str]) -> int:
    if args[:1] != ["apply"]:
        os.execv("/usr/sbin/netplan", ["netplan", *args])
    gen = subprocess.run(["/usr/sbin/netplan", "generate"], capture_output=True, text=True)
    if gen.returncode:
        sys.stderr.write(gen.stderr or gen.stdout)
        return gen.returncode
    import yaml
    merged: dict = {}
    for path in sorted(Path("/etc/netplan").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text()) or {}
        for name, conf in ((doc.get("network") or {}).get("ethernets") or {}).items():
            merged.setdefault(name, {}).update(conf or {})
    for name, conf in merged.items():
        if "mtu" in conf:
            subprocess.run(["ip", "link", "set", name, "mtu", str(conf["mtu"])], check=True)
        if conf.get("addresses"):
            subprocess.run(["ip", "addr", "flush", "dev", name, "scope", "global"], check=True)
            for addr in conf["addresses"]:
                subprocess.run(["ip", "addr", "add", str(addr), "dev", name], check=True)
        subprocess.run(["ip", "link", "set", name, "up"], check=True)
    print(f"stand-in: netplan apply set {', '.join(merged) or 'nothing'} with ip (no systemd-networkd here)",
          file=sys.stderr)
    return 0


def systemctl(args: list[str]) -> int:
    if len(args) == 2 and args[0] in ("restart", "reload") and args[1] in ("docker", "docker.service"):
        marker = f"/run/docker-{NODE['netns']}.sock".encode()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"dockerd") and any(marker in a for a in argv):
                os.kill(int(pid), signal.SIGHUP)
                print(f"stand-in: systemctl {args[0]} docker = SIGHUP to dockerd {pid}", file=sys.stderr)
                return 0
        print("stand-in: this node's dockerd is not running", file=sys.stderr)
        return 1
    print(f"stand-in: systemctl {' '.join(args)} is not emulated", file=sys.stderr)
    return 1


if __name__ == "__main__":
    tool = Path(sys.argv[0]).name
    sys.exit({"nvidia-smi": nvidia_smi, "ibdev2netdev": ibdev2netdev, "netplan": netplan,
              "systemctl": systemctl}[tool](sys.argv[1:]))
