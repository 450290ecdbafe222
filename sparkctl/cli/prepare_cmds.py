"""Host preparation commands: `sparkctl prepare` (Ansible playbooks) and `sparkctl facts` (read-only)."""
from __future__ import annotations

import difflib
import getpass
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import typer

from sparkctl.cli.options import flag
from sparkctl.jsontypes import JSONObject

if TYPE_CHECKING:
    from sparkctl.config.inventory import Inventory
    from sparkctl.prepare.runner import TaskResult

INVENTORY_OPT = typer.Option(None, "--inventory", "-i", help="Ansible inventory file (default: see README).")


def _inventory(inventory: str | None) -> Inventory:
    from sparkctl.config.inventory import resolve_inventory
    return resolve_inventory(inventory)


def _progress(check: bool) -> Callable[[TaskResult], None]:
    """Per-host progress on stderr: every change (with its diff in check mode), failure and unreachable host."""
    def show(r: TaskResult) -> None:
        if "item" in r.res and r.status != "failed":
            return                                   # the loop's summary event follows
        if r.status == "changed":
            print(f"[{r.host}] {'would change' if check else 'changed'}: {r.task}", file=sys.stderr)
            for d in (r.res.get("diff") or []) if check else []:
                if isinstance(d, dict) and isinstance(d.get("before"), str) and isinstance(d.get("after"), str):
                    lines = difflib.unified_diff(d["before"].splitlines(), d["after"].splitlines(),
                                                 d.get("before_header", "before"), d.get("after_header", "after"),
                                                 lineterm="", n=1)
                    for ln in list(lines)[:40]:
                        print(f"[{r.host}]     {ln}", file=sys.stderr)
        elif r.status in ("failed", "unreachable") and not r.ignored:
            first = r.message.splitlines()[0] if r.message else r.status
            print(f"[{r.host}] {r.status.upper()}: {r.task}: {first}", file=sys.stderr)
    return show


def _fabric_address(fab: JSONObject) -> str:
    """The inventory's fabric address (what the ranks dial), and what the interface carries when that differs."""
    addr, carried = fab.get("address"), ",".join(fab.get("ipv4", []))
    if not addr:
        return carried
    if fab.get("holds_address"):
        return addr if carried == addr else f"{addr} (interface: {carried})"
    return f"{addr} NOT on the interface (it has: {carried or 'no IPv4 address'})"


def register(app: typer.Typer) -> None:
    @app.command()
    def prepare(inventory: str | None = INVENTORY_OPT,
                profile: str | None = typer.Option(None, "--profile", "-p", help="Also sync this profile's "
                                                      "model and drafter to every node (models.yml)."),
                check: bool = flag("--check", help="Show what would change, per host; change "
                                           "nothing."),
                tags: str | None = typer.Option(None, "--tags", help="Only these parts, comma-separated: docker, "
                                                   "fabric, dirs, gpu, fabric-ssh, drop-caches, models."),
                restore: bool = flag("--restore", help="Put back the files prepare changed "
                                             "(daemon.json, fabric netplan)."),
                ask_become_pass: bool = flag("--ask-become-pass", "-K", help="Ask for the sudo "
                                                     "password of the SSH user."),
                as_json: bool = flag("--json", help="Result as JSON on stdout.")) -> None:
        """Prepare the Sparks with Ansible: docker + nvidia runtime, fabric netplan at MTU 9000, fabric SSH from
        rank 0, directories, GPU clocks; with --profile also the model and drafter on every node."""
        from sparkctl.prepare.plays import prepare as run_prepare
        from sparkctl.prepare.plays import profile_models

        inv = _inventory(inventory)
        models = profile_models(profile, inv) if profile else None
        password = getpass.getpass("sudo password: ") if ask_become_pass else None
        result = run_prepare(inv, check=check, tags=(tags or "").split(",") if tags else None, models=models,
                             restore=restore, become_password=password, on_event=_progress(check))
        if as_json:
            from sparkctl.cli.outputs import PrepareOutput, emit
            emit(PrepareOutput, result.as_dict())
            return
        verb = "would change" if check else "changed"
        for host, s in result.stats.items():
            print(f"{host}: {s['changed']} {verb}, {s['ok']} ok, {s['skipped']} skipped")
        for run in result.runs:
            print(f"{run.playbook}: events in {run.artifacts}")

    @app.command()
    def facts(inventory: str | None = INVENTORY_OPT,
              profile: str | None = typer.Option(None, "--profile", "-p", help="Include the manifests of this "
                                                    "profile's model and drafter."),
              as_json: bool = flag("--json", help="Facts as JSON on stdout.")) -> None:
        """Read-only facts of every node: GPU and driver, memory, fabric interface, RoCE devices, Docker
        runtimes, model manifests (through facts.yml)."""
        from sparkctl.prepare.plays import gather_facts, profile_models

        inv = _inventory(inventory)
        found = gather_facts(inv, models=profile_models(profile, inv) if profile else None)
        if as_json:
            from sparkctl.cli.outputs import FactsOutput, emit
            emit(FactsOutput, found)
            return
        for host, f in found.items():
            gpu, fab, dk = f["gpu"] or {}, f["fabric"] or {}, f["docker"] or {}
            print(f"{host}: gpu {gpu.get('name', '-')} driver {gpu.get('driver', '-')}; memory "
                  f"{f['memory_gib']} GiB; fabric {fab.get('interface', '-')} {fab.get('state', '')} mtu "
                  f"{fab.get('mtu', '-')} {_fabric_address(fab)}; docker {dk.get('version', '-')} "
                  f"runtimes {','.join(dk.get('runtimes', []))}")
            for link in f["roce"] or []:
                print(f"  roce {link['hca']} -> {link['netdev']} ({'Up' if link['up'] else 'Down'})")
            for name, m in f["models"].items():
                print(f"  model {name}: {m['status']} ({m['files']} files) {m['manifest']}")
