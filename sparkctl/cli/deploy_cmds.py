"""Commands that change the cluster (up, rollback, down) and their read-only companions (status, logs)."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

import typer

from sparkctl.cli import bounds
from sparkctl.cli.options import flag
from sparkctl.enginenames import ENGINE_NAMES
from sparkctl.errors import (
    STATUS_NOT_OK,  # noqa: E402 - exit 8: unhealthy, interrupted, or a comparison unfinished
    CancelledError,
    ConfigError,
)
from sparkctl.jsontypes import JSONObject

if TYPE_CHECKING:
    from collections.abc import Callable

    from sparkctl.deploy.commands import Deployer
    from sparkctl.deploy.door import Confirm
    from sparkctl.deploy.plan import Plan

INVENTORY_OPT = typer.Option(None, "--inventory", "-i", help="Ansible inventory file (default: see README).")


def _deployer(inventory: str | None, quiet: bool = False) -> Deployer:
    from sparkctl.config.inventory import resolve_inventory
    from sparkctl.deploy.commands import Deployer
    from sparkctl.deploy.progress import Reporter
    from sparkctl.state.ledger import check_state_root

    d = Deployer(resolve_inventory(inventory), Reporter(quiet=quiet))
    if d.embedded_notice and not quiet:
        print(f"sparkctl: {d.embedded_notice}", file=sys.stderr)
    warning = check_state_root(d.ledger.root.parent)
    if warning:
        print(f"sparkctl: warning: {warning}", file=sys.stderr)
    return d


def _confirm(assume_yes: bool, d: Deployer, command: str) -> Confirm:
    """Ask on a terminal. Without a terminal, never prompt (and never hang): refuse with "add --yes" (exit 2),
    like `terraform apply` without -auto-approve, unless --yes was given or every node of the inventory runs
    the process runtime (the embedded cluster: emulator processes on this machine's loopback, nothing
    elsewhere can break), so README's `./bin/sparkctl up --profile d5` works in scripts as well."""

    local = all(n.runtime == "process" for n in d.inventory.nodes)

    def ask(action: str, plan: Plan | None) -> bool:
        if assume_yes or (local and not sys.stdin.isatty()):
            return True
        if not sys.stdin.isatty():
            raise ConfigError(f"refusing to {action} without confirmation: stdin is not a terminal, so sparkctl "
                              f"cannot ask; nothing was changed",
                              hint=f"add --yes to confirm non-interactively (sparkctl {command} ... --yes), or run it "
                                   f"on a terminal to be asked")
        return typer.confirm(f"{action}?", default=False)
    return ask


@contextmanager
def _declined_aborts() -> Iterator[None]:
    """A "no" at the door's question (`deploy.door.Declined`) is typer's Abort (exit 1, "Aborted!")."""
    from sparkctl.deploy.door import Declined
    try:
        yield
    except Declined:
        raise typer.Abort() from None


class _Emitted(Protocol):
    """A command's result model (`deploy.results`): its JSON form is what `--json` prints and `human` shows."""

    def as_json(self) -> JSONObject: ...


def _emit(result: _Emitted | JSONObject, as_json: bool, human: Callable[[JSONObject], None]) -> None:
    data = result.as_json() if hasattr(result, "as_json") else result
    if as_json:
        from sparkctl.cli.outputs import print_json
        print_json(data)
    else:
        human(data)


def _up_human(result: JSONObject) -> None:
    outcome = result.get("outcome")
    if outcome == "deployed":
        print(f"deployed {result['deployment']}: {result['endpoint']}"
              + ("  (emulated)" if result.get("emulated") else ""))
        cap = {k: v for k, v in (result.get("capacity") or {}).items() if v is not None}   # what the engine said
        if cap:
            print("capacity: " + ", ".join(f"{k}={v}" for k, v in cap.items()))
        for g in result.get("gates") or []:
            print(f"  {'PASS' if g['ok'] else 'FAIL'} {g['name']}: {g['evidence']}")
        cc = result.get("concurrency")
        if cc:
            print(f"concurrency: at most {cc['max_running_requests']} request(s) at once: {cc['reason']}")
            print(f"  to raise it: {cc['setting']}")
        _next_lines(result)
    elif outcome == "unchanged":
        print(f"unchanged: {result['reason']}")
        _next_lines(result)
    elif outcome == "dry-run":
        print("dry run: plan above; nothing was changed")


