"""Emulator knobs: timing, capacity, acceptance, divergence and fault injection.

Sources, later wins:
  1. the defaults below (``KNOBS``),
  2. ``SPARKCTL_SIM_CLUSTER``: the cluster's knobs (the inventory's ``sparkctl_sim``) as one JSON mapping,
     set by the node runtime for every engine of an emulated cluster,
  3. the file named by ``SPARKCTL_SIM_CONFIG`` (JSON, or YAML when the name ends in .yml/.yaml),
     top-level knobs plus per-rank overrides under ``ranks: {"1": {...}}``,
  4. environment variables ``SPARKCTL_SIM_<KNOB>`` (upper-case knob name; the value is read as
     JSON when it parses, else as a string: ``SPARKCTL_SIM_BOOT_S=0.3``,
     ``SPARKCTL_SIM_DIVERGENCE='{"3fa1c2": 17}'``).

A deployment's own config file (fault injection in a profile's ``env``) therefore beats the cluster's
defaults, and a knob set in the caller's environment beats both. Unknown knob names are an error (with a
did-you-mean), so a typo never silently runs defaults.
The knob table (name -> default, meaning) is in ``KNOBS`` and in ``sparkctl/sim/README.md``.
"""
from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, fields
from typing import Any

ENV_PREFIX = "SPARKCTL_SIM_"
ENV_CONFIG = "SPARKCTL_SIM_CONFIG"
ENV_CLUSTER = "SPARKCTL_SIM_CLUSTER"
ENV_VERSION = "SPARKCTL_SIM_SGLANG_VERSION"
DEFAULT_SGLANG_VERSION = "0.5.23"

# Env vars with the prefix that are not knobs.
_NOT_KNOBS = {"CONFIG", "CLUSTER", "SGLANG_VERSION", "VLLM_VERSION"}   # the vLLM dialect: sparkctl.sim.vllm_args


class KnobError(ValueError):
    """A bad emulator configuration (unknown knob, wrong type, unreadable file)."""


@dataclass
class Knobs:
    # --- boot -------------------------------------------------------------------------------
    boot_s: float = 2.0                      # total boot time, spread over the start-up milestones
    # --- timing model -----------------------------------------------------------------------
    decode_tps: float = 14.7                 # per-request decode rate with speculation off (tok/s)
    ttft_base_s: float = 0.05                # fixed cost of every prefill batch (s)
    prefill_tps: float = 2000.0              # prefill rate for uncached prompt tokens (tok/s)
    verify_cost: float = 1.25                # a verify step of accept_ref_draft_tokens tokens costs
                                             # verify_cost/decode_tps s (sparkctl/sim/perf.py)
    verify_cost_per_token: float = 0.03      # each draft token more (less) adds (saves) this many decode steps
    accept_len_code: float = 4.6             # mean accepted tokens per verify step at accept_ref_draft_tokens,
    accept_len_prose: float = 3.3            # code / other prompts (bonus included)
    accept_ref_draft_tokens: int = 8         # the draft-token count the two means above are measured at
    batch_no_slowdown: int = 8               # tokens per forward pass that keep the step rate (memory-bound);
                                             # beyond, a step costs tokens/batch_no_slowdown times more
                                             # (tokens = running requests, times draft tokens with speculation)
    # --- capacity ---------------------------------------------------------------------------
    kv_capacity_tokens: int = 64832          # KV pool size at kv_ref_mem_fraction; max_total_num_tokens =
                                             # min(pool, --max-total-tokens)
    kv_ref_mem_fraction: float = 0.88        # --mem-fraction-static at which the pool is kv_capacity_tokens
    oom_mem_fraction: float = 0.92           # above this --mem-fraction-static the host OOM-killer ends the boot
    mamba_ref_ratio: float = 2.0             # --mamba-full-memory-ratio at which kv_capacity_tokens / mamba_slots hold
    mamba_slots: int = 1                     # hybrid models: max_running_requests cap without --max-mamba-cache-size
                                             # (at mamba_ref_ratio; proportional to an explicit ratio)
    hybrid: bool | None = None               # hybrid (mamba-state) model? None = auto (mamba flags or name)
    default_max_running_requests: int = 48   # when --max-running-requests is not given
    model_context_length: int = 65536        # context length when --context-length is not given
    # --- memory numbers printed in the log (plausible GB10 values) ---------------------------
    gpu_mem_gb: float = 115.36               # "avail mem" before weight load
    weight_gb: float = 58.40                 # weights per rank
    draft_weight_gb: float = 1.58            # drafter weights per rank (speculative only)
    kv_bytes_per_token: int = 98304          # bf16 K+V bytes per token per rank (halved for fp8 dtypes)
    # --- generated text ---------------------------------------------------------------------
    reasoning_tokens: list[int] | tuple[int, int] = (24, 64)   # natural reasoning length range
    content_tokens: list[int] | tuple[int, int] = (1500, 3000)  # natural answer length range
    divergence: dict[str, int] | None = None  # prompt-key prefix or "contains:TEXT" -> token index where
                                              # spec-ON output departs from spec-OFF output
    divergence_rate: float = 0.0             # fraction of prompts (chosen by hash) that diverge when spec is on
    divergence_positions: list[int] | tuple[int, int] = (8, 200)  # index range used by divergence_rate
    # --- multi-node -------------------------------------------------------------------------
    peer_timeout_s: float = 10.0             # a silent/vanished peer makes the survivor fail after this
    heartbeat_s: float | None = None         # heartbeat period; None = min(1.0, peer_timeout_s / 4)
    store_connect_timeout_s: float = 30.0    # rank>0 gives up reaching the store (unless --dist-timeout)
    store_wait_timeout_s: float = 600.0      # rank 0 gives up waiting for ranks (unless --dist-timeout)
    nccl_version: str = "2.27.5"
    vllm_stats_interval_s: float = 10.0      # vLLM dialect: its periodic stats / SpecDecoding lines (vLLM: 10 s)
    # ports the emulator's store never binds ("26000,26100" or a list; rank 0 fails as on EADDRINUSE, naming the
    # knob): a test suite's real engines bind their TCP store on every interface, which an emulator's store on a
    # loopback address of the same port beside them makes fail (testrig.embedded reserves the real engines' ports)
    reserved_ports: list[int] | None = None
    # --- faults -----------------------------------------------------------------------------
    fail_load_oom: bool = False              # CUDA OOM traceback during weight load, then exit 1
    hang_at_init: bool = False               # stop after the Gloo handshake, never progress
    crash_after_s: float | None = None       # scheduler exception and exit 1 this long after start
    crash_after_ready_s: float | None = None  # the same, this long after serving began (no race with boot)
    never_healthy: bool = False              # serve, but warm-up never ends: /health stays 503

    def heartbeat_period(self) -> float:
        return self.heartbeat_s if self.heartbeat_s else min(1.0, self.peer_timeout_s / 4.0)


