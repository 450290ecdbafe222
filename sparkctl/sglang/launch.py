"""LaunchSpec: the plain data that starts one SGLang rank.

`render` produces one LaunchSpec per rank from a Profile and an Inventory. It is
plain data: tests compare it, `sparkctl render` prints it, runtimes (local process,
docker on a node) execute it. Secret values (API key, HF token) never enter argv
or env: they travel as `secret_files` (an SGLang `--config` YAML and an HF token file) that the runtime writes
to a private directory and the engine reads at start-up; every printable or storable view is redacted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from sparkctl.redaction import REDACTED, SECRET_ENV, SECRET_OPTIONS, redact, redact_argv

# Where an engine finds its secret files (the runtime puts the directory there: a read-only bind mount in a
# container, the same path rewritten to a private local directory by the process runtime).
SECRETS_MOUNT = "/run/sparkctl-secrets"
ENGINE_SECRETS_FILE = "engine-secrets.yaml"   # SGLang `--config` YAML holding `api-key: KEY`
HF_TOKEN_FILE = "hf-token"                    # read by huggingface_hub through HF_TOKEN_PATH


class Mount(BaseModel):
    """One bind mount of a rank's container, e.g. ``Mount(source="/srv/models", target="/models", read_only=True)``.

    Its JSON, ``{"source", "target", "read_only"}`` in that order, is what records and the launch identity
    (`sparkctl.nodes.container.spec_identity`) have always held, so a deployment made before it was a model is
    not seen as changed.
    """

    # extra="allow": keys written by a newer sparkctl survive a load/save round trip of the record.
    model_config = ConfigDict(frozen=True, extra="allow")

    source: str = Field(description="Absolute path on the node.")
    target: str = Field(description="Absolute path in the container.")
    read_only: bool = Field(description="Bound read-only (the models, the secrets) or writable (the caches).")


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
    sglang_version: str           # the engine's version (the name is from when SGLang was the only engine)
    api_host: str = "127.0.0.1"   # where a client reaches rank 0's HTTP API
    api_port: int = 30000
    image: str | None = None      # engine image reference (docker runtime)
    mounts: list[Mount] = field(default_factory=list)
    secret_values: frozenset[str] = field(default=frozenset(), repr=False)  # values to redact wherever printed
    # File name -> content of the files the runtime writes (0400, in a private 0700 directory) at SECRETS_MOUNT
    # before the engine starts: the API key and HF token reach the engine there, never in its argv or env.
    secret_files: dict[str, str] = field(default_factory=dict, repr=False)
    # Spellings of the flags whose value is a credential in this spec's SGLang version (redacted by position).
    secret_options: frozenset[str] = field(default=SECRET_OPTIONS, repr=False)
    engine: str = "sglang"        # the profile's engine: "sglang" | "vllm"

    def listen_ports(self) -> list[tuple[str, int, str]]:
        """(bind address, port, what) this rank listens on, read from its own argv (the engine's defaults when a
        flag is absent: SGLang --host 127.0.0.1 --port 30000; vLLM --port 8000 on every interface). vLLM's
        headless rank serves no HTTP at all; its rank 0 holds torch's TCP store on --master-port (bound on every
        interface: tests/fixtures/captures/vllm-0.32.0-cpu/tp2-listening-sockets.txt)."""
        argv = self.argv

        def value(flag: str) -> str | None:
            return argv[argv.index(flag) + 1] if flag in argv else None

        if "--headless" in argv:
            return []
        vllm = self.engine == "vllm"
        host = value("--host") or ("0.0.0.0" if vllm else "127.0.0.1")
        port = int(value("--port") or (8000 if vllm else 30000))
        out = [(host, port, "HTTP API" if self.rank == 0 else "dummy health server")]
        if self.rank == 0 and (dist := value("--dist-init-addr")) is not None:
            addr, _, dport = dist.rpartition(":")
            out.append((addr, int(dport), "TCP store (--dist-init-addr)"))
        if self.rank == 0 and (master := value("--master-port")) is not None:
            out.append((value("--master-addr") or "127.0.0.1", int(master), "TCP store (--master-port)"))
        return out

    def redact_text(self, text: str) -> str:
        return redact(text, self.secret_values)

    def redacted(self) -> RankSpec:
        """This spec with every secret replaced by '***' (for printing and the ledger): by field (the secret
        flags' values and secret variables), never by what a value looks like."""
        return RankSpec(rank=self.rank, node=self.node, argv=redact_argv(self.argv, self.secret_options),
                        env={k: REDACTED if k in SECRET_ENV else v for k, v in sorted(self.env.items())},
                        sglang_version=self.sglang_version, api_host=self.api_host, api_port=self.api_port,
                        image=self.image, mounts=list(self.mounts))


class RankSpec(BaseModel):
    """One rank's launch as stored and printed: a `LaunchSpec` without its secrets, made only by
    `LaunchSpec.redacted()`. The deployment record keeps one per rank (`DeploymentRecord.specs`), `render --json`
    prints its rank, node, argv and env, and a launch's identity hashes its JSON form."""

    # extra="allow": keys written by a newer sparkctl survive a load/save round trip of the record.
    model_config = ConfigDict(extra="allow", validate_assignment=True)

    rank: int
    node: str
    argv: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    sglang_version: str | None = None
    api_host: str | None = None
    api_port: int | None = None
    image: str | None = None
    mounts: list[Mount] = Field(default_factory=list)
