"""The serving engines behind one lifecycle: a profile's `engine` (sglang, the default, or vllm) picks the package
that spells its flags, reads its log and names its metrics (`sparkctl.sglang`, `sparkctl.vllm`). Everything above
this layer asks here, and never spells an engine's flags itself.

    result = render(load_profile("cpu-tiny-vllm"), resolve_inventory("inventory/local-vllm.yml"))
    result.specs[0].argv   # ['python3', '-m', 'vllm.entrypoints.cli.main', 'serve', '/models/target', ...]
"""
from __future__ import annotations

from collections.abc import Mapping

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.errors import ConfigError
from sparkctl.sglang import render as sglang_render
from sparkctl.sglang.render import RenderResult
from sparkctl.vllm import render as vllm_render

__all__ = ["RenderResult", "render"]


def check_runs(profile: Profile, inventory: Inventory) -> None:
    """The inventory's process runtime runs the profile's engine: the emulator speaks SGLang's argv only, a real
    engine's environment (sparkctl_engine) holds one engine. Docker nodes run what their image holds."""
    runs = inventory.cluster.engine
    if not any(n.runtime == "process" for n in inventory.nodes) or runs == profile.engine or \
            (runs == "emulator" and profile.engine == "sglang"):
        return
    what = "sparkctl's emulator (it speaks SGLang's flags only)" if runs == "emulator" else f"real {runs}"
    other = "sglang" if runs == "emulator" else runs
    raise ConfigError(f"engine: {profile.engine}: the inventory's process runtime runs {what}",
                      where=profile.origin_of("engine"),
                      hint=f"use an inventory whose sparkctl_engine is {profile.engine} (e.g. inventory/local-"
                           f"{profile.engine}.yml), or a profile with engine: {other}")


def render(profile: Profile, inventory: Inventory, *, environ: Mapping[str, str] | None = None) -> RenderResult:
    """Every rank's LaunchSpec in the profile's engine's spelling (ConfigError for what it refuses)."""
    check_runs(profile, inventory)
    if profile.engine == "vllm":
        return vllm_render.render(profile, inventory, environ=environ)
    return sglang_render.render(profile, inventory, environ=environ)
