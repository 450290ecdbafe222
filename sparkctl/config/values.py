"""One value policy for every field of a profile and an inventory.

Each field of the config models is one of the annotated types below (tests/unit/test_config.py checks that no
field escapes): strict types (a boolean is never a number, a number never a string, nothing is coerced), bounded
numbers, one-line text without control characters, and the domain rules of what a value becomes on a node:

- engine and host paths: absolute, normalised, no `..` segment, no leading `-`; models under /models;
- network interface names by Linux's dev_valid_name (1-15 bytes, not `.`/`..`, no `/`, `:` or whitespace);
- SSH hosts and users without a leading `-` (ssh would read an option) or whitespace;
- image references by the OCI distribution reference grammar (github.com/distribution/reference);
- environment names: POSIX names, minus loader/interpreter variables and those sparkctl sets itself.

A failed rule raises `refusal(message, hint)`: config_error_from turns it into one ConfigError naming file and key.
"""
from __future__ import annotations

import math
import posixpath
import re
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, Strict, StrictBool, StrictFloat, StrictInt, StrictStr
from pydantic_core import PydanticCustomError, core_schema

from sparkctl.config.limits import INT_MAX, SECONDS_MAX
from sparkctl.config.loader import refusal


@dataclass(frozen=True)
class Policy:
    """Marks an annotated type as part of the value policy (the schema test looks for it)."""
    name: str


@dataclass(frozen=True)
class Bound:
    """A policy type's own bound, checked after (and besides) the field's.

    Not `Field(ge=..., le=..., max_length=...)` on the type: pydantic keeps one Ge/Le/MaxLen per schema and the
    type's metadata comes after the field's, so a type-level `ge=0` silently replaced a field's `ge=1`
    (`replicas: 0`, `tp_size: 0` and `gpus: 65` were accepted). A field narrows its type with its own
    `Field(ge=..., le=..., max_length=...)`; this bound still holds (tests/unit/test_value_bounds.py checks both
    for every field)."""
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    max_length: int | None = None

    def __get_pydantic_core_schema__(self, source: object, handler: Any) -> Any:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema: object, handler: Any) -> Any:
        js = handler(schema)
        for key, value in (("minimum", self.ge), ("exclusiveMinimum", self.gt), ("maximum", self.le),
                           ("maxLength", self.max_length)):
            if value is not None and key not in js:
                js[key] = value
        return js

    def _check(self, value: Any) -> Any:
        if isinstance(value, str):
            if self.max_length is not None and len(value) > self.max_length:
                raise PydanticCustomError("string_too_long", "String should have at most {max_length} characters",
                                          {"max_length": self.max_length})
            return value
        if self.ge is not None and value < self.ge:
            raise PydanticCustomError("greater_than_equal", "Input should be greater than or equal to {ge}",
                                      {"ge": _num(self.ge)})
        if self.gt is not None and value <= self.gt:
            raise PydanticCustomError("greater_than", "Input should be greater than {gt}", {"gt": _num(self.gt)})
        if self.le is not None and value > self.le:
            raise PydanticCustomError("less_than_equal", "Input should be less than or equal to {le}",
                                      {"le": _num(self.le)})
        return value


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def _char(text: str, pattern: re.Pattern[str]) -> str | None:
    m = pattern.search(text)
    return None if m is None else repr(m.group(0))


def _one_line(value: str) -> str:
    bad = _char(value, _CONTROL)
    if bad:
        raise refusal(f"contains the control character {bad}", "write it on one line without control characters")
    return value


def _prose(value: str) -> str:
    bad = _char(value, _CONTROL_BUT_NEWLINE)
    if bad:
        raise refusal(f"contains the control character {bad}", "remove it (newlines and tabs are fine here)")
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise refusal(f"{value!r} is not a finite number", "give a number such as 60 or 0.5")
    return value


def _no_dash(value: str) -> str:
    if value.startswith("-"):
        raise refusal(f"{value!r} starts with '-' (a program would read it as an option)",
                      "remove the leading '-'")
    return value


def _word(value: str) -> str:
    """Non-empty, one token: no whitespace, no leading '-' (it lands in argv or an ssh destination)."""
    _one_line(value)
    if not value:
        raise refusal("is empty", "give a value, or remove the key")
    if re.search(r"\s", value):
        raise refusal(f"{value!r} contains whitespace", "give one word without spaces")
    return _no_dash(value)


def _arg_value(value: str) -> str:
    """Non-empty one-line text that argparse reads as a value, not as an option (no leading '-')."""
    _one_line(value)
    if not value.strip():
        raise refusal("is empty", "give a value, or remove the key")
    return _no_dash(value)


