"""Benchmark (not a test): why `SSHConnector.run` execs on fabric's paramiko transport instead of calling fabric's
own `Connection.run` (invoke's runner). Against a throwaway OpenSSH sshd on 127.0.0.1 (root: it runs sshd, with
its own host key, user key and known_hosts under a temporary directory), on ONE fabric connection:

  1. latency of a trivial command (`true`), median of --runs, through `Connection.run` and through
     `SSHConnector.run` (the same connection, our channel exec);
  2. whether multi-byte UTF-8 output comes back intact: a command printing 3,000 x "€" (3 bytes each), so
     characters straddle invoke's 1000-byte read chunks (invoke decodes each chunk on its own, "replace").

Run:  sudo .venv/bin/python benchmarks/bench_ssh_run.py [--runs 50] [--smoke]
--smoke: 3 runs (CI's smoke run: the code path, not the figures).
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sshd(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "host")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "user")], check=True)
    (tmp / "authorized_keys").write_text((tmp / "user.pub").read_text())
    os.chmod(tmp / "authorized_keys", 0o600)
    cfg = tmp / "sshd_config"
    cfg.write_text(f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp / 'host'}\nPidFile {tmp / 'sshd.pid'}\n"
                   f"AuthorizedKeysFile {tmp / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
                   "PasswordAuthentication no\nUsePAM no\nStrictModes no\n")
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(cfg)], stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    host_key = (tmp / "host.pub").read_text().split()
    (tmp / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
    return proc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    args = ap.parse_args()
    runs = 3 if args.smoke else args.runs
    from sparkctl.config.inventory import ClusterSettings, Node
    from sparkctl.nodes.ssh import SSHConnector

    with tempfile.TemporaryDirectory(prefix="bench-ssh-") as d:
        tmp = Path(d)
        os.chmod(tmp, 0o700)
        port = _free_port()
        sshd = _sshd(tmp, port)
        try:
            node = Node.model_validate({
                "name": "loop", "rank": 0, "fabric_interface": "lo", "fabric_address": "127.0.0.1",
                "ssh": {"host": "127.0.0.1", "port": port, "user": "root", "key_file": str(tmp / "user")}})
            cluster = ClusterSettings.model_validate({"name": "bench", "known_hosts": str(tmp / "known_hosts"),
                                              "host_key_policy": "pinned"})
            ssh = SSHConnector(node, cluster)
            conn = ssh.connect()
            ssh.run(["true"])
            conn.run("true", hide=True, in_stream=False)
            ours, theirs = [], []
            for _ in range(runs):
                t = time.perf_counter()
                ssh.run(["true"])
                ours.append(time.perf_counter() - t)
                t = time.perf_counter()
                conn.run("true", hide=True, in_stream=False)
                theirs.append(time.perf_counter() - t)
            print(f"`true`, median of {runs} on one connection: SSHConnector.run "
                  f"{statistics.median(ours) * 1e3:.1f} ms, "
                  f"fabric Connection.run {statistics.median(theirs) * 1e3:.1f} ms")
            cmd = ["python3", "-c", "import sys; sys.stdout.write('\\u20ac' * 3000)"]
            want = "\u20ac" * 3000
            a = ssh.run(cmd).stdout
            b = conn.run(" ".join(["python3", "-c", "\"import sys; sys.stdout.write('\\u20ac' * 3000)\""]),
                         hide=True, in_stream=False).stdout
            print(f"3,000 x U+20AC (9,000 bytes): SSHConnector.run intact={a == want} "
                  f"({a.count(chr(0xfffd))} replacement chars); Connection.run intact={b == want} "
                  f"({b.count(chr(0xfffd))} replacement chars)")
            ssh.close()
        finally:
            sshd.terminate()
            sshd.wait(timeout=10)


if __name__ == "__main__":
    main()
