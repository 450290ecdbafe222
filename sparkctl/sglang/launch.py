"""LaunchSpec: the plain data that starts one SGLang rank.

`render` produces one LaunchSpec per rank from a Profile and an Inventory. It is
plain data: tests compare it, `sparkctl render` prints it, runtimes (local process,
docker on a node) execute it. Secret values (API key, HF token) live in the spec
so the engine can be started, but every printable or storable view is redacted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REDACTED = "***"


def redact(text: str, secrets: "frozenset[str] | set[str] | list[str] | tuple[str, ...]") -> str:
    """`text` with every (non-empty) secret value replaced by '***': the one redaction rule of sparkctl.
    Longest first, so a secret that contains another is hidden whole."""
    for value in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one rank. Example::

        LaunchSpec(rank=0, node="spark-a",
                   argv=["python3", "-m", "sglang.launch_server", "--tp-size", "2", ...],
                   env={"SGLANG_HOST_IP": "192.168.100.10", ...})
    """

    rank: int
    node: str
    argv: list[str]
    env: dict[str, str]
    sglang_version: str
    api_host: str = "127.0.0.1"   # where a client reaches rank 0's HTTP API
    api_port: int = 30000
    image: str | None = None      # engine image reference (docker runtime)
    mounts: list[dict[str, Any]] = field(default_factory=list)  # {"source","target","read_only"}
    secret_values: frozenset[str] = frozenset()  # values to redact wherever printed

    def listen_ports(self) -> list[tuple[str, int, str]]:
        """(bind address, port, what) this rank listens on, read from its own argv (SGLang's defaults when a flag
        is absent: --host 127.0.0.1, --port 30000)."""
        argv = self.argv
        host = argv[argv.index("--host") + 1] if "--host" in argv else "127.0.0.1"
        port = int(argv[argv.index("--port") + 1]) if "--port" in argv else 30000
        out = [(host, port, "HTTP API" if self.rank == 0 else "dummy health server")]
        if self.rank == 0 and "--dist-init-addr" in argv:
            addr, _, dport = argv[argv.index("--dist-init-addr") + 1].rpartition(":")
            out.append((addr, int(dport), "TCP store (--dist-init-addr)"))
        return out

    def redact_text(self, text: str) -> str:
        return redact(text, self.secret_values)

    def redacted(self) -> dict[str, Any]:
        """JSON-safe view with every secret replaced by '***' (for printing and the ledger)."""
        return {
            "rank": self.rank,
            "node": self.node,
            "argv": [self.redact_text(a) for a in self.argv],
            "env": {k: self.redact_text(v) for k, v in sorted(self.env.items())},
            "sglang_version": self.sglang_version,
            "api_host": self.api_host,
            "api_port": self.api_port,
            "image": self.image,
            "mounts": list(self.mounts),
        }
