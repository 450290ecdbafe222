"""Render a Profile + Inventory into one LaunchSpec per rank, in the profile's SGLang dialect.

Every setting is written in the spelling of the profile's SGLang version, a setting
that version lacks is refused with a ConfigError naming the profile file and key,
deprecated flags produce warnings. Example::

    result = render(load_profile("d5"), resolve_inventory(None))
    result.specs[1].argv  # ['python3', '-m', 'sglang.launch_server', ..., '--node-rank', '1', ...]
"""
from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import yaml

from sparkctl.config.inventory import Inventory, Node
from sparkctl.config.loader import did_you_mean
from sparkctl.config.profile import Profile
from sparkctl.errors import ConfigError
from sparkctl.jsontypes import JSONObject
from sparkctl.redaction import SECRET_OPTIONS
from sparkctl.sglang.dialect import Dialect, Flag, load_dialect
from sparkctl.sglang.endpoints import group_listeners, refuse_collisions
from sparkctl.sglang.launch import ENGINE_SECRETS_FILE, HF_TOKEN_FILE, SECRETS_MOUNT, LaunchSpec, Mount

log = logging.getLogger("sparkctl.render")

LAUNCH_PREFIX = ["python3", "-m", "sglang.launch_server"]
MODELS_MOUNT = "/models"   # every node's host_paths.models appears here in the engine (profiles use /models/...)

# Flags sparkctl sets itself; extra_args may not override them.
MANAGED = {"model_path": "model.path", "tp_size": "server.tp_size", "nnodes": "the inventory",
           "node_rank": "the inventory", "dist_init_addr": "the inventory and api.dist_port",
           "host": "api.host", "port": "api.port", "api_key": "api.api_key_env",
           "config": "the profile (sparkctl passes the API key in its own --config file)"}

_SERVER_ORDER = ["mem_fraction_static", "max_total_tokens", "mamba_full_memory_ratio", "max_mamba_cache_size",
                 "context_length", "kv_cache_dtype", "dsa_prefill_backend", "dsa_decode_backend",
                 "attention_backend", "max_running_requests", "chunked_prefill_size", "cuda_graph_max_bs",
                 "disable_cuda_graph", "enable_metrics", "watchdog_timeout", "dist_timeout", "decode_log_interval"]
_SPEC_FIELDS = [("algorithm", "speculative_algorithm"), ("draft_model_path", "speculative_draft_model_path"),
                ("num_draft_tokens", "speculative_num_draft_tokens"), ("num_steps", "speculative_num_steps"),
                ("eagle_topk", "speculative_eagle_topk"),
                ("draft_attention_backend", "speculative_draft_attention_backend")]


@dataclass
class RenderResult:
    profile: Profile
    inventory: Inventory
    specs: list[LaunchSpec]
    warnings: list[str] = field(default_factory=list)

    def to_json(self, rank: int | None = None) -> JSONObject:
        ranks = [s.redacted() for s in self.specs if rank is None or s.rank == rank]
        return {"profile": self.profile.name, "engine": self.profile.engine,
                "sglang_version": self.profile.image.sglang_version if self.profile.engine == "sglang" else None,
                "engine_version": self.profile.engine_version(),
                "inventory": self.inventory.path, "emulated": self.inventory.emulated,
                "ranks": [r.model_dump(include={"rank", "node", "argv", "env"}) for r in ranks],
                "warnings": list(self.warnings)}


