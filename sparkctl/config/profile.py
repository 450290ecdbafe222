"""Profile: what to serve and how, as validated data.

A profile is a YAML file under profiles/ that may `extends:` another (several
levels; cycles rejected). Mappings merge key by key; lists and scalars replace;
`speculative: null` turns speculative decoding off. Settings use SGLang 0.5.23's
names (server_args dests); the renderer spells them for the profile's engine (`engine: sglang`, the default, or
`vllm`) and version, and refuses a setting the engine has no counterpart for.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from sparkctl.config.loader import config_error_from, did_you_mean, key_path, origin_of, read_yaml, refusal
from sparkctl.config.values import (
    ArgToken,
    ArgValue,
    Choice,
    Count,
    EngineEnvKey,
    EnvName,
    EnvValue,
    Flag,
    ImageRef,
    Int,
    ModelPath,
    Number,
    PlainName,
    Platform,
    Port,
    Prose,
    Seconds,
    Text,
    Version,
    Word,
    engine_env_key,
)
from sparkctl.enginenames import ENGINE_NAMES
from sparkctl.errors import ConfigError
from sparkctl.jsontypes import JSONObject
from sparkctl.resources import search_dirs
from sparkctl.untrusted import is_plain_name

_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)


class ImageSettings(BaseModel):
    model_config = _STRICT
    sglang_version: Version = Field("0.5.23", description="SGLang release the image carries; selects the flag dialect "
                                    "(engine: sglang).")
    vllm_version: Version | None = Field(None, description="vLLM release the image carries; selects the flag dialect "
                                         "(engine: vllm, where it is required).")
    base_image: ImageRef = Field("lmsysorg/sglang:v0.5.23", description="Engine base image the GB10 layers build on.")
    patch_series: PlainName | None = Field(None, description="Directory under patches/ applied at image build.")
    platform: Platform = Field("linux/arm64", description="Image platform (DGX Spark is aarch64).")
    ref: ImageRef | None = Field(None, description="Engine image to run; "
                                 "default: sparkctl/<engine>-gb10:<version>-<patches>.")

    def engine_ref(self, engine: str = "sglang") -> str:
        """The engine image reference this profile runs."""
        version = self.vllm_version if engine == "vllm" else self.sglang_version
        return self.ref or f"sparkctl/{engine}-gb10:{version}-{self.patch_series or 'unpatched'}"


class ModelSettings(BaseModel):
    model_config = _STRICT
    path: ModelPath = Field(description="Model path inside the engine: /models/... is each node's host_paths.models.")
    served_name: ArgValue | None = Field(None, description="--served-model-name: the id clients ask for.")
    reasoning_parser: Word | None = Field(None, description="--reasoning-parser, e.g. glm45.")
    tool_call_parser: Word | None = Field(None, description="--tool-call-parser.")
    trust_remote_code: Flag = Field(False, description="--trust-remote-code.")


class ServerSettings(BaseModel):
    """SGLang server arguments sparkctl knows by name (0.5.23 names)."""

    model_config = _STRICT
    tp_size: Count = Field(2, ge=1, description="--tp-size: tensor-parallel ranks (one GPU per Spark).")
    mem_fraction_static: Number | None = Field(
        None, gt=0, lt=1, description="--mem-fraction-static: fraction of unified memory for weights+KV (0..1).")
    max_total_tokens: Count | None = Field(None, gt=0, description="--max-total-tokens: KV pool cap in tokens.")
    mamba_full_memory_ratio: Number | None = Field(None, gt=0, description="--mamba-full-memory-ratio.")
    max_mamba_cache_size: Count | None = Field(None, gt=0, description="--max-mamba-cache-size (raises the mamba cap).")
    context_length: Count | None = Field(None, gt=0, description="--context-length.")
    kv_cache_dtype: Word | None = Field(None, description="--kv-cache-dtype, e.g. bf16, fp8_e4m3.")
    dsa_prefill_backend: Word | None = Field(None, description="--dsa-prefill-backend (--nsa-* before 0.5.16).")
    dsa_decode_backend: Word | None = Field(None, description="--dsa-decode-backend (--nsa-* before 0.5.16).")
    attention_backend: Word | None = Field(None, description="--attention-backend.")
    max_running_requests: Count | None = Field(None, gt=0, description="--max-running-requests.")
    chunked_prefill_size: Int | None = Field(None, description="--chunked-prefill-size.")
    cuda_graph_max_bs: Count | None = Field(None, gt=0, description="--cuda-graph-max-bs (rejected on 0.5.23).")
    disable_cuda_graph: Flag = Field(False, description="--disable-cuda-graph (deprecated on 0.5.23).")
    enable_metrics: Flag = Field(True, description="--enable-metrics: expose /metrics.")
    watchdog_timeout: Seconds | None = Field(None, gt=0, description="--watchdog-timeout seconds.")
    dist_timeout: Count | None = Field(None, gt=0, description="--dist-timeout seconds.")
    decode_log_interval: Count | None = Field(None, gt=0, description="--decode-log-interval (decode steps per log).")
    extra_args: list[ArgToken] = Field(default_factory=list,
                                  description="Further SGLang flags, passed through but checked against the dialect.")


# Algorithms whose drafter is a separate checkpoint: SGLang 0.5.23 raises "DFLASH speculative decoding requires
# setting --speculative-draft-model-path" at start-up (arg_groups/speculative_hook.py); EAGLE/EAGLE3/STANDALONE
# load speculative_draft_model_path as the draft model (it falls back to model_path only for a model's own MTP
# layers, which is what algorithm NEXTN names).
NEEDS_DRAFTER = ("DFLASH", "EAGLE", "EAGLE3", "STANDALONE")
MAX_DRAFT_TOKENS = 64


class SpeculativeSettings(BaseModel):
    model_config = _STRICT
    algorithm: Word = Field(description="--speculative-algorithm: a name SGLang's SpeculativeAlgorithm knows in the "
                                       "profile's version (DFLASH, EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM ...; "
                                       "render checks it against the version's dialect).")
    draft_model_path: ModelPath | None = Field(None, validate_default=True, description=(
        "--speculative-draft-model-path (/models/... as for model.path); required for DFLASH, EAGLE, EAGLE3 "
        "and STANDALONE (use NEXTN for a model's built-in MTP layers)."))
    num_draft_tokens: Count | None = Field(None, ge=1, le=MAX_DRAFT_TOKENS, description=(
        "--speculative-num-draft-tokens: tokens verified per step, 1..64. SGLang itself only needs a positive "
        "integer; its defaults are the drafter's block size for DFLASH (16 when the drafter config has none), "
        "num_steps+1 for EAGLE with topk 1, 12 for NGRAM, and its documented EAGLE trees stay within 64. Every "
        "verify step computes this many tokens per request, so a larger value only adds work."))
    num_steps: Count | None = Field(None, ge=1, description="--speculative-num-steps (DFLASH forces 1).")
    eagle_topk: Count | None = Field(None, ge=1, description="--speculative-eagle-topk (DFLASH forces 1).")
    draft_attention_backend: Word | None = Field(None, description="--speculative-draft-attention-backend.")

    @field_validator("algorithm")
    @classmethod
    def _not_dflash2(cls, value: str) -> str:
        if value.upper() == "DFLASH2":
            raise ValueError("'DFLASH2' is not an SGLang algorithm name; DFlash2 drafters run under "
                             "algorithm DFLASH (set algorithm: DFLASH and draft_model_path to the DFlash2 drafter)")
        return value

    @field_validator("draft_model_path")
    @classmethod
    def _drafter_given(cls, value: str | None, info: ValidationInfo) -> str | None:
        algorithm = str(info.data.get("algorithm") or "").upper()
        if value is None and algorithm in NEEDS_DRAFTER:
            raise refusal(f"algorithm {algorithm} needs a draft model, and none is set",
                          "set speculative.draft_model_path to the drafter under /models"
                          + (", or use algorithm: NEXTN for the model's own MTP layers" if "EAGLE" in algorithm
                             else ""))
        return value


class WarmupSettings(BaseModel):
    model_config = _STRICT
    requests: Count = Field(2, ge=0, le=1000,
                            description="Warm-up requests after boot (the first, cold one is timed apart).")
    max_tokens: Count = Field(800, ge=1, description="max_tokens per warm-up request.")
    prompt: Prose = Field("Write a short, careful explanation of how a thread-safe queue works.",
                        description="Warm-up prompt.")
    timeout_s: Seconds = Field(900, description="Timeout per warm-up request (the cold one pays JIT cost).")


class Expectations(BaseModel):
    model_config = _STRICT
    min_max_total_num_tokens: Count | None = Field(None, ge=1,
                                                 description="Fail verify if resolved max_total_num_tokens is lower.")
    min_max_running_requests: Count | None = Field(None, ge=1,
                                                 description="Fail verify if resolved max_running_requests is lower.")


class ApiSettings(BaseModel):
    model_config = _STRICT
    host: Word | None = Field(None, description="--host; default: the node's api_bind from the inventory.")
    port: Port = Field(30000, description="--port of rank 0's HTTP API.")
    dist_port: Port = Field(25000,
                           description="Port of rank 0's TCP store in --dist-init-addr (not api.port).")
    api_key_env: EnvName | None = Field(None, description="Environment variable holding the API key (never stored).")
    hf_token_env: EnvName | None = Field("HF_TOKEN", description="Environment variable holding the HF token (passed "
                                                               "to the engine, never stored).")


class LifecycleSettings(BaseModel):
    model_config = _STRICT
    boot_timeout_s: Seconds = Field(1800, description="Bound on boot (rank 0 ready) before failing.")
    health_timeout_s: Seconds = Field(60, description="Bound on the verify gates' requests.")


class RouterSettings(BaseModel):
    """SGLang's router (sglang-router 0.3.2) in front of the replicas, on rank 0's node (replicas > 1 only)."""
    model_config = _STRICT
    policy: Choice[Literal["random", "round_robin", "cache_aware", "power_of_two"]] = Field(
        "cache_aware", description="--policy (sglang-router 0.3.2's; cache_aware is its default).")
    port: Port = Field(30080, description="Port of the router: the endpoint handed off when replicas > 1.")
    prometheus_port: Port = Field(29000, description="Port of the router's Prometheus /metrics.")
    health_check_interval_s: Count = Field(5, ge=1, le=3600,
                                           description="--health-check-interval-secs (the router's default is 60).")
    drain_timeout_s: Seconds = Field(300, description="Rolling update: bound on a removed replica's in-flight "
                                                      "requests finishing before it is redeployed.")




class Profile(BaseModel):
    """A validated, fully merged profile."""

    model_config = _STRICT
    name: PlainName = Field(description="Profile name (file stem).")
    path: Text = Field(description="File the profile was loaded from.")
    description: Text = Field("", description="One line shown by `sparkctl profiles`.")
    engine: Choice[Literal["sglang", "vllm"]] = Field(
        "sglang", description="The serving engine: sglang (the default) or vllm. Settings keep SGLang's names; "
                              "`sparkctl render` shows each engine's spelling, and a setting the engine lacks is "
                              "refused with its counterpart named.")
    image: ImageSettings = Field(default_factory=ImageSettings, description="Engine image.")
    model: ModelSettings = Field(description="Model to serve.")
    server: ServerSettings = Field(default_factory=ServerSettings, description="SGLang server settings.")
    speculative: SpeculativeSettings | None = Field(None, description="Speculative decoding, or null for off.")
    env: dict[EngineEnvKey, EnvValue] = Field(default_factory=dict,
                                              description="Extra environment for the engine on every rank.")
    warmup: WarmupSettings = Field(default_factory=WarmupSettings, description="Warm-up after boot.")
    expect: Expectations = Field(default_factory=Expectations, description="Expectations on resolved capacity.")
    api: ApiSettings = Field(default_factory=ApiSettings, description="HTTP API and rendezvous ports.")
    lifecycle: LifecycleSettings = Field(default_factory=LifecycleSettings, description="Timeouts.")
    replicas: Count = Field(1, ge=1, le=64, description="Data-parallel replicas: K groups of server.tp_size nodes "
                                                       "each (in inventory rank order), behind the router when K > 1.")
    router: RouterSettings = Field(default_factory=RouterSettings, description="The router in front of replicas.")
    rollback_profile: PlainName | None = Field(None,
                                               description="Profile to fall back to when asked (e.g. dflash-off).")
    extends: list[PlainName] = Field(default_factory=list, description="Chain of profiles this one extends (resolved).")
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _engine_version(self) -> Profile:
        if self.engine == "vllm" and self.image.vllm_version is None:
            raise ValueError("engine: vllm needs image.vllm_version (the vLLM release the image carries, e.g. "
                             '"0.32.0": it selects the flag dialect)')
        if self.engine == "vllm" and "base_image" not in self.image.model_fields_set:
            raise ValueError(f"engine: vllm needs image.base_image (the default, {self.image.base_image}, is "
                             "SGLang's): name the vLLM image the engine image builds on")
        if self.engine == "sglang" and self.image.vllm_version is not None:
            raise ValueError(f"image.vllm_version is set ({self.image.vllm_version}) but engine is sglang: set "
                             "engine: vllm, or remove image.vllm_version")
        return self

    def engine_label(self) -> str:
        """The engine and its release as printed, e.g. "vLLM 0.32.0"."""
        return f"{ENGINE_NAMES[self.engine]} {self.engine_version()}"

    def engine_version(self) -> str:
        """The release of the profile's engine (image.sglang_version or image.vllm_version)."""
        return (self.image.vllm_version or "") if self.engine == "vllm" else self.image.sglang_version

    def origin_of(self, key: str) -> str:
        """The file that set a key path (e.g. 'server.kv_cache_dtype'), walking up to the nearest set parent."""
        return origin_of(self._origins, key, self.path)


