"""Image pipeline commands: `patches check`, `image plan|build|ls|verify|prune` (thin; the work is in sparkctl.images)."""
from __future__ import annotations

import json
import sys
from typing import Optional

import typer

patches_app = typer.Typer(no_args_is_help=True, help="GB10 patch series (patches/<series>/).")
image_app = typer.Typer(no_args_is_help=True, help="Engine and launch images: plan, build, list, verify, prune.")


def register(app: typer.Typer) -> None:
    app.add_typer(patches_app, name="patches")
    app.add_typer(image_app, name="image")


@patches_app.command("check")
def patches_check(series: Optional[str] = typer.Option(None, "--series", "-s", help="One series (default: all)."),
                  profile: Optional[str] = typer.Option(None, "--profile", "-p",
                                                        help="Check the profile's series against its SGLang version."),
                  as_json: bool = typer.Option(False, "--json", help="Print JSON on stdout.")) -> None:
    """Apply every patch to the released SGLang wheel of the series' version (cached); report each patch."""
    from sparkctl.errors import ConfigError
    from sparkctl.images.series import check_series, list_series

    expect = None
    if profile is not None:
        from sparkctl.config.profile import load_profile
        prof = load_profile(profile)
        if not prof.image.patch_series and series is None:
            raise ConfigError(f"profile {prof.name} names no patch series", where=prof.origin_of("image.patch_series"),
                              hint="set image.patch_series, or pass --series")
        series = series or prof.image.patch_series
        expect = prof.image.sglang_version
    names = [series] if series else list_series()
    if not names:
        raise ConfigError("no patch series under patches/", hint="add patches/<series>/series")
    reports = [check_series(n, expect_version=expect) for n in names]
    if as_json:
        print(json.dumps([r.to_json() for r in reports], indent=2))
    else:
        for r in reports:
            print("\n".join(r.lines()))
    for r in reports:
        if not r.ok:
            if as_json:
                print(f"sparkctl: patch series {r.series.name} does not apply", file=sys.stderr)
            r.raise_for_failure()
