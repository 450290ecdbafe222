"""SGLang flag dialects: the launch_server flag schema of one SGLang release.

Data under sparkctl/sglang/dialects/<version>.json is generated from the real
released wheels by scripts/gen_dialects.py (never written by hand). A Dialect
answers: does this version have a flag for setting X, how is it spelled, what
values may it take, is it deprecated. `argparser()` rebuilds an argparse parser
from the schema (used by the emulator to accept exactly SGLang's argv).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from sparkctl.enginenames import ENGINE_NAMES
from sparkctl.errors import ConfigError

DEFAULT_VERSION = "0.5.23"

# Settings that were spelled differently before: canonical (0.5.23) dest -> older dests, tried in order.
RENAMED_DESTS: dict[str, tuple[str, ...]] = {
    "dsa_prefill_backend": ("nsa_prefill_backend", "nsa_prefill"),   # 0.5.10-0.5.15, then 0.5.3.post3
    "dsa_decode_backend": ("nsa_decode_backend", "nsa_decode"),
    "tp_size": ("tensor_parallel_size",),                           # 0.5.3.post3's dest for --tp-size
    "dp_size": ("data_parallel_size",),
}


# A flag is secret when its dest's last word says so and it takes a string: api_key, admin_api_key,
# ssl_keyfile_password. A word anywhere else (max_total_tokens, speculative_token_map, a numeric *_per_token) is not.
SECRET_WORDS = frozenset({"key", "password", "passwd", "token", "secret"})


@dataclass(frozen=True)
class Flag:
    options: tuple[str, ...]
    dest: str
    kind: str                     # value | store_true | store_false | list
    type: str | None
    choices: tuple[str, ...] | None
    default: Any
    deprecated: bool
    deprecation_message: str | None
    help: str

    @property
    def secret(self) -> bool:
        """Its value is a credential (redacted everywhere, passed in the secrets --config file)."""
        return (self.kind in ("value", "list") and self.type in (None, "str")   # vLLM's --api-key takes a list
                and self.dest.rsplit("_", 1)[-1] in SECRET_WORDS)

    @property
    def option(self) -> str:
        """Preferred spelling: the long option named like the dest (--tp-size), else the first long option."""
        longs = [o for o in self.options if o.startswith("--")]
        return longs[0] if longs else self.options[0]

    def option_for(self, canonical: str) -> str:
        """The spelling of this flag for a canonical setting name: `--tp-size` rather than `--tensor-parallel-size`."""
        named = "--" + canonical.replace("_", "-")
        return named if named in self.options else self.option


@dataclass(frozen=True)
class Dialect:
    version: str
    flags: tuple[Flag, ...]
    notes: tuple[str, ...] = ()
    # Names SGLang's SpeculativeAlgorithm accepts (enum members and aliases such as NEXTN, from the wheel's
    # speculative/spec_info.py); None for a schema generated before they were recorded.
    speculative_algorithms: tuple[str, ...] | None = None
    # What SGLang raises at start-up for any other name ("ValueError: Unknown speculative algorithm name: {name}"),
    # None where argparse choices refuse it first.
    speculative_unknown_error: str | None = None
    _by_dest: dict[str, Flag] = field(default_factory=dict, compare=False, repr=False)
    _by_option: dict[str, Flag] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for f in self.flags:
            self._by_dest.setdefault(f.dest, f)
            for o in f.options:
                self._by_option[o] = f

    def flag(self, dest: str) -> Flag | None:
        """The flag for a canonical (0.5.23) setting name in this version's spelling, or None."""
        if dest in self._by_dest:
            return self._by_dest[dest]
        for old in RENAMED_DESTS.get(dest, ()):
            if old in self._by_dest:
                return self._by_dest[old]
        return None

    def option(self, option: str) -> Flag | None:
        """The flag an option string (`--tp-size`) belongs to, or None if this version has no such option."""
        return self._by_option.get(option)

    def secret_options(self) -> frozenset[str]:
        """Every spelling of every secret flag of this version (--api-key, --admin-api-key ...)."""
        return frozenset(o for f in self.flags if f.secret for o in f.options)

    def argparser(self, prog: str = "launch_server.py") -> argparse.ArgumentParser:
        """An argparse parser accepting exactly this version's launch_server flags."""
        parser = argparse.ArgumentParser(prog=prog)  # abbreviations on, as in SGLang (unique prefixes accepted)
        for f in self.flags:
            kwargs: dict[str, Any] = {"dest": f.dest, "help": f.help or None, "default": f.default}
            if f.kind == "store_true":
                kwargs["action"] = "store_true"
            elif f.kind == "store_false":
                kwargs["action"] = "store_false"
            else:
                conv = {"int": int, "float": float}.get(f.type or "", str)
                kwargs["type"] = conv
                if f.choices:
                    kwargs["choices"] = [conv(c) if conv is not str else c for c in f.choices] \
                        if all(_convertible(conv, c) for c in f.choices) else list(f.choices)
                if f.kind == "list":
                    kwargs["nargs"] = "+"
            try:
                parser.add_argument(*f.options, **kwargs)
            except argparse.ArgumentError:
                continue  # an option registered twice in the schema: keep the first
        return parser


def _convertible(conv: Any, value: object) -> bool:
    try:
        conv(value)
        return True
    except (TypeError, ValueError):
        return False


def available_versions(engine: str = "sglang") -> list[str]:
    root = resources.files(f"sparkctl.{engine}") / "dialects"
    if not root.is_dir():
        return []
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))


@cache
def load_dialect(version: str = DEFAULT_VERSION, engine: str = "sglang") -> Dialect:
    """The dialect of an engine's version (sparkctl/<engine>/dialects/<version>.json, from that release's own
    parser); ConfigError if sparkctl has no schema for it."""
    root = resources.files(f"sparkctl.{engine}") / "dialects"
    path = root / f"{version}.json"
    if not path.is_file():
        known = available_versions(engine)
        raise ConfigError(f"no flag schema for {ENGINE_NAMES[engine]} {version}", where=f"image.{engine}_version",
                          hint=f"use one of: {', '.join(known)} (or generate one with scripts/gen_dialects.py)")
    data = json.loads(path.read_text(encoding="utf-8"))
    flags = tuple(
        Flag(options=tuple(d["options"]), dest=d["dest"], kind=d.get("kind", "value"), type=d.get("type"),
             choices=tuple(str(c) for c in d["choices"]) if d.get("choices") is not None else None,
             default=d.get("default"), deprecated=bool(d.get("deprecated")),
             deprecation_message=d.get("deprecation_message"), help=d.get("help") or "")
        for d in data["flags"])
    algorithms = data.get("speculative_algorithms")
    return Dialect(version=data["version"], flags=flags, notes=tuple(data.get("notes") or ()),
                   speculative_algorithms=tuple(algorithms["names"]) if algorithms else None,
                   speculative_unknown_error=(algorithms or {}).get("unknown_error"))
