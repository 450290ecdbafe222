"""Read-only commands: render, profiles, schema."""
from __future__ import annotations

import sys

import typer

from sparkctl.cli import bounds
from sparkctl.cli.options import flag
from sparkctl.errors import ConfigError
from sparkctl.jsontypes import JSONObject


def register(app: typer.Typer) -> None:
    app.command()(render)
    app.command()(profiles)
    app.command()(schema)


def render(profile: str = typer.Option(..., "--profile", "-p", help="Profile name (profiles/NAME.yml) or path."),
           inventory: str | None = typer.Option(None, "--inventory", "-i", help="Ansible inventory file."),
           rank: int | None = typer.Option(None, "--rank", parser=bounds.count(0, 1023, what="a rank"),
                                               metavar="N", help="Only this rank (replicated: of every replica, "
                                                                 "or of --replica I)."),
           replica: int | None = typer.Option(None, "--replica", parser=bounds.count(0, 1023, what="a replica"),
                                                 metavar="I", help="Replicated profile (replicas: K): only "
                                                                   "replica I's ranks."),
           as_json: bool = flag("--json", help="Print JSON on stdout.")) -> None:
    """Print the exact argv and env of every rank (a replicated profile: of every replica's ranks, and the
    router's argv); nothing is started. Secrets print as ***."""
    from sparkctl.config.inventory import resolve_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy.runtimes import embedded_notice
    from sparkctl.engines import render as do_render

    inv = resolve_inventory(inventory)
    prof = load_profile(profile)
    if prof.replicas > 1:            # each replica on its own nodes, the router in front (router/replicas.py)
        from sparkctl.router.replicas import replicated_render
        doc = replicated_render(prof, inv, replica=replica, rank=rank)
        _notices(embedded_notice(inv), doc["warnings"])
        if as_json:
            from sparkctl.cli.outputs import RenderReplicatedOutput, emit
            emit(RenderReplicatedOutput, doc)
            return
        for rep in doc["replicas"]:
            print(f"## replica {rep['index']} on {', '.join(rep['nodes'])}: {rep['url']}")
            _print_ranks(rep["ranks"], prof.engine_label())
        if replica is None and rank is None:
            r = doc["router"]
            print(f"## router on {r['node']}: {r['url']} ({r['policy']}; {r['runs']})")
            print(" ".join(_quote(a) for a in r["argv"]))
        return
    if replica is not None:
        raise ConfigError(f"--replica {replica}: profile {prof.name} is one TP group (no replicas: K, no router)",
                          where=prof.origin_of("replicas"),
                          hint=f"sparkctl render --profile {prof.name} --rank N shows one of its ranks")
    result = do_render(prof, inv)
    if rank is not None and not any(s.rank == rank for s in result.specs):
        raise ConfigError(f"--rank {rank}: the inventory has ranks 0..{len(result.specs) - 1}", where=inv.path)
    _notices(embedded_notice(inv), result.warnings)
    if as_json:
        from sparkctl.cli.outputs import RenderOutput, emit
        emit(RenderOutput, result.to_json(rank))
        return
    _print_ranks(result.to_json(rank)["ranks"], prof.engine_label())


def profiles(inventory: str | None = typer.Option(None, "--inventory", "-i", help="Ansible inventory file "
                                                     "each profile is checked against (default: see README)."),
             as_json: bool = flag("--json", help="Print JSON on stdout.")) -> None:
    """List the profiles (yours first: ./profiles, ~/.config/sparkctl/profiles, then the shipped ones) with
    their descriptions, and whether each renders on the inventory's cluster."""
    from sparkctl.config.inventory import resolve_inventory
    from sparkctl.config.profile import list_profiles, load_profile
    from sparkctl.engines import render as do_render

    inv = resolve_inventory(inventory)
    rows = []
    for name, desc, path in list_profiles():
        try:
            prof = load_profile(str(path))
            if prof.replicas > 1:        # its replicas and the router in front, as `render` shows them
                from sparkctl.router.replicas import render_replicas, router_spec
                router_spec(prof, inv, render_replicas(prof, inv))
            else:
                do_render(prof, inv)
            problem = None
        except ConfigError as exc:
            problem = exc.render().splitlines()[0]
        rows.append({"name": name, "description": desc, "path": str(path), "renders": problem is None,
                     "problem": problem})
    if as_json:
        from sparkctl.cli.outputs import ProfilesOutput, emit
        emit(ProfilesOutput, {"inventory": inv.path, "emulated": inv.emulated, "profiles": rows})
        return
    for r in rows:
        print(f"{r['name']:<16} {r['description']}" + (f"\n{'':<16} does not render on {inv.cluster.name}: "
                                                       f"{r['problem']}" if r["problem"] else ""))


def schema(kind: str = typer.Argument(..., help="profile | inventory | the name of a command's --json output "
                                                "(sparkctl schema list names them)")) -> None:
    """Print a JSON Schema: of the profile or inventory format (for editors), or of a command's --json output."""
    from sparkctl.cli.outputs import json_schema, schema_names
    if kind == "list":
        print("\n".join(schema_names()))
        return
    from sparkctl.cli.outputs import print_json
    print_json(json_schema(kind))


def _notices(notice: str | None, warnings: list[str]) -> None:
    if notice:
        print(f"sparkctl: {notice}", file=sys.stderr)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)


def _print_ranks(ranks: list[JSONObject], engine: str) -> None:
    for r in ranks:
        print(f"# rank {r['rank']} on {r['node']} ({engine})")
        for k, v in r["env"].items():
            print(f"{k}={v}")
        print(" ".join(_quote(a) for a in r["argv"]))
        print()


def _quote(arg: str) -> str:
    import shlex
    return shlex.quote(arg)
