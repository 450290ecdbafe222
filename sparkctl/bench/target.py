"""What is measured: an *arm* = one serving configuration reachable over HTTP, with its log and config.

An arm comes from the ledger's deployment record (endpoint, launch specs, capacity, profile, rank 0's
log through its runtime) or from a bare endpoint (configuration from ``/server_info``). Either way the
arm carries the full configuration every number is recorded with (``config``), and whether it is the
emulator (``emulated``: ``/server_info`` says ``"emulated": true`` (vLLM: ``/version``) or the record says so).
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from sparkctl.bench.logsource import LogSource, concurrency_cap_from_log
from sparkctl.engines.card import ArmFacts, arm_facts, not_reported
from sparkctl.errors import SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.sglang.client import (
    EndpointBoundError,
    EndpointProtocolError,
    Limits,
    RunGuard,
    SGLangAPIError,
    SGLangClient,
    parse_server_info,
)
from sparkctl.sglang.dialect import available_versions, load_dialect
from sparkctl.state.records import DeploymentRecord
from sparkctl.state.runs import ConcurrencyLevel


class LevelObserver(Protocol):
    """Called around each concurrency level: ``before(c) -> token``, then ``after(c, entry, token)`` with the
    level's entry of the card. It never raises. The router's per-replica split of a replicated deployment is one
    (sparkctl.bench.router_arm.LevelSplit); the token is the observer's own."""

    def before(self, c: int) -> Any: ...

    def after(self, c: int, entry: ConcurrencyLevel, token: Any) -> None: ...

log = logging.getLogger("sparkctl.bench")

__all__ = ["Arm", "describe_server", "redact_argv", "is_secret_field", "arm_role"]

# Redaction by field, never by how a value looks: the secret flags and server-args fields SGLang has, and any other
# flag or field whose name ends in -key/-token/-password/-secret (``--my-secret``, ``hf_token``) unless SGLang's own
# parser (the dialect schemas) declares it a number, a list or a switch: ``kt_max_deferred_experts_per_token`` is an
# int and ``bucket_time_to_first_token`` a list of floats, not secrets. Capacity and speculative settings
# (``max_total_tokens``, ``speculative_num_draft_tokens``) never match: kept, as every other setting.
_SECRET_FIELDS = frozenset({"api_key", "admin_api_key", "hf_token", "ssl_keyfile_password"})
_SECRET_SUFFIXES = ("_key", "_token", "_password", "_secret")


@functools.lru_cache(maxsize=1)
def _not_text_fields() -> frozenset[str]:
    """Fields every known SGLang version declares as int, float, list or switch (a value that is never a secret)."""
    try:
        out: set[str] = set()
        for v in available_versions():
            out |= {f.dest for f in load_dialect(v).flags
                    if f.kind in ("store_true", "store_false", "list") or f.type in ("int", "float")}
        return frozenset(out)
    except Exception:  # noqa: BLE001 - no schema: redact every secret-named field (the safe side)
        log.debug("SGLang dialect schemas unavailable; redacting every secret-named field", exc_info=True)
        return frozenset()


def is_secret_field(name: str) -> bool:
    """True for a flag (``--api-key``) or field (``admin_api_key``) that holds a secret, judged by its name."""
    n = name.strip().lstrip("-").lower().replace("-", "_")
    if n in _SECRET_FIELDS:
        return True
    return n.endswith(_SECRET_SUFFIXES) and n not in _not_text_fields()


def redact_argv(argv: list[str] | str | None) -> list[str] | str | None:
    """Mask the values of secret flags (``--api-key X`` / ``--api-key=X``); every other argument is kept as is."""
    if argv is None:
        return None
    if isinstance(argv, str):
        return " ".join(redact_argv(argv.split()) or [])
    out: list[str] = []
    hide_next = False
    for a in argv:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        flag, eq, _ = a.partition("=")
        if flag.startswith("--") and is_secret_field(flag):
            if eq:
                out.append(f"{flag}=***")
            else:
                out.append(a)
                hide_next = True
            continue
        out.append(a)
    return out


_SERVER_KEYS = ("version", "model_path", "served_model_name", "tp_size", "nnodes", "speculative_algorithm",
                "speculative_draft_model_path", "speculative_num_draft_tokens", "speculative_num_steps",
                "speculative_draft_attention_backend", "kv_cache_dtype", "mem_fraction_static", "max_total_tokens",
                "max_total_num_tokens", "max_running_requests", "max_req_input_len", "context_length",
                "chunked_prefill_size", "mamba_full_memory_ratio", "max_mamba_cache_size", "disable_radix_cache",
                "reasoning_parser", "decode_log_interval", "enable_metrics", "emulated")


