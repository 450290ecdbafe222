"""Each engine's ``--config FILE``: the YAML's keys merged into argv before parsing, as the engine does it (the
emulator's one place reading an engine's config file; `merge_vllm_config` at the end is vLLM's).

SGLang's ``--config FILE.yaml``:

A port of ``ConfigArgumentMerger`` (``sglang/srt/utils/server_args_config_parser.py`` in 0.5.23;
``sglang/srt/server_args_config_parser.py`` in 0.5.3.post3 and 0.5.11), called by ``prepare_server_args`` when
``--config`` is in argv: each key becomes ``--KEY`` verbatim (so ``tp_size: 4`` is ``--tp_size``, which argparse
rejects, as SGLang does); ``true`` adds a store_true flag, ``false`` skips it; lists become ``--key v1 v2``;
scalars ``--key str(value)``; a key of an action other than store/store_true (e.g. store_false) is refused. The config's
arguments go first and ``--config FILE`` is removed, so a flag on the command line wins. Errors are SGLang's
ValueErrors (missing file, not .yaml/.yml, a root that is not a mapping, two ``--config``), raised from
``launch_server.py`` before anything starts: a traceback on stderr and exit 1.

sparkctl uses it to hand the engine its API key from a 0400 file instead of argv (``sparkctl.sglang.render``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from sparkctl.sim.failures import launcher_value_error


class ConfigFileError(ValueError):
    """What SGLang's merger raises; ``traceback`` is the launcher's stderr for it."""

    @property
    def traceback(self) -> str:
        return launcher_value_error(str(self))


def _keys(action: argparse.Action) -> set[str]:
    return {action.dest} | {o[2:].replace("-", "_") for o in action.option_strings if o.startswith("--")}


def merge_config_args(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with the ``--config`` file's settings merged in (unchanged when there is no ``--config``)."""
    where = [i for i, a in enumerate(argv) if a == "--config"]
    if not where:
        return argv
    if len(where) > 1:
        raise ConfigFileError("Multiple config files specified! Only one allowed.")
    i = where[0]
    if i == len(argv) - 1:
        raise ConfigFileError("No config file specified after --config flag!")
    path = Path(argv[i + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigFileError(f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise ConfigFileError(f"Config file not found: {argv[i + 1]}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigFileError("Config file must contain a dictionary at root level")
    store_true = {k for a in parser._actions if isinstance(a, argparse._StoreTrueAction) for k in _keys(a)}
    supported = [a for a in parser._actions if isinstance(a, (argparse._StoreTrueAction, argparse._StoreAction))
                 or a.nargs is None]
    supported_keys = {k for a in supported for k in _keys(a)}
    exempt = {"--config", "--help", "-h"}
    unsupported = {k: a for a in parser._actions
                   if a.option_strings and a not in supported and not exempt & set(a.option_strings)
                   for k in _keys(a) if k not in supported_keys}
    out: list[str] = []
    for key, value in data.items():
        norm = str(key).replace("-", "_")
        if norm in unsupported:     # e.g. a store_false flag
            raise ConfigFileError(f"Unsupported config option '{norm}' with action "
                                  f"'{unsupported[norm].__class__.__name__}'")
        if isinstance(value, bool):
            if str(key).replace("-", "_") in store_true:
                out += [f"--{key}"] if value else []
            else:
                out += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            out += [f"--{key}", *(str(v) for v in value)] if value else []
        elif isinstance(value, dict):
            out += [f"--{key}", json.dumps(value)]
        else:
            out += [f"--{key}", str(value)]
    return out + argv[:i] + argv[i + 2:]


class VllmConfigFileError(ValueError):
    """What vLLM's config-file merge raises (a missing file, a root that is not a mapping)."""


def merge_vllm_config(argv: list[str]) -> list[str]:
    """``argv`` with ``--config FILE``'s keys as flags, right after the model (vLLM's ``_pull_args_from_config``,
    vllm/utils/argparse_utils.py: the command line, later, wins); ``true`` adds the flag, ``false`` drops it, a list
    gives one flag with every value."""
    if "--config" not in argv:
        return argv
    i = argv.index("--config")
    if i == len(argv) - 1:
        raise VllmConfigFileError("No config file specified! Please check your command-line arguments.")
    path = Path(argv[i + 1])
    if not path.is_file():
        raise VllmConfigFileError(f"Config file not found: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise VllmConfigFileError(f"Config file {path} must contain a mapping")
    pulled: list[str] = []
    for key, value in data.items():
        flag = f"--{str(key).replace('_', '-')}"
        if value is True:
            pulled.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            pulled += [flag, *(str(v) for v in value)]
        elif isinstance(value, dict):
            pulled += [flag, json.dumps(value)]
        else:
            pulled += [flag, str(value)]
    rest = argv[:i] + argv[i + 2:]
    head = rest[:1] if rest and not rest[0].startswith("-") else []
    return head + pulled + rest[len(head):]