def _path(value: str, *, root: str | None = None, tilde: bool = False) -> str:
    _one_line(value)
    if not value:
        raise refusal("is empty", "give an absolute path, e.g. /models/NAME")
    _no_dash(value)
    body = value[1:] if tilde and value.startswith("~/") else value
    if not body.startswith("/"):
        raise refusal(f"{value!r} is not an absolute path",
                      "give an absolute path starting with '/'" + (" (or ~/...)" if tilde else ""))
    if ".." in body.split("/"):
        raise refusal(f"{value!r} has a '..' segment", "give the path without '..' (resolve it yourself)")
    norm = posixpath.normpath(body)
    if norm.startswith("//"):
        norm = norm[1:]
    if norm != body.rstrip("/") and body != "/":
        raise refusal(f"{value!r} is not normalised (it means {norm!r})", f"write it as {norm!r}")
    if root is not None and not norm.startswith(root.rstrip("/") + "/"):
        raise refusal(f"{value!r} is not under {root}", f"give a path under {root}/ (each node's "
                      "host_paths.models appears there in the engine)")
    return value


def _engine_model_path(value: str) -> str:
    return _path(value, root="/models")


def _host_path(value: str) -> str:
    """A directory on a node; ``~/`` (the home of the user sparkctl runs as) only for process-runtime nodes
    (the inventory refuses it on a docker node: `docker run -v` needs an absolute host path)."""
    return _path(value, tilde=True)


def _local_path(value: str) -> str:
    return _path(value, tilde=True)


def _ifname(value: str) -> str:
    """Linux dev_valid_name(): 1..15 bytes (IFNAMSIZ - 1), not '.' or '..', no '/', ':' or whitespace."""
    _one_line(value)
    size = len(value.encode("utf-8"))
    if not 1 <= size <= 15:
        raise refusal(f"{value!r} is {size} bytes: Linux interface names are 1-15 bytes",
                      "give the netdev name as `ip link` shows it, e.g. enp1s0f0np0")
    if value in (".", "..") or re.search(r"[/:\s]", value):
        raise refusal(f"{value!r} is not a Linux interface name (no '/', ':' or whitespace; not '.' or '..')",
                      "give the netdev name as `ip link` shows it, e.g. enp1s0f0np0")
    if "," in value:
        raise refusal(f"{value!r} contains ',' (NCCL reads its *_SOCKET_IFNAME as a comma list)",
                      "give one interface name")
    return _no_dash(value)


def _hca(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", value):
        raise refusal(f"{value!r} is not an RDMA device name", "give the HCA name as `ibv_devices` shows it, "
                      "e.g. rocep1s0f0")
    return value


# OCI distribution reference grammar (distribution/reference/regexp.go).
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::{_TAG})?(?:@{_DIGEST})?")


def image_reference(value: str) -> str:
    """An OCI image reference: [domain/]path[:tag][@digest], lowercase repository, name at most 255 characters."""
    _one_line(value)
    m = _REFERENCE.fullmatch(value)
    if m is None or len(m.group("name")) > 255:
        lower = value.lower() != value and _REFERENCE.fullmatch(value.lower())
        raise refusal(f"{value!r} is not an image reference", "write it as [registry/]repository[:tag][@digest] "
                      "with a lowercase repository, e.g. lmsysorg/sglang:v0.5.23"
                      + (f" (did you mean {value.lower()!r}?)" if lower else ""))
    return value


def _version(value: str) -> str:
    if not re.fullmatch(r"[0-9]+(?:\.[0-9A-Za-z]+){1,4}", value):
        raise refusal(f"{value!r} is not a release version (digits and dots)",
                      'quote it as a string, e.g. "0.5.23" or "0.32.0"')
    return value


def _plain_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", value) or ".." in value:
        raise refusal(f"{value!r} is not a plain name", "use letters, digits, '.', '-' and '_' (no '/', '..', "
                      "spaces or leading '-'), e.g. gb10-0.5.23")
    return value


def _platform(value: str) -> str:
    if not re.fullmatch(r"[a-z0-9]+/[a-z0-9_]+(?:/[a-z0-9]+)?", value):
        raise refusal(f"{value!r} is not an image platform", "write it as os/arch[/variant], e.g. linux/arm64")
    return value


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables that load code into a process before (or instead of) what it runs: never from a profile.
LOADER_VARIABLES = ("LD_*", "PYTHON*", "PATH", "DYLD_*", "BASH_ENV", "ENV", "IFS", "SHELLOPTS", "PS4", "PERL5LIB",
                    "PERL5OPT", "PERLLIB", "RUBYLIB", "RUBYOPT", "NODE_OPTIONS", "NODE_PATH", "GCONV_PATH",
                    "HOSTALIASES", "LOCALDOMAIN", "RES_OPTIONS", "MALLOC_*", "GLIBC_TUNABLES")