def _next_lines(result: JSONObject) -> None:
    if result.get("next_commands"):
        print("next: " + "  |  ".join(result["next_commands"]))


def _replicated_up_human(r: JSONObject) -> None:
    if r["outcome"] == "dry-run":
        print("\n".join(r["plan"]))
        return
    print(f"{r['outcome']} {r['profile']}: {r['replicas']} replicas behind {r['endpoint']} (updated: "
          f"{', '.join(map(str, r['updated'])) or 'none'}" + ("; booted at once" if r["parallel"] else "") + ")")
    _next_lines(r)


def _any_up_human(r: JSONObject) -> None:
    (_replicated_up_human if r.get("replicated") else _up_human)(r)


def watcher_line(w: JSONObject | None) -> str | None:
    """`status`'s line about `sparkctl watch` on the cluster (None when no watcher ever ran there)."""
    if not w:
        return None
    if w["running"]:
        head = f"  watcher: running (pid {w['pid']} on {w['host']} since {w['since']}), desired {w['desired']}"
    else:
        head = f"  watcher: not running (last: pid {w['pid']} on {w['host']}" + (
            f", stopped {w['stopped']})" if w.get("stopped") else ", gone without stopping: killed?)")
    head += f"; restarts {w['restarts']} ({w['failures']} failed" + (
        f", {w['flaps']} died again within the window" if w.get("flaps") else "") + ")"
    if w.get("last_action"):
        head += f"; last action {w['last_action_at']}: {w['last_action']}"
    if w.get("refused"):
        head += f"\n  watcher REFUSES to restart: {w['refused']}"
    if w.get("gave_up"):
        head += f"\n  watcher gave up: {w['gave_up']}"
    return head


def _replicated_status_human(r: JSONObject) -> None:
    router = r.get("router") or {}
    print(f"cluster {r['cluster']}: {r.get('profile')} ({len(r['replicas'])} replicas) "
          f"{'healthy' if r['healthy'] else 'UNHEALTHY'}")
    print(f"  endpoint: {r.get('endpoint')}   router "
          + (f"ready, {router.get('healthy_workers')}/{router.get('total_workers')} workers healthy"
             if router.get("ready") else "NOT READY" if router else "not running"))
    if r.get("progress"):
        print(f"  {r['progress']}")
    for rep in r["replicas"]:
        where = "in the router" if rep["in_router"] else "NOT in the router"
        print(f"  replica {rep['index']} [{', '.join(rep['nodes'])}] {rep['url']}: "
              f"{'healthy' if rep['healthy'] else 'UNHEALTHY'}, {where}"
              + (f", runs {rep['profile']} (asked: {r.get('profile')})"
                 if rep.get("profile") and rep["profile"] != r.get("profile") else "")
              + (f", {int(router['requests_per_replica'].get(rep['url'], 0))} requests"
                 if router.get("requests_per_replica") else ""))
    line = watcher_line(r.get("watcher"))
    if line:
        print(line)


def register(app: typer.Typer) -> None:
    app.command()(up)
    app.command()(preflight)
    app.command()(rollback)
    app.command()(down)
    app.command()(status)
    app.command()(repair)
    app.command()(logs)


def up(profile: str = typer.Option(..., "--profile", "-p", help="Profile to deploy."),
       inventory: str | None = INVENTORY_OPT,
       dry_run: bool = flag("--dry-run", help="Print the plan and stop."),
       yes: bool = flag("--yes", "-y", help="Do not ask for confirmation."),
       no_rollback: bool = flag("--no-rollback", help="On failure, leave the new engines for "
                                                                     "inspection instead of rolling back."),
       boot_timeout: float | None = typer.Option(None, "--boot-timeout", parser=bounds.seconds(), metavar="SECONDS",
                                                     help="Seconds (default: profile)."),
       as_json: bool = flag("--json", help="Result as JSON on stdout.")) -> None:
    """Deploy a profile: plan, preflight, image, boot (rank 1 then rank 0), warm-up, verify, hand off."""
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy import door

    d = _deployer(inventory)
    prof = load_profile(profile)
    with _declined_aborts():
        result = door.up(d, prof, door.UpRequest(dry_run=dry_run, no_rollback=no_rollback,
                                                 boot_timeout_s=boot_timeout),
                         confirm=_confirm(yes, d, "up"))
    _emit(result, as_json, _any_up_human)