def profile_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("SPARKCTL_PROFILES_DIR"):
        dirs.append(Path(os.environ["SPARKCTL_PROFILES_DIR"]))
    dirs += search_dirs("profiles")   # ./profiles, ~/.config/sparkctl/profiles, shipped
    seen, out = set(), []
    for d in dirs:
        r = d.resolve()
        if r not in seen:
            seen.add(r)
            out.append(d)
    return out


def find_profile(name: str) -> Path:
    """A profile name (d5) or a path to a YAML file."""
    if name.endswith((".yml", ".yaml")) or os.sep in name:
        return Path(name)
    if not is_plain_name(name):            # a profile's name is a plain name (Profile.name): nothing to look up
        raise ConfigError(f"{name!r} is not a profile name", where="--profile",
                          hint="give a profile name (letters, digits, '.', '-', '_', as `sparkctl profiles` lists "
                               "them) or a path to a .yml file")
    for d in profile_dirs():
        for ext in (".yml", ".yaml"):
            candidate = d / f"{name}{ext}"
            if candidate.is_file():
                return candidate
    known = sorted({p.stem for d in profile_dirs() if d.is_dir() for p in d.glob("*.y*ml")})
    guess = did_you_mean(name, known)
    raise ConfigError(f"no profile named {name!r}", where=", ".join(str(d) for d in profile_dirs()),
                      hint=(f"did you mean '{guess}'? " if guess else "") + f"known profiles: {', '.join(known)}")