KNOB_NAMES = tuple(f.name for f in fields(Knobs))
KNOBS: dict[str, Any] = {f.name: f.default for f in fields(Knobs)}


def _coerce(name: str, value: Any) -> Any:
    default = KNOBS[name]
    if value is None:
        return None
    try:
        if isinstance(default, bool) or name in ("hybrid", "fail_load_oom", "hang_at_init", "never_healthy"):
            if isinstance(value, str):
                low = value.strip().lower()
                if low in ("auto", "none", "null", ""):
                    return None if name == "hybrid" else False
                return low in ("1", "true", "yes", "on")
            return bool(value)
        if isinstance(default, float) or name in ("crash_after_s", "crash_after_ready_s", "heartbeat_s"):
            return float(value)
        if isinstance(default, int):
            return int(value)
        if isinstance(default, tuple):
            lo, hi = (int(v) for v in value)
            return (min(lo, hi), max(lo, hi))
        if name == "reserved_ports":     # a list (a config file, an env var's JSON) or "26000,26100" (an
            items = value.split(",") if isinstance(value, str) else value   # inventory's knobs are scalars)
            if not isinstance(items, list):
                raise TypeError("a list of port numbers, or a comma-separated string of them")
            return [int(v) for v in items if str(v).strip()]
        if name == "divergence":
            if not isinstance(value, dict):
                raise TypeError("a mapping prompt-key -> token index")
            return {str(k): int(v) for k, v in value.items()}
        return str(value) if isinstance(default, str) else value
    except (TypeError, ValueError) as e:
        raise KnobError(f"knob {name}: bad value {value!r} ({e})") from None


def _check_name(name: str, where: str) -> None:
    if name not in KNOBS:
        close = difflib.get_close_matches(name, KNOB_NAMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KnobError(f"{where}: unknown knob {name!r}{hint}")


def _read_file(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as e:
        raise KnobError(f"{ENV_CONFIG}={path}: {e}") from None
    try:
        if path.endswith((".yml", ".yaml")):
            import yaml  # pyyaml: only needed for YAML configs
            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text or "{}")
    except Exception as e:  # noqa: BLE001 - any parse error is a config error
        raise KnobError(f"{ENV_CONFIG}={path}: cannot parse: {e}") from None
    if not isinstance(data, dict):
        raise KnobError(f"{ENV_CONFIG}={path}: top level must be a mapping")
    return data


def load_knobs(node_rank: int = 0, environ: dict[str, str] | None = None) -> Knobs:
    """Resolve the knobs for one rank from defaults, the config file and the environment."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    cluster = env.get(ENV_CLUSTER)
    if cluster:
        try:
            data = json.loads(cluster)
        except ValueError as e:
            raise KnobError(f"{ENV_CLUSTER}: not JSON ({e})") from None
        if not isinstance(data, dict):
            raise KnobError(f"{ENV_CLUSTER}: must be a JSON mapping of knobs")
        for k, v in data.items():
            _check_name(k, ENV_CLUSTER)
            values[k] = v
    path = env.get(ENV_CONFIG)
    if path:
        data = _read_file(path)
        ranks = data.pop("ranks", None) or {}
        for k, v in data.items():
            _check_name(k, path)
            values[k] = v
        if not isinstance(ranks, dict):
            raise KnobError(f"{path}: 'ranks' must map a node rank to knobs")
        for k, v in (ranks.get(str(node_rank)) or ranks.get(node_rank) or {}).items():
            _check_name(k, f"{path}: ranks.{node_rank}")
            values[k] = v
    for key, raw in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX):]
        if name in _NOT_KNOBS:
            continue
        name = name.lower()
        _check_name(name, key)
        try:
            values[name] = json.loads(raw)
        except ValueError:
            values[name] = raw
    return Knobs(**{k: _coerce(k, v) for k, v in values.items()})


def sglang_version(environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get(ENV_VERSION) or DEFAULT_SGLANG_VERSION


def version_tuple(version: str) -> tuple[int, int, int]:
    """'0.5.3.post3' -> (0, 5, 3). Non-numeric parts are ignored."""
    nums: list[int] = []
    for part in version.split("."):
        digits = ""
        for ch in part:
            if ch.isdigit():
                digits += ch
            else:
                break
        if digits == "":
            break
        nums.append(int(digits))
        if len(nums) == 3:
            break
    while len(nums) < 3:
        nums.append(0)
    return (nums[0], nums[1], nums[2])
