"""What a running SGLang server says about itself, parsed without I/O: ``/server_info`` (and 0.5.3's
``/get_server_info``), ``/v1/models``, ``/metrics`` (Prometheus text), which server answers on a port (rank 0's
API or a worker's dummy health server), and per-request accept length from ``/generate`` ``meta_info``.

Tested on captured real bodies (``tests/sglang/test_client.py``); the HTTP client is ``sparkctl.sglang.client``.
"""
from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass

from sparkctl.jsontypes import JSONMapping, JSONObject, JSONValue
from sparkctl.sglang.responses import EndpointProtocolError, as_json_object, evidence_of, int_or_none

__all__ = ["ServerInfo", "PromSample", "NodeRole", "parse_server_info", "parse_prometheus",
           "parse_prometheus_samples", "parse_models", "detect_role", "accept_length_from_meta"]


@dataclass
class ServerInfo:
    """The fields sparkctl records from ``/server_info`` (or 0.5.3's ``/get_server_info``)."""

    version: str | None
    max_total_num_tokens: int | None
    max_running_requests: int | None
    effective_max_running_requests: int | None
    max_req_input_len: int | None
    tp_size: int | None
    context_length: int | None
    model_path: str | None
    served_model_name: str | None
    speculative_algorithm: str | None
    speculative_num_draft_tokens: int | None
    kv_cache_dtype: str | None
    mem_fraction_static: float | None
    last_gen_throughput: float | None
    avg_spec_accept_length: float | None
    memory_usage: JSONObject | None
    raw: JSONObject


@dataclass(frozen=True)
class PromSample:
    name: str
    labels: dict[str, str]
    value: float


class NodeRole(enum.Enum):
    API = "api"            # rank 0: the real HTTP server (/v1/models answers)
    WORKER = "worker"      # node rank > 0: dummy health server (/health 200, /v1/models 404)
    DOWN = "down"          # nothing listening
    UNKNOWN = "unknown"


def parse_server_info(body: str | bytes | JSONMapping) -> ServerInfo:
    """Pick the recorded fields out of a server-info body; tolerant of extra and missing keys.

    ``internal_states[0]`` (per DP rank) holds the live values: effective max running
    requests, last gen throughput, memory usage and, with speculation, avg accept length.
    """
    d = as_json_object(body)
    states = d.get("internal_states") or [{}]
    st = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}

    def pick(key: str) -> JSONValue:
        return d.get(key, st.get(key))

    def num(v: object) -> float | None:
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    return ServerInfo(
        version=pick("version"), max_total_num_tokens=int_or_none(pick("max_total_num_tokens")),
        max_running_requests=int_or_none(pick("max_running_requests")),
        effective_max_running_requests=int_or_none(st.get("effective_max_running_requests_per_dp")),
        max_req_input_len=int_or_none(pick("max_req_input_len")), tp_size=int_or_none(pick("tp_size")),
        context_length=int_or_none(pick("context_length")), model_path=pick("model_path"),
        served_model_name=pick("served_model_name"), speculative_algorithm=pick("speculative_algorithm"),
        speculative_num_draft_tokens=int_or_none(pick("speculative_num_draft_tokens")),
        kv_cache_dtype=pick("kv_cache_dtype"), mem_fraction_static=num(pick("mem_fraction_static")),
        last_gen_throughput=num(st.get("last_gen_throughput")),
        avg_spec_accept_length=num(st.get("avg_spec_accept_length", d.get("avg_spec_accept_length"))),
        memory_usage=st.get("memory_usage"), raw=d)


def parse_prometheus_samples(text: str) -> list[PromSample]:
    """Prometheus text exposition -> samples (comments skipped, NaN/Inf kept as floats), read by
    `prometheus_client.parser` (label values unescaped: ``\\"`` is ``"``, ``\\n`` a newline). Untrusted text: when
    the whole text does not parse, each line is read on its own, so a line that is not exposition text is skipped
    and the others stand."""
    try:
        return _samples(text)
    except _PARSE_ERRORS:
        pass
    out: list[PromSample] = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            with contextlib.suppress(*_PARSE_ERRORS):
                out += _samples(line.strip())
    return out


_PARSE_ERRORS = (ValueError, IndexError, KeyError)     # what prometheus_client's parser raises on a bad line


def _samples(text: str) -> list[PromSample]:
    from prometheus_client.parser import text_string_to_metric_families
    return [PromSample(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]


def parse_prometheus(text: str, prefix: str = "sglang:") -> dict[str, float]:
    """``/metrics`` -> {name: value} for names starting with ``prefix``.

    Histogram ``_bucket`` rows are dropped (``_sum``/``_count`` kept). With several label sets
    for one name (several TP/DP ranks, models) the first sample wins; use
    ``parse_prometheus_samples`` when the labels matter.
    """
    out: dict[str, float] = {}
    for s in parse_prometheus_samples(text):
        if s.name.startswith(prefix) and not s.name.endswith("_bucket"):
            out.setdefault(s.name, s.value)
    return out


def parse_models(body: str | bytes | JSONMapping, *, url: str = "/v1/models") -> list[JSONObject]:
    """``/v1/models`` body -> its ``data`` list (``id`` = served model name, ``max_model_len``...)."""
    d = as_json_object(body)
    data = d.get("data") or []
    if not isinstance(data, list):
        raise EndpointProtocolError(url, 200, reason=f"'data' is a {type(data).__name__}, not a list",
                                    evidence=evidence_of(repr(d)[:2000]))
    return [m for m in data if isinstance(m, dict)]


def detect_role(models_status: int | None, health_status: int | None) -> NodeRole:
    """Which SGLang HTTP server answers on a port, from two status codes (None = no connection).

    Rank 0 serves the OpenAI API (``/v1/models`` 200, or 401 behind ``--api-key``); a non-zero
    node rank serves only the dummy health server, whose ``/health`` is always 200 and which
    has no ``/v1/models`` (404). Never trust a worker's ``/health`` as readiness.
    """
    if models_status in (200, 401, 403):
        return NodeRole.API
    if models_status == 404 and health_status == 200:
        return NodeRole.WORKER
    if models_status is None and health_status is None:
        return NodeRole.DOWN
    return NodeRole.UNKNOWN


def accept_length_from_meta(meta_info: JSONMapping) -> float | None:
    """Per-request accept length = completion_tokens / spec_verify_ct (None without speculation)."""
    ct, n = meta_info.get("spec_verify_ct"), meta_info.get("completion_tokens")
    if isinstance(ct, list):      # batched form
        ct = sum(x for x in ct if isinstance(x, (int, float)))
    if not isinstance(ct, (int, float)) or not ct or not isinstance(n, (int, float)):
        return None
    return n / ct