def _merge(base: object, over: object, origin: dict[str, str], src: str, path: tuple[Any, ...]) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            here = path + (k,)
            out[k] = _merge(base.get(k), v, origin, src, here) if k in base else _mark(v, origin, src, here)
        return out
    return _mark(over, origin, src, path)


def _mark(value: object, origin: dict[str, str], src: str, path: tuple[Any, ...]) -> Any:
    origin[key_path(path)] = src
    if isinstance(value, dict):
        for k, v in value.items():
            _mark(v, origin, src, path + (k,))
    return value


MAX_EXTENDS_DEPTH = 16   # profiles in one `extends:` chain (the shipped ones use 3)


def _load_raw(path: Path, chain: list[Path], origin: dict[str, str]) -> tuple[JSONObject, list[str]]:
    resolved = path.resolve()
    if resolved in [c.resolve() for c in chain]:
        cycle = " -> ".join(p.stem for p in chain + [path])
        raise ConfigError(f"extends cycle: {cycle}", where=str(chain[-1]),
                          hint="remove one of the 'extends:' links so the chain ends at a base profile")
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise ConfigError(f"extends: chain longer than {MAX_EXTENDS_DEPTH} profiles "
                          f"({' -> '.join(p.stem for p in chain[:3])} -> ... -> {chain[-1].stem} -> {path.stem})",
                          where=str(chain[0]), hint="let the profile extend a base closer to it (profiles nest a "
                          "few levels: d5 -> base)")
    data = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("a profile must be a YAML mapping", where=str(path))
    parent = data.pop("extends", None)
    parents: list[str] = []
    merged: JSONObject = {}
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError("extends: must be one profile name", where=str(path), hint="e.g. extends: base")
        if (path.parent / f"{parent}.yml").is_file():
            parent_path = path.parent / f"{parent}.yml"
        else:
            try:
                parent_path = find_profile(parent)
            except ConfigError as exc:  # name the file holding the `extends:`, not only the directories searched
                raise ConfigError(f"extends: {exc.message} (searched {exc.where})", where=str(path),
                                  hint=exc.hint) from None
        merged, parents = _load_raw(parent_path, chain + [path], origin)
        parents = [parent] + parents
    merged = _merge(merged, data, origin, str(path), ())
    return merged, parents


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_env(env: object, origin: dict[str, str], default: str) -> None:
    """Environment names are POSIX names a profile may set (values.engine_env_key); values are the one-line
    strings as written (the loader reads every `env` value as a string: `010` stays "010", `yes` stays "yes")."""
    if not isinstance(env, dict):
        return  # pydantic reports the wrong type
    for name, value in env.items():
        key = f"env.{name}"
        where = origin_of(origin, key, default)
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise ConfigError(f"env[{str(name)!r}]: not an environment variable name", where=where,
                              hint="use letters, digits and underscores, not starting with a digit (e.g. NCCL_DEBUG)")
        try:
            engine_env_key(name)
        except PydanticCustomError as exc:
            raise ConfigError(f"{key}: {exc.message()}", where=where, hint=(exc.context or {}).get("hint")) from None
        if value is None or isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: needs a single value (got {value!r})", where=where,
                              hint=f'give a string, e.g. {name}: "1" (an empty value is {name}: "")')
        if not isinstance(value, str):
            raise ConfigError(f"{key}: {value!r} is not a string", where=where,
                              hint=f'quote it: {name}: "{value}"')
        bad = next((c for c in ("\n", "\r", "\0") if c in value), None)
        if bad is not None:
            raise ConfigError(f"{key}: value contains {bad!r}", where=where,
                              hint="environment values must be one line without NUL; put multi-line data in a file "
                                   "under /models and pass its path")