def preflight(profile: str = typer.Option(..., "--profile", "-p", help="Profile whose ranks are checked."),
              inventory: str | None = INVENTORY_OPT,
              as_json: bool = flag("--json", help="Checks as JSON on stdout.")) -> None:
    """Read-only checks on every node (what `up` runs first): nothing is changed."""
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy import door

    d = _deployer(inventory, quiet=as_json)
    checks = door.preflight(d, load_profile(profile))
    _emit({"ok": True, "checks": [c.model_dump(mode="json") for c in checks]}, as_json,
          lambda r: print(f"preflight passed: {len(r['checks'])} checks on "
                          f"{len({c['node'] for c in r['checks']})} nodes"))


def rollback(to: str | None = typer.Option(None, "--to", help="Profile to roll back to (e.g. dflash-off); "
                                                                  "default: the previous known-good deployment."),
             inventory: str | None = INVENTORY_OPT,
             yes: bool = flag("--yes", "-y", help="Do not ask for confirmation."),
             boot_timeout: float | None = typer.Option(None, "--boot-timeout", parser=bounds.seconds(),
                                                          metavar="SECONDS", help="Seconds."),
             dry_run: bool = flag("--dry-run", help="Print the plan and stop."),
             as_json: bool = flag("--json", help="Result as JSON on stdout.")) -> None:
    """Roll back: to a profile, or to the previous known-good deployment."""
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy import door

    d = _deployer(inventory)
    prof = load_profile(to) if to else None
    with _declined_aborts():
        result = door.rollback(d, prof, door.UpRequest(boot_timeout_s=boot_timeout, dry_run=dry_run),
                               confirm=_confirm(yes, d, "rollback"))
    _emit(result, as_json, _any_up_human)


def down(inventory: str | None = INVENTORY_OPT,
         yes: bool = flag("--yes", "-y", help="Do not ask for confirmation."),
         dry_run: bool = flag("--dry-run", help="Print what it would stop, in order, and stop there."),
         as_json: bool = flag("--json", help="Result as JSON on stdout.")) -> None:
    """Stop the active deployment on every node."""
    from sparkctl.deploy import door

    d = _deployer(inventory)
    with _declined_aborts():
        result = door.down(d, confirm=_confirm(yes, d, "down"), dry_run=dry_run)

    def human(r: JSONObject) -> None:
        if r.get("outcome") == "dry-run":
            print("\n".join(f"  {line}" for line in r["plan"]))
            print("dry run: nothing was changed; `sparkctl down` runs these")
            return
        if r.get("replicated"):
            print("stopped " + ", ".join(r["stopped"]) if r["stopped"] else "nothing was running")
            return
        if not r.get("changed"):
            print(r["reason"])
            return
        print(f"stopped {r['stopped']}" if r.get("stopped") else "no active deployment")
        for e in r.get("engines") or []:
            print(f"  stopped {e}")
    _emit(result, as_json, human)


def status(inventory: str | None = INVENTORY_OPT,
           as_json: bool = flag("--json", help="Status as JSON on stdout.")) -> None:
    """Profile, deployment, health per rank, endpoint, speculative algorithm, identity, since when.

    Exit 0 when the active deployment is healthy (or nothing is deployed and nothing was interrupted);
    8 when it is unhealthy, a deployment was interrupted (its controller died), or processes of an engine
    outlived it (`leftovers`)."""
    from sparkctl.deploy import door

    d = _deployer(inventory, quiet=as_json)
    result = door.status(d)

    def human(r: JSONObject) -> None:
        if r.get("replicated"):
            _replicated_status_human(r)
            return
        p = r.get("in_progress")
        if p:
            what = f": deployment {p['deployment']} ({p['profile']}), stage {p['stage']}" if p.get("deployment") \
                else ""
            print(f"cluster {r['cluster']}: `sparkctl {p['command']}` in progress (pid {p['pid']} on {p['host']} "
                  f"since {p['since']}){what}")
        for i in r.get("interrupted") or []:
            alive = ", ".join(map(str, i["ranks_alive"]))
            print(f"cluster {r['cluster']}: deployment {i['deployment']} was interrupted ({i['detail']}) during "
                  f"{i['stage']}: " + (f"ranks {alive} alive" if alive else "none of its engines runs")
                  + "; the next `sparkctl up`, `rollback` or `down` settles it")
        if r.get("unfinished_compare"):
            print(f"cluster {r['cluster']}: {r['unfinished_compare']}; the next `sparkctl up`, `rollback`, "
                  f"`down` or `bench` settles it")
        for lo in r.get("leftovers") or []:
            print(f"cluster {r['cluster']}: leftover processes of {lo} outlived their engine; `sparkctl down` "
                  f"(or the next `up`) stops them")
        line = watcher_line(r.get("watcher"))
        if not r.get("active"):
            print(f"cluster {r['cluster']}: no active deployment")
            if line:
                print(line)
            return
        print(f"cluster {r['cluster']}: {r['profile']} ({r['active']}) "
              f"{'healthy' if r['healthy'] else 'UNHEALTHY'}{'  [emulated]' if r.get('emulated') else ''}")
        print(f"  endpoint: {r['endpoint']}   since {r['since']}")
        engine = ENGINE_NAMES.get(r.get("engine") or "sglang", "SGLang")
        print(f"  speculative: {r['speculative_algorithm'] or 'off'}   {engine} {r['sglang_version']}   "
              f"identity {r['identity']}")
        for rank in r["ranks"]:
            extra = f", /health {rank.get('health')}" if rank["rank"] == 0 else ""
            print(f"  rank {rank['rank']} [{rank['node']}]: {rank['state']}{extra}")
        if line:
            print(line)
    _emit(result, as_json, human)
    if not result.ok:
        raise typer.Exit(STATUS_NOT_OK)