# Variables sparkctl sets per rank or for its secrets, and where their value comes from instead.
SPARKCTL_SETS = {
    "SGLANG_HOST_IP": "the inventory's fabric_address", "NCCL_SOCKET_IFNAME": "the inventory's fabric_interface",
    "GLOO_SOCKET_IFNAME": "the inventory's fabric_interface", "TP_SOCKET_IFNAME": "the inventory's fabric_interface",
    "NCCL_IB_HCA": "the inventory's roce_hcas", "HF_TOKEN_PATH": "api.hf_token_env (sparkctl writes the token file)",
    "HF_TOKEN": "api.hf_token_env (the token is passed in a file, never in env)",
    "HUGGING_FACE_HUB_TOKEN": "api.hf_token_env (the token is passed in a file, never in env)",
    "SGLANG_API_KEY": "api.api_key_env (the key is passed in a file, never in env)",
    "VLLM_HOST_IP": "the inventory's fabric_address",
    "VLLM_API_KEY": "api.api_key_env (the key is passed in a file, never in env)",
}


def _loader_variable(name: str) -> str | None:
    for pattern in LOADER_VARIABLES:
        if name == pattern or (pattern.endswith("*") and name.startswith(pattern[:-1])):
            return pattern
    return None


def env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise refusal(f"{value!r} is not an environment variable name",
                      "use letters, digits and underscores, not starting with a digit (e.g. NCCL_DEBUG)")
    return value


def engine_env_key(value: str) -> str:
    """A variable a profile may set for the engine."""
    env_name(value)
    pattern = _loader_variable(value)
    if pattern:
        raise refusal(f"{value} is a loader/interpreter variable ({pattern}): it would run code before the engine",
                      "remove it; put code changes in a patch series (patches/) that the image build applies")
    if value in SPARKCTL_SETS:
        raise refusal(f"{value} is set by sparkctl", f"remove it: sparkctl sets it from {SPARKCTL_SETS[value]}")
    return value


def _arg_token(value: str) -> str:
    _one_line(value)
    if not value:
        raise refusal("is an empty argument", "remove it")
    return value


Int = Annotated[StrictInt, Bound(le=INT_MAX, ge=-INT_MAX), Policy("int")]
Count = Annotated[StrictInt, Bound(ge=0, le=INT_MAX), Policy("count")]
Port = Annotated[StrictInt, Bound(ge=1, le=65535), Policy("port")]
Number = Annotated[float, Strict(), AfterValidator(_finite), Policy("number")]
Seconds = Annotated[float, Strict(), AfterValidator(_finite), Bound(gt=0, le=SECONDS_MAX), Policy("seconds")]
Flag = Annotated[StrictBool, Policy("bool")]
Text = Annotated[StrictStr, Bound(max_length=4096), AfterValidator(_one_line), Policy("text")]
Prose = Annotated[StrictStr, Bound(max_length=65536), AfterValidator(_prose), Policy("prose")]
ArgValue = Annotated[StrictStr, Bound(max_length=255), AfterValidator(_arg_value), Policy("arg-value")]
Word = Annotated[StrictStr, Bound(max_length=255), AfterValidator(_word), Policy("word")]
SshHost = Annotated[StrictStr, Bound(max_length=253), AfterValidator(_word), Policy("ssh-host")]
SshUser = Annotated[StrictStr, Bound(max_length=32), AfterValidator(_word), Policy("ssh-user")]
ModelPath = Annotated[StrictStr, Bound(max_length=4096), AfterValidator(_engine_model_path), Policy("model-path")]
HostPath = Annotated[StrictStr, Bound(max_length=4096), AfterValidator(_host_path), Policy("host-path")]
LocalPath = Annotated[StrictStr, Bound(max_length=4096), AfterValidator(_local_path), Policy("local-path")]
IfName = Annotated[StrictStr, AfterValidator(_ifname), Policy("ifname")]
HcaName = Annotated[StrictStr, AfterValidator(_hca), Policy("hca")]
ImageRef = Annotated[StrictStr, Bound(max_length=512), AfterValidator(image_reference), Policy("image-ref")]
Version = Annotated[StrictStr, AfterValidator(_version), Policy("version")]
PlainName = Annotated[StrictStr, AfterValidator(_plain_name), Policy("plain-name")]
Platform = Annotated[StrictStr, AfterValidator(_platform), Policy("platform")]
EnvName = Annotated[StrictStr, AfterValidator(env_name), Policy("env-name")]
EngineEnvKey = Annotated[StrictStr, AfterValidator(engine_env_key), Policy("engine-env-key")]
EnvValue = Annotated[StrictStr, Bound(max_length=32768), AfterValidator(_one_line), Policy("env-value")]
ArgToken = Annotated[StrictStr, Bound(max_length=4096), AfterValidator(_arg_token), Policy("arg")]
SimValue = Annotated[StrictInt | StrictFloat | StrictStr | StrictBool, Policy("sim-knob")]


_Names = TypeVar("_Names")
# A closed set of names (strict: only these strings): ``Choice[Literal["ssh", "local"]]``. A generic alias (not a
# function building the type) so that the type checker sees the Literal too.
Choice = Annotated[_Names, Policy("choice")]


def policy_of(annotation: object) -> str | None:
    """The policy name an annotated type carries, or None (used by the schema coverage test)."""
    for meta in getattr(annotation, "__metadata__", ()) or ():
        if isinstance(meta, Policy):
            return meta.name
    return None
