"""The serving engines behind one lifecycle: a profile's `engine` (sglang, the default, or vllm) picks the package
that spells its flags, reads its log and names its metrics (`sparkctl.sglang`, `sparkctl.vllm`). Everything above
this layer asks here, and never spells an engine's flags itself.

    result = render(load_profile("cpu-tiny-vllm"), resolve_inventory("inventory/local-vllm.yml"))
    result.specs[0].argv   # ['python3', '-m', 'vllm.entrypoints.cli.main', 'serve', '/models/target', ...]
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.errors import ConfigError
from sparkctl.jsontypes import JSONObject
from sparkctl.sglang import render as sglang_render
from sparkctl.sglang.bootwatch import LogFollower
from sparkctl.sglang.render import RenderResult, profile_dialect
from sparkctl.sglang.responses import SGLangAPIError
from sparkctl.vllm import answers as vllm_answers
from sparkctl.vllm import render as vllm_render

if TYPE_CHECKING:     # the HTTP client (httpx) loads when a client is made: after the engines start
    from sparkctl.sglang.client import SGLangClient

__all__ = ["RenderResult", "emulated", "render", "resolved_capacity", "settings_seen"]


def check_runs(profile: Profile, inventory: Inventory) -> None:
    """The inventory's process runtime runs the profile's engine: the emulator speaks both engines' argv (SGLang's
    and, as `python -m sparkctl.sim serve ...`, vLLM's), a real engine's environment (sparkctl_engine) holds one
    engine. Docker nodes run what their image holds."""
    runs = inventory.cluster.engine
    if not any(n.runtime == "process" for n in inventory.nodes) or runs in (profile.engine, "emulator") or \
            profile.engine in inventory.cluster.pythons():
        return
    if runs == "real":
        raise ConfigError(f"engine: {profile.engine}: the inventory's engine_pythons has no {profile.engine}",
                          where=profile.origin_of("engine"),
                          hint=f"add {profile.engine}: <its bin/python> to sparkctl_engine_pythons in "
                               f"{inventory.path}")
    raise ConfigError(f"engine: {profile.engine}: the inventory's process runtime runs real {runs}",
                      where=profile.origin_of("engine"),
                      hint=f"use an inventory whose sparkctl_engine is {profile.engine} (e.g. inventory/local-"
                           f"{profile.engine}.yml), or a profile with engine: {runs}")


def render(profile: Profile, inventory: Inventory, *, environ: Mapping[str, str] | None = None) -> RenderResult:
    """Every rank's LaunchSpec in the profile's engine's spelling (ConfigError for what it refuses)."""
    check_runs(profile, inventory)
    if profile.engine == "vllm":
        return vllm_render.render(profile, inventory, environ=environ)
    return sglang_render.render(profile, inventory, environ=environ)


def _sglang_expected(profile: Profile) -> JSONObject:
    exp: JSONObject = {"tp_size": profile.server.tp_size}
    spec = profile.speculative
    exp["speculative_algorithm"] = spec.algorithm if spec else None
    if spec and spec.num_draft_tokens is not None:
        exp["speculative_num_draft_tokens"] = spec.num_draft_tokens
    if profile.server.kv_cache_dtype is not None:
        exp["kv_cache_dtype"] = profile.server.kv_cache_dtype
    if profile.server.mem_fraction_static is not None:
        exp["mem_fraction_static"] = profile.server.mem_fraction_static
    if profile.server.context_length is not None:
        exp["context_length"] = profile.server.context_length
    return exp


def settings_seen(profile: Profile, client: SGLangClient, rank0: LogFollower | None
                  ) -> tuple[JSONObject, JSONObject]:
    """(what the profile asks for, what the engine says it runs), in the engine's own names: SGLang's
    /server_info; vLLM's config line (in rank 0's log, as its follower kept it), /metrics and /v1/models."""
    if profile.engine == "vllm":
        config = rank0.engine_config if rank0 is not None else None
        seen = vllm_answers.settings_in_force(config, client.text("/metrics"), client.models())
        return vllm_answers.expected_settings(profile, profile_dialect(profile)), seen
    return _sglang_expected(profile), client.server_info()


def emulated(profile: Profile, client: SGLangClient) -> bool:
    """The engine says it is sparkctl's emulator: SGLang's ``/server_info`` (``"emulated": true``), vLLM's
    ``/version`` (``{"version": "0.32.0", "emulated": true}``: the real one answers ``{"version": "0.32.0"}``,
    tests/fixtures/captures/vllm-0.32.0-cpu/tp1-version.txt). False when the engine does not answer."""
    try:
        if profile.engine == "vllm":
            body = json.loads(client.text("/version", max_bytes=4096))
            return isinstance(body, dict) and body.get("emulated") is True
        return bool(client.server_info().get("emulated"))
    except (SGLangAPIError, ValueError):
        return False


def resolved_capacity(profile: Profile, info: JSONObject
                      ) -> tuple[tuple[str, int | None], tuple[str, int | float | None]]:
    """((name, KV tokens), (name, concurrent requests)) the engine resolved, named as the engine names them:
    SGLang's max_total_num_tokens and max_running_requests; vLLM's KV cache size in tokens and the requests of
    max_model_len that cache holds at once (vLLM does not report its resolved max_num_seqs)."""
    if profile.engine == "vllm":
        tokens, concurrency = vllm_answers.capacity(info)
        return ("kv_cache_size_tokens", tokens), ("kv_cache_max_concurrency", concurrency)
    total = info.get("max_total_num_tokens")
    running = info.get("max_running_requests")
    states = info.get("internal_states")
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    running = first.get("effective_max_running_requests_per_dp", running) or running
    return (("max_total_num_tokens", total if isinstance(total, int) else None),
            ("max_running_requests", running if isinstance(running, (int, float)) else None))
