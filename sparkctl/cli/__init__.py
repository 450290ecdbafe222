"""The `sparkctl` command line (main.py). Importing it installs one import finder for the command's process
(`WithoutHttpxCLI`), before any command module can import httpx."""
from __future__ import annotations

import sys


class WithoutHttpxCLI:
    """An import finder that refuses one module: httpx's command-line client (``httpx._main``).

    ``import httpx`` tries it and goes on without it when it cannot be imported; where click is installed (beside
    black or uvicorn, say) it imports click, rich and pygments for a command line sparkctl never runs: 17 % of the
    `up` path's import time, measured with ``python -X importtime`` (httpx._main 888 of 5,330 ms summed, on a loaded
    machine; about 0.09 s quiet). Installed with the command line (``sparkctl.cli``), never by the library's own
    modules, so a program that uses sparkctl as a library keeps httpx's CLI."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "httpx._main":
            raise ImportError("httpx's command line: not used by sparkctl")


if not any(isinstance(f, WithoutHttpxCLI) for f in sys.meta_path):
    sys.meta_path.insert(0, WithoutHttpxCLI())