def repair(inventory: str | None = INVENTORY_OPT,
           yes: bool = flag("--yes", "-y", help="Apply without asking."),
           dry_run: bool = flag("--dry-run", help="Print the changes it would make and stop there."),
           as_json: bool = flag("--json", help="What changed, as JSON on stdout.")) -> None:
    """Repair a damaged ledger: move damaged records aside (kept), rebuild the index and the active deployment
    from the engines actually running. Shows the changes and asks first."""

    d = _deployer(inventory, quiet=as_json)
    with d.ledger.lock("repair"):
        plan = d.plan_repair()
        if not plan.changes:
            _emit({"changed": False, **plan.as_dict()}, as_json,
                  lambda r: print("ledger is consistent with what runs: nothing to repair"
                                  + "".join(f"\nnote: {n}" for n in r["notes"])))
            return
        for line in plan.lines():
            print(f"repair: {line}", file=sys.stderr)
        if dry_run:
            _emit({"changed": False, "outcome": "dry-run", **plan.as_dict()}, as_json,
                  lambda r: print("dry run: nothing was changed; `sparkctl repair --yes` makes these changes"))
            return
        if not yes:
            if not sys.stdin.isatty():
                raise CancelledError("repair changes the ledger and was not confirmed; nothing was changed",
                                     hint="review the changes above, then run `sparkctl repair --yes`")
            if not typer.confirm("apply these changes?", default=False):
                raise CancelledError("repair declined at the prompt; nothing was changed")
        d.apply_repair(plan)
    _emit({"changed": True, **plan.as_dict()}, as_json,
          lambda r: print(f"repaired: active deployment {r['active'] or 'none'}"
                          + (f"; damaged files kept in {d.ledger.root / 'damaged'}" if r["damaged"] else "")))


def logs(rank: int = typer.Option(0, "--rank", parser=bounds.count(0, 1023, what="a rank"), metavar="N",
                               help="Rank whose engine log to show."),
         tail: int = typer.Option(50, "--tail", parser=bounds.count(0, 10_000_000, what="a line count"),
                               metavar="N", help="Last N lines (0: all)."),
         follow: bool = flag("--follow", "-f", help="Keep printing new lines (Ctrl-C stops)."),
         replica: int | None = typer.Option(None, "--replica", parser=bounds.count(0, 1023, what="a replica"),
                                               metavar="I", help="Replicated deployment: replica I's rank log "
                                                                 "(default 0)."),
         router: bool = flag("--router", help="Replicated deployment: the router's log."),
         inventory: str | None = INVENTORY_OPT) -> None:
    """Print a rank's engine log of the active deployment (or, replicated, a replica's rank or the router's)."""
    from sparkctl.deploy import door

    d = _deployer(inventory, quiet=True)
    texts = door.logs(d, rank=rank, tail=tail, follow=follow, replica=replica, router=router)
    for text in texts:
        sys.stdout.write(text)
        sys.stdout.flush()