def fmt(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class ArgvBuilder:
    """One rank's argv in a dialect's spelling; `engine` names the engine in refusals, `managed` the flags
    sparkctl sets itself (dest -> where the profile sets it)."""

    def __init__(self, profile: Profile, dialect: Dialect, *, engine: str = "SGLang",
                 managed: Mapping[str, str] = MANAGED) -> None:
        self.profile, self.dialect, self.engine, self.managed = profile, dialect, engine, managed
        self.argv: list[str] = []
        self.warnings: list[str] = []
        self.dests: dict[str, str] = {}   # dest -> profile key that put it in argv (set once)

    def _refuse(self, key: str, message: str, hint: str) -> ConfigError:
        return ConfigError(f"{key}: {message}", where=self.profile.origin_of(key), hint=hint)

    def add(self, key: str, dest: str, value: object) -> None:
        """Append one setting (skipped when None / False) in this dialect's spelling."""
        if value is None or value is False:
            return
        flag = self.dialect.flag(dest)
        version = self.dialect.version
        if flag is None:
            raise self._refuse(key, f"{self.engine} {version} has no flag for this setting ({dest})",
                               f"remove it from the profile, or use an image.{self.engine.lower()}_version that has it")
        if flag.choices is not None and value is not True and fmt(value) not in flag.choices:
            raise self._refuse(key, f"{fmt(value)!r} is not accepted by {self.engine} {version}'s {flag.option}",
                               f"use one of: {', '.join(flag.choices)}")
        if flag.deprecated:
            self.warnings.append(f"{key}: {flag.option} is deprecated in {self.engine} {version}"
                                 + (f" ({flag.deprecation_message})" if flag.deprecation_message else ""))
        option = flag.option_for(dest)
        self.dests[flag.dest] = key
        if value is True:
            if flag.kind != "store_true":
                raise self._refuse(key, f"{option} takes a value in {self.engine} {version}", "give it a value")
            self.argv.append(option)
        else:
            self.argv += [option, fmt(value)]

    def add_extra(self, extra: list[str]) -> dict[str, str]:
        """Append `server.extra_args`, each flag checked against this version's dialect: known (else a
        did-you-mean), not one sparkctl sets, given once, its values of the flag's type and choices. Returns the
        secret flags' values ({"admin-api-key": X}): they go to the secrets --config file, never into argv."""
        key = "server.extra_args"
        version = self.dialect.version
        secrets: dict[str, str] = {}
        i = 0
        while i < len(extra):
            token = extra[i]
            opt, eq, inline = token.partition("=")
            flag = self.dialect.option(opt) if opt.startswith("-") else None
            if flag is None:
                options = sorted(o for f in self.dialect.flags for o in f.options if o.startswith("--"))
                guess = did_you_mean(opt, options) if opt.startswith("-") else None
                what = f"{token!r} is not a flag of {self.engine} {version}"
                raise self._refuse(key, what if opt.startswith("-") else f"{what} (a value with no flag before it)",
                                   (f"did you mean '{guess}'? " if guess else "")
                                   + "check the spelling for this version (sparkctl render shows the dialect's flags)")
            if flag.dest in self.managed:
                raise self._refuse(key, f"{opt} is set by sparkctl", f"set it through {self.managed[flag.dest]}")
            if flag.dest in self.dests:
                by = self.dests[flag.dest]
                raise self._refuse(key, f"{opt} is given twice" if by == key else f"{opt} is already set by {by}",
                                   "set it once: remove it from extra_args" + ("" if by == key else f" or {by}"))
            self.dests[flag.dest] = key
            if flag.deprecated:
                self.warnings.append(f"{key}: {opt} is deprecated in {self.engine} {version}")
            i += 1
            if flag.kind in ("store_true", "store_false"):
                if eq:
                    raise self._refuse(key, f"{opt} takes no value (got {token!r})", f"write {opt} alone")
                self.argv.append(opt)
                continue
            if eq:
                values = [inline]
            else:
                if i >= len(extra) or not _is_value(extra[i]):
                    raise self._refuse(key, f"{opt} needs a value", f"add the value after {opt}")
                values = [extra[i]]
                i += 1
                while flag.kind == "list" and i < len(extra) and _is_value(extra[i]):
                    values.append(extra[i])
                    i += 1
            for v in values:
                self._check_value(key, opt, flag, v)
            if flag.secret:
                secrets[flag.option.lstrip("-")] = values[0]
                continue
            self.argv += [opt, *values]
        return secrets

    def _check_value(self, key: str, opt: str, flag: Flag, value: str) -> None:
        if flag.choices is not None and value not in flag.choices:
            raise self._refuse(key, f"{value!r} is not accepted by {opt}", f"use one of: {', '.join(flag.choices)}")
        if flag.type == "json":    # vLLM's config flags (--compilation-config ...) take one JSON document
            try:
                json.loads(value)
            except ValueError as exc:
                raise self._refuse(key, f"{opt} takes JSON (got {value!r}: {exc})",
                                   f"write {opt} a JSON object, e.g. {opt} '{{}}'") from None
        conv = {"int": int, "float": float}.get(flag.type or "")
        if conv is None:
            return
        try:
            number = conv(value)
        except ValueError:
            raise self._refuse(key, f"{opt} takes {'an integer' if conv is int else 'a number'} (got {value!r})",
                               f"give {opt} a number, e.g. {opt} 1") from None
        if conv is float and not math.isfinite(number):
            raise self._refuse(key, f"{opt} takes a finite number (got {value!r})", f"give {opt} a finite number")


def _is_value(token: str) -> bool:
    """argparse reads a token as a value unless it looks like an option (a negative number is a value)."""
    if not token.startswith("-") or token == "-":
        return True
    try:
        float(token)
        return True
    except ValueError:
        return False


def check_topology(profile: Profile, inventory: Inventory) -> None:
    gpus = sum(n.gpus for n in inventory.nodes)
    tp = profile.server.tp_size
    per_node = {n.gpus for n in inventory.nodes}
    if tp == gpus and len(per_node) == 1:
        return
    tp_file = profile.origin_of("server.tp_size")
    if profile.replicas > 1 and len(inventory.nodes) == profile.replicas * tp // max(1, min(per_node)):
        raise ConfigError(f"replicas: {profile.replicas}: the {len(inventory.nodes)} nodes hold {profile.replicas} "
                          f"replicas of {tp} rank(s) each, not one group", where=profile.origin_of("replicas"),
                          hint="`sparkctl render` prints each replica, `sparkctl preflight` checks each, `sparkctl "
                               "up` deploys them behind the router")
    if len(inventory.nodes) != 2 or per_node != {1}:  # not the two single-GPU Sparks sparkctl is built for
        raise ConfigError(
            f"hosts: {len(inventory.nodes)} node(s) with {gpus} GPU(s) cannot hold the {tp} ranks of server.tp_size "
            f"(set in {tp_file})", where=inventory.path,
            hint=f"list {tp} single-GPU nodes under all.children.<group>.hosts (ranks 0..{tp - 1}), or use an "
                 f"inventory for this cluster")
    raise ConfigError(
        f"server.tp_size: {tp} ranks cannot be held by {len(inventory.nodes)} node(s) with {gpus} GPU(s) in all "
        f"(inventory {inventory.path})", where=tp_file,
        hint=f"set tp_size to {gpus}, or list {tp} single-GPU nodes in the inventory")


def _check_speculative(profile: Profile, dialect: Dialect) -> None:
    """The algorithm must be one SGLang's SpeculativeAlgorithm knows in this version (argparse takes any string
    on 0.5.23, and the engine only fails at start-up with "Unknown speculative algorithm name")."""
    names = dialect.speculative_algorithms
    if profile.speculative is None or names is None or profile.speculative.algorithm in names:
        return
    value = profile.speculative.algorithm
    guess = value.upper() if value.upper() in names else did_you_mean(value.upper(), list(names))
    raise ConfigError(f"speculative.algorithm: {value!r} is not accepted by SGLang {dialect.version} "
                      f"(not one of its speculative algorithms)",
                      where=profile.origin_of("speculative.algorithm"),
                      hint=(f"did you mean '{guess}'? " if guess else "") + f"known: {', '.join(names)}")


def api_address(node: Node, bind: str) -> str:
    """Where the controller reaches a node's HTTP API: its management address when bound to all interfaces."""
    return node.ssh.host if bind in ("0.0.0.0", "::") else bind


def _add_flags(b: ArgvBuilder, profile: Profile, inventory: Inventory, rank: int, bind: str) -> None:
    """One rank's flags from the profile, in SGLang's order: the model, the topology (this rank of the inventory's
    nodes, the fabric address of rank 0), the API, the server's options, the speculative decoding."""
    m = profile.model
    b.add("model.path", "model_path", m.path)
    b.add("model.served_name", "served_model_name", m.served_name)
    b.add("model.reasoning_parser", "reasoning_parser", m.reasoning_parser)
    b.add("model.tool_call_parser", "tool_call_parser", m.tool_call_parser)
    b.add("model.trust_remote_code", "trust_remote_code", m.trust_remote_code)
    b.add("server.tp_size", "tp_size", profile.server.tp_size)
    b.add("server.tp_size", "nnodes", len(inventory.nodes))
    b.add("server.tp_size", "node_rank", rank)
    b.add("api.dist_port", "dist_init_addr", f"{inventory.rank0.fabric_address}:{profile.api.dist_port}")
    b.add("api.host", "host", bind)
    b.add("api.port", "port", profile.api.port)
    for name in _SERVER_ORDER:
        b.add(f"server.{name}", name, getattr(profile.server, name))
    if profile.speculative is not None:
        for attr, dest in _SPEC_FIELDS:
            b.add(f"speculative.{attr}", dest, getattr(profile.speculative, attr))


def rank_env(profile: Profile, node: Node, *, host_ip_var: str = "SGLANG_HOST_IP") -> dict[str, str]:
    """A rank's environment: the profile's, the node's own after it (e.g. its CPU core binding), then the fabric
    the collectives use (its address, named by the engine's variable, and interface, its RoCE devices)."""
    env = dict(profile.env)
    env.update(node.engine_env)        # this node's own (e.g. its CPU core binding), after the profile's
    env.update({
        host_ip_var: node.fabric_address,
        "NCCL_SOCKET_IFNAME": node.fabric_interface,
        "GLOO_SOCKET_IFNAME": node.fabric_interface,
        "TP_SOCKET_IFNAME": node.fabric_interface,
    })
    if node.roce_hcas:
        env["NCCL_IB_HCA"] = ",".join(node.roce_hcas)
    return env


@dataclass(frozen=True)
class EngineArgv:
    """What differs between engines when a profile becomes argv: the engine's name (in messages), its launch
    command, the flags sparkctl sets itself, how one rank's flags are added, and the variable naming a rank's own
    fabric address."""

    name: str
    launch_prefix: list[str]
    managed: Mapping[str, str]
    add_flags: Callable[[ArgvBuilder, Profile, Inventory, int, str], None]
    host_ip_var: str


SGLANG = EngineArgv(name="SGLang", launch_prefix=LAUNCH_PREFIX, managed=MANAGED, add_flags=_add_flags,
                    host_ip_var="SGLANG_HOST_IP")


def render(profile: Profile, inventory: Inventory, *, environ: Mapping[str, str] | None = None) -> RenderResult:
    """Render every rank's LaunchSpec. Raises ConfigError for anything the dialect or topology refuses."""
    dialect = profile_dialect(profile)
    check_topology(profile, inventory)
    _check_speculative(profile, dialect)
    return render_ranks(profile, inventory, dialect, SGLANG, environ=environ)


def profile_dialect(profile: Profile) -> Dialect:
    """The dialect of the profile's engine and version, refused at the profile key that names the version."""
    key = f"image.{profile.engine}_version"
    try:
        return load_dialect(profile.engine_version(), profile.engine)
    except ConfigError as exc:
        raise exc.amended(where=profile.origin_of(key), message=f"{key}: {exc.message}") from None


def render_ranks(profile: Profile, inventory: Inventory, dialect: Dialect, engine: EngineArgv, *,
                 environ: Mapping[str, str] | None = None) -> RenderResult:
    """Every rank's LaunchSpec in one engine's spelling: its flags, `server.extra_args` checked against the
    dialect, the secrets in files (never argv or env), the mounts; listeners that collide are refused."""
    environ = os.environ if environ is None else environ
    secrets: set[str] = set()
    api_key = environ.get(profile.api.api_key_env) if profile.api.api_key_env else None
    hf_token = environ.get(profile.api.hf_token_env) if profile.api.hf_token_env else None
    secrets.update(v for v in (api_key, hf_token) if v)

    specs: list[LaunchSpec] = []
    warnings: list[str] = []
    image = inventory.cluster.engine_image or profile.image.engine_ref(profile.engine)
    for rank, node in enumerate(inventory.nodes):
        b = ArgvBuilder(profile, dialect, engine=engine.name, managed=engine.managed)
        bind = profile.api.host or node.api_bind
        engine.add_flags(b, profile, inventory, rank, bind)
        flag_secrets = b.add_extra(profile.server.extra_args)
        secret_files: dict[str, str] = {}
        config_secrets = dict(flag_secrets)
        if api_key:
            config_secrets["api-key"] = api_key
        secrets.update(v for v in flag_secrets.values() if v)
        if flag_secrets and dialect.flag("config") is None:
            # No --config in this version: the value stays in argv, redacted in everything sparkctl prints.
            for name, value in flag_secrets.items():
                b.argv += [f"--{name}", value]
        elif config_secrets:
            # Not `--api-key KEY` (ps, docker inspect and /proc/PID/cmdline show argv): SGLang's
            # prepare_server_args merges a `--config` YAML into argv in-process (ConfigArgumentMerger, SGLang
            # 0.5.3+; keys in any long spelling), so the key reaches ServerArgs.api_key from a 0400 file; vLLM's
            # FlexibleArgumentParser does the same (_pull_args_from_config, vLLM 0.32.0 utils/argparse_utils.py).
            for dest in ("api_key", "config") if api_key else ():
                if dialect.flag(dest) is None:
                    option = "--" + dest.replace("_", "-")
                    raise b._refuse("api.api_key_env", f"{engine.name} {dialect.version} has no {option}",
                                    f"unset api.api_key_env, or use an image.{profile.engine}_version that has it")
            b.argv += ["--config", f"{SECRETS_MOUNT}/{ENGINE_SECRETS_FILE}"]
            secret_files[ENGINE_SECRETS_FILE] = yaml.safe_dump(config_secrets)

        env = rank_env(profile, node, host_ip_var=engine.host_ip_var)
        if hf_token:
            # Not HF_TOKEN=... (docker inspect shows a container's env): huggingface_hub reads the token file
            # named by HF_TOKEN_PATH (huggingface_hub constants.HF_TOKEN_PATH, 0.x and 1.x).
            env["HF_TOKEN_PATH"] = f"{SECRETS_MOUNT}/{HF_TOKEN_FILE}"
            secret_files[HF_TOKEN_FILE] = hf_token
        mounts = [Mount(source=node.host_paths.models, target=MODELS_MOUNT, read_only=True),
                  Mount(source=node.host_paths.cache, target="/root/.cache", read_only=False)]
        specs.append(LaunchSpec(rank=rank, node=node.name, argv=engine.launch_prefix + b.argv, env=env,
                                sglang_version=dialect.version, engine=profile.engine, api_host=api_address(node, bind),
                                api_port=profile.api.port, mounts=mounts, secret_values=frozenset(secrets),
                                image=image, secret_files=secret_files,
                                secret_options=dialect.secret_options() | SECRET_OPTIONS))
        if rank == 0:
            warnings = b.warnings
    for w in warnings:
        log.warning("%s", w)
    refuse_collisions(group_listeners(specs, inventory), inventory.path)
    return RenderResult(profile=profile, inventory=inventory, specs=specs, warnings=warnings)