def describe_server(info: JSONObject) -> JSONObject:
    """The recorded subset of a ``/server_info`` body (secrets masked), plus the resolved live values."""
    s = parse_server_info(info)
    out = {k: info.get(k) for k in _SERVER_KEYS if k in info}
    out["resolved"] = {"max_total_num_tokens": s.max_total_num_tokens,
                       "max_running_requests": s.max_running_requests,
                       "effective_max_running_requests": s.effective_max_running_requests,
                       "max_req_input_len": s.max_req_input_len, "context_length": s.context_length,
                       "avg_spec_accept_length": s.avg_spec_accept_length}
    if "launch_command" in info:
        out["launch_command"] = redact_argv(info["launch_command"])
    for k, v in list(out.items()):
        if is_secret_field(k) and isinstance(v, str) and v:
            out[k] = "***"
    return out


@dataclass
class Arm:
    """One serving configuration under measurement."""

    name: str                         # what the card calls it: the profile name, or the endpoint
    client: SGLangClient
    endpoint: str
    model: str | None = None          # served model name sent with each request
    log: LogSource | None = None
    server_info: JSONObject = field(default_factory=dict)
    record: DeploymentRecord | None = None  # the ledger's deployment record, when deployed by sparkctl
    role: str = "?"                   # ON | OFF (speculation), or A | B when that does not tell them apart
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float | Limits = 900.0     # a number (the read timeout) or the run's Limits
    guard: RunGuard | None = None         # the run's deadline and stop signal, shared by its clients
    level_observer: LevelObserver | None = None    # around each concurrency level (a replicated deployment's split)
    engine: str = "sglang"                # the engine serving it: SGLang's answers, or another's (`facts`)
    facts: ArmFacts | None = None         # another engine's configuration, from its own answers (no /server_info)

    @property
    def sglang(self) -> bool:
        """SGLang's card: /server_info, its scheduler lines, /generate."""
        return self.engine == "sglang"

    def new_client(self) -> SGLangClient:
        """A separate client (own connection pool) for a concurrent request, under the run's bounds."""
        return SGLangClient(self.endpoint, api_key=self.api_key, limits=Limits.from_timeout(self.timeout_s),
                            guard=self.guard)

    def bind(self, limits: Limits, guard: RunGuard) -> None:
        """Measure under these bounds from now on: the arm's client is replaced by one sharing the run's guard."""
        self.client.close()
        self.timeout_s, self.guard = limits, guard
        self.client = self.new_client()

    # -- what the arm is -------------------------------------------------------------------------------------
    @property
    def speculative_algorithm(self) -> str | None:
        if self.facts is not None:
            return self.facts.speculative_method or (self.record.speculative_algorithm if self.record else None)
        alg = self.server_info.get("speculative_algorithm")
        if alg is None and self.record is not None:
            alg = self.record.speculative_algorithm
        return alg or None

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    @property
    def draft_tokens(self) -> int | None:
        if self.facts is not None:
            return self.facts.draft_tokens
        v = self.server_info.get("speculative_num_draft_tokens")
        if v is None and self.record:
            v = (self.record.profile_data.get("speculative") or {}).get("num_draft_tokens")
        return int(v) if isinstance(v, (int, float)) else None

    @property
    def emulated(self) -> bool:
        return bool(self.server_info.get("emulated")) or bool(self.record and self.record.emulated) or \
            bool(self.facts is not None and self.facts.emulated)

    @property
    def version(self) -> str | None:
        if self.facts is not None and self.facts.version:
            return self.facts.version
        return self.server_info.get("version") or (self.record.sglang_version if self.record else None)

    @property
    def context_length(self) -> int | None:
        """The context window: /server_info context_length, else the record's capacity, else the profile."""
        s = parse_server_info(self.server_info) if self.server_info else None
        rec = self.record
        for v in ((self.facts.context_length if self.facts else None), (s.context_length if s else None),
                  (rec.capacity.context_len if rec and rec.capacity else None),
                  ((rec.profile_data.get("server") or {}).get("context_length") if rec else None)):
            if isinstance(v, int) and v > 0:
                return v
        return None

    @property
    def max_running_requests(self) -> tuple[int | None, str]:
        """Resolved max running requests and where it was read."""
        if self.facts is not None:
            return self.facts.max_running_requests, self.facts.max_running_requests_source
        s = parse_server_info(self.server_info) if self.server_info else None
        if s and s.effective_max_running_requests is not None:
            return (s.effective_max_running_requests,
                    "/server_info internal_states effective_max_running_requests_per_dp")
        cap = self.record.capacity if self.record else None
        if cap is not None and isinstance(cap.max_running_requests, int):
            return cap.max_running_requests, "boot log capacity line (ledger record)"
        if s and s.max_running_requests is not None:
            return s.max_running_requests, "/server_info max_running_requests"
        return None, "unknown"

    def concurrency_cap(self) -> JSONObject | None:
        """Why the engine runs at most N requests at once, in its own words when it printed them (the mamba state
        cache warning at boot), else the launch flag that set it; with the setting that would change it."""
        if self.facts is not None:
            return self._flag_cap("--max-num-seqs", "max_num_seqs")
        if self.log is not None:
            found = concurrency_cap_from_log(self.log.whole())
            if found:
                return found
        return self._flag_cap("--max-running-requests", "max_running_requests")

    def _rank0_argv(self) -> list[str]:
        argv = None
        if self.record is not None and self.record.specs:
            argv = next((s.argv for s in self.record.specs if s.rank == 0), None)
        if argv is None and isinstance(self.server_info.get("launch_command"), str):
            argv = self.server_info["launch_command"].split()
        return list(argv or [])

    def _flag_cap(self, flag_name: str, key: str) -> JSONObject | None:
        """The launch flag that caps running requests (SGLang's --max-running-requests; another engine's, e.g.
        vLLM's --max-num-seqs), with the setting that would change it."""
        argv = self._rank0_argv()
        for i, a in enumerate(argv):
            flag, eq, val = a.partition("=")
            if flag == flag_name:
                value = val if eq else (argv[i + 1] if i + 1 < len(argv) else "?")
                return {key: int(value) if value.isdigit() else value,
                        "reason": f"the launch command sets {flag_name} {value}",
                        "source": "launch command", "setting": flag_name,
                        "fix": f"raise {flag_name} (server.max_running_requests in the profile)"}
        return None

    def refresh(self) -> None:
        """Read ``/server_info`` (and the served model name) again; another engine's own answers instead."""
        if not self.sglang:
            self.facts = arm_facts(self.engine, self.client, self.log.whole() if self.log else None,
                                   self._rank0_argv())
            if self.model is None:
                self.model = self.facts.model
            return
        try:
            self.server_info = self.client.server_info()
        except (EndpointBoundError, EndpointProtocolError):
            raise                          # a broken bound or protocol is not "unavailable": the run stops
        except SGLangAPIError as exc:
            log.warning("%s: /server_info unavailable: %s", self.endpoint, exc.message)
            self.server_info = {}
        if self.model is None:
            self.model = self.server_info.get("served_model_name")
            if self.model is None:
                try:
                    models = self.client.models()
                    self.model = models[0].get("id") if models else None
                except (EndpointBoundError, EndpointProtocolError):
                    raise
                except SGLangAPIError:
                    pass

    def config(self) -> JSONObject:
        """Everything this arm's numbers must be recorded with."""
        rec = self.record
        specs = rec.specs if rec else []
        out: JSONObject = {
            "name": self.name, "role": self.role, "endpoint": self.endpoint, "model": self.model,
            "emulated": self.emulated, "sglang_version": self.version,
            "speculative_algorithm": self.speculative_algorithm, "draft_tokens": self.draft_tokens,
            "context_length": self.context_length,
            "max_running_requests": dict(zip(("value", "source"), self.max_running_requests)),
            "deployment": rec.id if rec else None, "profile": rec.profile if rec else None,
            "profile_data": rec.profile_data if rec else None, "identity": rec.identity if rec else None,
            "images": sorted({s.image for s in specs if s.image}) or None,
            "argv_per_rank": {str(s.rank): s.argv for s in specs} or None,   # redacted in the ledger
            "env_per_rank": {str(s.rank): s.env for s in specs} or None,
            "capacity": rec.capacity if rec else None,
            "warmup_at_boot": rec.warmup if rec else None,
            "server_info": describe_server(self.server_info) if self.server_info else None,
            "log": self.log.label if self.log else None,
            "clocks_policy": "unknown",          # not measured by sparkctl (yet)
            "prefix_cache": (not self.server_info.get("disable_radix_cache")) if "disable_radix_cache" in
                            self.server_info else "unknown",
        }
        if self.facts is not None:
            # another engine: its own account (in its names), and what SGLang's card shows that it does not report
            out["engine"] = self.engine
            out["engine_facts"] = self.facts.as_dict()
            out["prefix_cache"] = self.facts.prefix_cache
            out["not_reported"] = not_reported(self.engine)
        return out


def arm_role(arms: list[Arm]) -> None:
    """Name the arms ON/OFF when exactly one has speculation on; else A, B in order."""
    if len(arms) == 2 and arms[0].speculative != arms[1].speculative:
        for a in arms:
            a.role = "ON" if a.speculative else "OFF"
    elif len(arms) == 1:
        arms[0].role = "ON" if arms[0].speculative else "OFF"
    else:
        for a, r in zip(arms, "AB"):
            a.role = r


def check_reachable(arm: Arm) -> None:
    """Raises a SparkctlError naming the arm unless its endpoint answers /health 200."""
    try:
        code = arm.client.health()
    except SGLangAPIError as exc:
        raise SparkctlError(f"cannot reach {arm.endpoint}: {exc.message}", where=f"bench arm {arm.name}",
                            hint="is the server running? `sparkctl status` for a deployment") from None
    if code != 200:
        raise SparkctlError(f"{arm.endpoint}/health answered {code}", where=f"bench arm {arm.name}",
                            hint="the server is not ready yet; wait for it or check its log")
