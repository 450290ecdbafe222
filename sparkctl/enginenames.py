"""The serving engines a profile may name, and how sparkctl prints each (stdlib only: the CLI's entry reads it)."""
from __future__ import annotations

ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}   # a profile's `engine` -> its name in what sparkctl prints