def _check_ports(profile: Profile, leaf: str) -> None:
    """api.port and api.dist_port are both bound on rank 0; blame the one the profile itself set (else api.port)."""
    api = profile.api
    if api.port != api.dist_port:
        return
    key = "api.dist_port" if profile.origin_of("api.dist_port") == leaf != profile.origin_of("api.port") \
        else "api.port"
    other = "api.port" if key == "api.dist_port" else "api.dist_port"
    raise ConfigError(f"{key}: {api.port} is also {other} (set in {profile.origin_of(other)}): rank 0 cannot serve "
                      f"HTTP and the rendezvous store on one port", where=profile.origin_of(key),
                      hint="give api.port and api.dist_port different values (defaults: 30000 and 25000)")


def load_profile(name_or_path: str) -> Profile:
    """Load a profile by name or path, resolve `extends:`, validate. Raises ConfigError."""
    path = find_profile(name_or_path)
    origin: dict[str, str] = {}
    raw, parents = _load_raw(path, [], origin)
    raw.update(name=path.stem, path=str(path), extends=parents)
    _check_env(raw.get("env"), origin, str(path))
    try:
        profile = Profile.model_validate(raw)
    except ValidationError as exc:
        raise config_error_from(exc, Profile, str(path), origin=origin) from None
    profile._origins.update(origin)
    _check_ports(profile, str(path))
    return profile


def list_profiles() -> list[tuple[str, str, Path]]:
    """(name, description, path) of every profile found, first directory wins."""
    out: dict[str, tuple[str, str, Path]] = {}
    for d in profile_dirs():
        if not d.is_dir():
            continue
        for p in sorted(d.glob("*.y*ml")):
            if p.stem in out:
                continue
            try:
                data = read_yaml(p) or {}
                desc = str(data.get("description", "")) if isinstance(data, dict) else ""
            except ConfigError as exc:
                desc = f"(unreadable: {exc.message})"
            out[p.stem] = (p.stem, desc, p)
    return sorted(out.values())
