"""Commands that change the cluster (up, rollback, down) and their read-only companions (status, logs)."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer

from sparkctl.cli import bounds
from sparkctl.cli.options import flag
from sparkctl.errors import STATUS_NOT_OK  # noqa: E402 - exit 8: unhealthy, interrupted, or a comparison unfinished
from sparkctl.jsontypes import JSONObject

if TYPE_CHECKING:
    from collections.abc import Callable

    from sparkctl.config.profile import Profile
    from sparkctl.deploy.commands import Deployer
    from sparkctl.deploy.plan import Plan

INVENTORY_OPT = typer.Option(None, "--inventory", "-i", help="Ansible inventory file (default: see README).")


def _deployer(inventory: str | None, quiet: bool = False) -> Deployer:
    from sparkctl.config.inventory import resolve_inventory
    from sparkctl.deploy.lifecycle import Deployer
    from sparkctl.deploy.progress import Reporter
    from sparkctl.state.ledger import check_state_root

    d = Deployer(resolve_inventory(inventory), Reporter(quiet=quiet))
    if d.embedded_notice and not quiet:
        print(f"sparkctl: {d.embedded_notice}", file=sys.stderr)
    warning = check_state_root(d.ledger.root.parent)
    if warning:
        print(f"sparkctl: warning: {warning}", file=sys.stderr)
    return d


def _confirm(assume_yes: bool, action: str, d: Deployer, command: str) -> Callable[[Plan | None], bool]:
    """Ask on a terminal. Without a terminal, never prompt (and never hang): refuse with "add --yes" (exit 2),
    like `terraform apply` without -auto-approve, unless --yes was given or every node of the inventory runs
    the process runtime (the embedded cluster: emulator processes on this machine's loopback, nothing
    elsewhere can break), so README's `./bin/sparkctl up --profile d5` works in scripts as well."""
    from sparkctl.errors import ConfigError

    local = all(n.runtime == "process" for n in d.inventory.nodes)

    def ask(plan: Plan | None) -> bool:
        if assume_yes or (local and not sys.stdin.isatty()):
            return True
        if not sys.stdin.isatty():
            raise ConfigError(f"refusing to {action} without confirmation: stdin is not a terminal, so sparkctl "
                              f"cannot ask; nothing was changed",
                              hint=f"add --yes to confirm non-interactively (sparkctl {command} ... --yes), or run it "
                                   f"on a terminal to be asked")
        return typer.confirm(f"{action}?", default=False)
    return ask


def _emit(result: object, as_json: bool, human: Callable[[Any], None]) -> None:
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
        cap = result.get("capacity") or {}
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


def _replicated_up(d: Deployer, prof: Profile, dry_run: bool, yes: bool, boot_timeout: float | None,
                   as_json: bool) -> bool:
    """`up` of a profile with replicas > 1 (deploy/replicated.py), or leaving a replicated deployment for a single
    group (the router and replicas go down first). True when it handled the command."""
    from sparkctl.deploy.commands import UpOptions
    from sparkctl.deploy.replicated import ReplicatedDeployer, is_replicated
    from sparkctl.errors import ConfigError

    replicated = is_replicated(d.inventory)
    if prof.replicas == 1 and not replicated:
        return False
    rd = ReplicatedDeployer(d.inventory, d.reporter)
    if dry_run and prof.replicas > 1:
        from sparkctl.deploy.results import ReplicatedUpResult
        from sparkctl.sglang.replicas import router_endpoint
        lines = rd.plan_lines(prof)
        _emit(ReplicatedUpResult(outcome="dry-run", changed=False, profile=prof.name, cluster=d.inventory.cluster.name,
                                 emulated=d.inventory.emulated, replicas=prof.replicas,
                                 endpoint=router_endpoint(prof, d.inventory), plan=lines), as_json,
              lambda r: print("\n".join(r["plan"])))
        return True
    if dry_run:
        raise ConfigError("--dry-run from a replicated deployment to a single group is not available yet",
                          hint="run `sparkctl down` first, then `sparkctl up --dry-run`")
    if prof.replicas == 1:
        if not _confirm(yes, f"stop the router and replicas, then deploy {prof.name}", d, "up")(None):
            raise typer.Abort()
        d.reporter.event("leaving the replicated deployment: the router and its replicas stop first")
        rd.down()
        return False
    if not _confirm(yes, f"deploy {prof.name} ({prof.replicas} replicas behind the router)", d, "up")(None):
        raise typer.Abort()
    result = rd.up(prof, UpOptions(boot_timeout_s=boot_timeout))
    def human(r: JSONObject) -> None:
        print(f"{r['outcome']} {r['profile']}: {r['replicas']} replicas behind {r['endpoint']} (updated: "
              f"{', '.join(map(str, r['updated'])) or 'none'}" + ("; booted at once" if r["parallel"] else "") + ")")
        _next_lines(r)
    _emit(result, as_json, human)
    return True


