"""The fan-out helper for parallel node work, re-exported for deploy/: it lives in `sparkctl.nodes.fanout` so the
layers below deploy/ (images/, nodes/) use the same one."""
from __future__ import annotations

from sparkctl.nodes.fanout import Outcome, fan_out, raise_first

__all__ = ["Outcome", "fan_out", "raise_first"]