def watcher_line(w: JSONObject | None) -> str | None:
    """`status`'s line about `sparkctl watch` on the cluster (None when no watcher ever ran there)."""
    if not w:
        return None
    if w["running"]:
        head = f"  watcher: running (pid {w['pid']} on {w['host']} since {w['since']}), desired {w['desired']}"
    else:
        head = f"  watcher: not running (last: pid {w['pid']} on {w['host']}" + (
            f", stopped {w['stopped']})" if w.get("stopped") else ", gone without stopping: killed?)")
    head += f"; restarts {w['restarts']} ({w['failures']} failed)"
    if w.get("last_action"):
        head += f"; last action {w['last_action_at']}: {w['last_action']}"
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
    @app.command()
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
        from sparkctl.deploy.lifecycle import UpOptions

        d = _deployer(inventory)
        prof = load_profile(profile)
        if _replicated_up(d, prof, dry_run, yes, boot_timeout, as_json):
            return
        result = d.up(prof, UpOptions(dry_run=dry_run, no_rollback=no_rollback, boot_timeout_s=boot_timeout,
                                      confirm=_confirm(yes, f"deploy {prof.name}", d, "up")))
        _emit(result, as_json, _up_human)

    @app.command()
    def preflight(profile: str = typer.Option(..., "--profile", "-p", help="Profile whose ranks are checked."),
                  inventory: str | None = INVENTORY_OPT,
                  as_json: bool = flag("--json", help="Checks as JSON on stdout.")) -> None:
        """Read-only checks on every node (what `up` runs first): nothing is changed."""
        from sparkctl.config.profile import load_profile

        d = _deployer(inventory, quiet=as_json)
        checks = d.preflight(load_profile(profile))
        _emit({"ok": True, "checks": [c.as_dict() for c in checks]}, as_json,
              lambda r: print(f"preflight passed: {len(r['checks'])} checks on "
                              f"{len({c['node'] for c in r['checks']})} nodes"))

    @app.command()
    def rollback(to: str | None = typer.Option(None, "--to", help="Profile to roll back to (e.g. dflash-off); "
                                                                      "default: the previous known-good deployment."),
                 inventory: str | None = INVENTORY_OPT,
                 yes: bool = flag("--yes", "-y", help="Do not ask for confirmation."),
                 boot_timeout: float | None = typer.Option(None, "--boot-timeout", parser=bounds.seconds(),
                                                              metavar="SECONDS", help="Seconds."),
                 as_json: bool = flag("--json", help="Result as JSON on stdout.")) -> None:
        """Roll back: to a profile, or to the previous known-good deployment."""
        from sparkctl.config.profile import load_profile
        from sparkctl.deploy.lifecycle import UpOptions

        d = _deployer(inventory)
        prof = load_profile(to) if to else None
        from sparkctl.deploy.replicated import is_replicated
        if is_replicated(d.inventory) or (prof is not None and prof.replicas > 1):
            # The router and its replicas hold the nodes' ports: a rollback goes the way `up` does (a rolling
            # update to a replicated profile, or the router and replicas down first for one group).
            if prof is None:
                from sparkctl.errors import ConfigError
                raise ConfigError("the cluster runs a replicated deployment, which keeps no known-good history of "
                                  "its own: say where to roll back to", where="rollback",
                                  hint="sparkctl rollback --to dflash-off (one group; the router and replicas stop "
                                       "first), or --to a profile with replicas: K (a rolling update)")
            if _replicated_up(d, prof, False, yes, boot_timeout, as_json):
                return
        what = prof.name if prof else "the previous known-good deployment"
        confirm = _confirm(yes, f"roll back to {what}", d, "rollback")
        result = d.rollback(prof, UpOptions(boot_timeout_s=boot_timeout, confirm=confirm))
        _emit(result, as_json, _up_human)

    @app.command()
    def down(inventory: str | None = INVENTORY_OPT,
             yes: bool = flag("--yes", "-y", help="Do not ask for confirmation."),
             as_json: bool = flag("--json", help="Result as JSON on stdout.")) -> None:
        """Stop the active deployment on every node."""
        d = _deployer(inventory)
        from sparkctl.deploy.replicated import ReplicatedDeployer, is_replicated
        if is_replicated(d.inventory):
            if not _confirm(yes, "stop the router and every replica", d, "down")(None):
                raise typer.Abort()
            _emit(ReplicatedDeployer(d.inventory, d.reporter).down(), as_json,
                  lambda r: print("stopped " + ", ".join(r["stopped"]) if r["stopped"] else "nothing was running"))
            return
        active = d.ledger.active()
        if active and not _confirm(yes, f"stop {active.id} ({active.profile})", d, "down")(None):
            raise typer.Abort()
        result = d.down()

        def human(r: JSONObject) -> None:
            if not r.get("changed"):
                print(r["reason"])
                return
            print(f"stopped {r['stopped']}" if r.get("stopped") else "no active deployment")
            for e in r.get("engines") or []:
                print(f"  stopped {e}")
        _emit(result, as_json, human)

    @app.command()
    def status(inventory: str | None = INVENTORY_OPT,
               as_json: bool = flag("--json", help="Status as JSON on stdout.")) -> None:
        """Profile, deployment, health per rank, endpoint, speculative algorithm, identity, since when.

        Exit 0 when the active deployment is healthy (or nothing is deployed and nothing was interrupted);
        8 when it is unhealthy or a deployment was interrupted (its controller died)."""
        d = _deployer(inventory, quiet=as_json)
        from sparkctl.deploy.replicated import ReplicatedDeployer, is_replicated
        if is_replicated(d.inventory):
            rep = ReplicatedDeployer(d.inventory, d.reporter).status()
            _emit(rep, as_json, _replicated_status_human)
            if not rep["healthy"]:
                raise typer.Exit(STATUS_NOT_OK)
            return
        result = d.status()

        def human(r: JSONObject) -> None:
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
            line = watcher_line(r.get("watcher"))
            if not r.get("active"):
                print(f"cluster {r['cluster']}: no active deployment")
                if line:
                    print(line)
                return
            print(f"cluster {r['cluster']}: {r['profile']} ({r['active']}) "
                  f"{'healthy' if r['healthy'] else 'UNHEALTHY'}{'  [emulated]' if r.get('emulated') else ''}")
            print(f"  endpoint: {r['endpoint']}   since {r['since']}")
            print(f"  speculative: {r['speculative_algorithm'] or 'off'}   SGLang {r['sglang_version']}   "
                  f"identity {r['identity']}")
            for rank in r["ranks"]:
                extra = f", /health {rank.get('health')}" if rank["rank"] == 0 else ""
                print(f"  rank {rank['rank']} [{rank['node']}]: {rank['state']}{extra}")
            if line:
                print(line)
        _emit(result, as_json, human)
        if not result.ok:
            raise typer.Exit(STATUS_NOT_OK)

    @app.command()
    def repair(inventory: str | None = INVENTORY_OPT,
               yes: bool = flag("--yes", "-y", help="Apply without asking."),
               as_json: bool = flag("--json", help="What changed, as JSON on stdout.")) -> None:
        """Repair a damaged ledger: move damaged records aside (kept), rebuild the index and the active deployment
        from the engines actually running. Shows the changes and asks first."""
        from sparkctl.errors import CancelledError

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

    @app.command()
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
        from sparkctl.deploy.replicated import ReplicatedDeployer, is_replicated
        from sparkctl.errors import ConfigError
        d = _deployer(inventory, quiet=True)
        if is_replicated(d.inventory):
            if router and replica is not None:
                raise ConfigError("--router and --replica name different logs: give one of them",
                                  hint="sparkctl logs --router, or sparkctl logs --replica I --rank N")
            texts = ReplicatedDeployer(d.inventory, d.reporter).follow_log(replica=replica, rank=rank, router=router,
                                                                            tail=tail, follow=follow)
        elif router or replica is not None:
            raise ConfigError(f"{'--router' if router else '--replica'}: cluster {d.inventory.cluster.name} runs no "
                              f"replicated deployment (one group, no router)",
                              hint="sparkctl logs --rank N shows its ranks' logs")
        else:
            texts = d.follow_log(rank, tail=tail, follow=follow)
        for text in texts:
            sys.stdout.write(text)
            sys.stdout.flush()
