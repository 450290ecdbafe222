"""The one door of `deploy/`: up, rollback, down, status and logs, each deciding here between a single group
(`deploy.commands.Deployer`) and replicas behind the router (`deploy.replicated.ReplicatedDeployer`).

The CLI parses its options, calls one of these and renders the typed result it gets back; it chooses nothing.
The choice is made from the profile (`replicas: K`) and from what the cluster's state directory holds (an active
replicated deployment):

    profile replicas  cluster runs        up / rollback --to P
    1                 one group or none   the single-group `up` (rollback: to P, or the previous known-good)
    K > 1             anything            the replicated `up` (a rolling update when replicas run)
    1                 replicas            the router and replicas down first, then the single-group `up`

`down`, `status` and `logs` follow what runs. Readers outside `deploy/` (bench, the watcher) do not choose either:
`deployed()` says what the cluster runs (or what `up` of a profile would leave running), how to reach it (its
endpoint, each replica's own `Deployer`) and how to restart it (`Deployed.restart`).

A question to the user goes through `confirm(action, plan)`, which the caller provides (the CLI asks on a
terminal; bench, tune and the watcher pass `proceed`); a "no" at a question asked before any plan is made raises
`Declined` (nothing was changed). A comparison arm, tune trial or the restore after them is `up` with a
transaction's command (`UpRequest.command`); `restore` is the compare transaction's one restore. Example::

    d = Deployer(resolve_inventory(None), Reporter())
    result = door.up(d, load_profile("d5"), UpRequest(), confirm=lambda action, plan: True)
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from sparkctl.config.inventory import Inventory
from sparkctl.config.profile import Profile
from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.commands import Deployer, UpOptions
from sparkctl.deploy.inputs import PROBE_DEADLINE_S, missing_paths, unresolved_secrets
from sparkctl.deploy.plan import Plan
from sparkctl.deploy.results import (
    DownPlanResult,
    DownResult,
    ReplicatedDownResult,
    ReplicatedStatusResult,
    ReplicatedUpResult,
    StatusResult,
    UpResult,
)
from sparkctl.deploy.steps import ARM_COMMAND, RESTORE_COMMAND, TRANSACTION_COMMANDS
from sparkctl.errors import ConfigError, RestartRefusedError, SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.router.replicas import router_endpoint
from sparkctl.sglang.launch import ENGINE_SECRETS_FILE, SECRETS_MOUNT
from sparkctl.state.ledger import Ledger
from sparkctl.state.records import CheckResult, DeploymentRecord, ReplicaEntry, ReplicatedRecord
from sparkctl.state.replicated import Record
from sparkctl.untrusted import clean

if TYPE_CHECKING:
    from sparkctl.deploy.replicated import ReplicatedDeployer

Confirm = Callable[[str, Plan | None], bool]     # (what is about to happen, the plan when there is one) -> go on?


def is_replicated(inventory: Inventory) -> bool:
    """The cluster's state directory holds an active replicated deployment (status and down go through it)."""
    return Record.load(Ledger.for_cluster(inventory.cluster.name).root).active


def _replicas(d: Deployer) -> ReplicatedDeployer:
    """The replicated deployment on `d`'s cluster: the router and its replicas."""
    from sparkctl.deploy.replicated import ReplicatedDeployer
    return ReplicatedDeployer(d.inventory, d.reporter)


class Declined(Exception):  # noqa: N818 - a user's answer, not a failure of sparkctl
    """The user answered no to a question asked before any plan was made; nothing was changed."""


@dataclass(frozen=True)
class UpRequest:
    """What `up` (and `rollback`) was asked for, apart from the profile."""

    dry_run: bool = False
    no_rollback: bool = False
    boot_timeout_s: float | None = None
    command: str = "up"  # ARM_COMMAND: a comparison arm or tune trial; RESTORE_COMMAND: what ran before it, restored


def proceed(action: str, plan: Plan | None) -> bool:
    """The `confirm` of a caller that asks nobody (bench, tune, the watcher): go on."""
    return True


Kind = Literal["down", "deployment", "replicated"]


@dataclass(frozen=True)
class Deployed:
    """What a cluster runs, as a reader outside `deploy/` needs it (made by `deployed()`, never by hand).

    `kind`: "deployment" (one TP group: `deployment` is its id), "replicated" (replicas behind the router:
    `replicated` is its record, `where` that file) or "down". `endpoint` is where clients reach it."""

    kind: Kind
    profile: str | None = None
    deployment: str | None = None
    endpoint: str | None = None
    replicated: ReplicatedRecord | None = None
    where: str | None = None
    _d: Deployer | None = field(default=None, repr=False, compare=False)

    def replica(self, entry: ReplicaEntry) -> Deployer:
        """One replica of a replicated deployment (an entry of its record's `replicas`), reached through its own
        cluster: its ledger, records and runtimes."""
        if self._d is None:
            raise ConfigError("nothing to reach: this answer was not made by door.deployed()")
        from sparkctl.deploy.replicated import replica_inventory
        return Deployer(replica_inventory(self._d.inventory, entry), self._d.reporter)

    def restart(self, *, boot_timeout_s: float | None = None,
                node_deadline_s: float = PROBE_DEADLINE_S) -> UpResult | ReplicatedUpResult:
        """Bring back exactly what was deployed, never the profile file as it is now: the single-group `up` of the
        deployment's recorded profile (stop what is left, boot, gates, hand-off; restored by that `up` when it
        fails), or the replicated `up` of the profile its record kept (a replica that fails is redeployed alone, a
        router that is gone started again; the healthy replicas are unchanged). Before anything is touched,
        `as_recorded` renders every rank again and refuses (RestartRefusedError) what would not be identical: a
        secret's variable missing here or holding another value, a file the launch needs gone from a node (asked
        within `node_deadline_s` in total), an inventory that changed, a recorded profile that no longer validates."""
        if self._d is None or self.kind == "down":
            raise ConfigError("nothing to restart: the desired state is down")
        opts = UpOptions(boot_timeout_s=boot_timeout_s)
        if self.kind == "replicated":
            rec = self.replicated or ReplicatedRecord()
            profile = recorded_replicated_profile(rec, str(self.where))
            for entry in rec.replicas:
                sub = self.replica(entry)
                active = sub.ledger.active()
                if active is not None:
                    as_recorded(sub, active, node_deadline_s=node_deadline_s)
            return _replicas(self._d).up(profile, opts)
        record = self._d.ledger.load(str(self.deployment))
        return self._d.up(as_recorded(self._d, record, node_deadline_s=node_deadline_s), opts)


_COMPARED = {"rank", "node", "argv", "env", "image"}      # what the launch identity hashes (deploy/plan.py)


def as_recorded(d: Deployer, record: DeploymentRecord, *, node_deadline_s: float = PROBE_DEADLINE_S) -> Profile:
    """The profile `record` was deployed with, once it is certain that `up` of it on this inventory, with this
    process's environment, renders every rank exactly as recorded (argv, environment, node, image), with the same
    secret values (deploy/inputs.py: their fingerprints) and the node paths it had (asked within `node_deadline_s`).
    Raises RestartRefusedError naming what differs and what to do (its `cause`: REFUSAL_CAUSES): a secret's variable
    set at deploy time and missing now (a key-protected deployment would come back with no key) or holding another
    value, a model, drafter or other file gone from a node, an inventory edited since, a profile that no longer
    validates; PreflightError when a node did not answer in time. Nothing is changed either way."""
    from pydantic import ValidationError

    where = f"deployment {record.id}"
    try:
        profile = record.deployed_profile()
        specs = d.cluster.render(profile).specs
    except (ValidationError, SparkctlError) as exc:
        first = str(exc).splitlines()[0]
        raise RestartRefusedError(f"the recorded profile of {record.id} ({record.profile}) cannot be rendered "
                                  f"again here: {first}", where=where, cause="record",
                                  hint="deploy it again yourself (sparkctl up --profile ...)") from None
    now = [s.redacted().model_dump(mode="json", include=_COMPARED) for s in specs]
    was = [s.model_dump(mode="json", include=_COMPARED) for s in record.specs]
    unset, changed = unresolved_secrets(record)
    unset = sorted(set(unset) | set(missing_secrets(record)))
    if unset:
        raise RestartRefusedError(
            f"{record.id} ({record.profile}) would come back without its secrets: "
            f"{', '.join(unset)} {'is' if len(unset) == 1 else 'are'} not set in this environment, and the "
            f"deployment was made with {'it' if len(unset) == 1 else 'them'} (an API key left out would serve "
            f"without one)", where=where, cause="secret-missing", hint=_ENV_HINT)
    if now != was:
        raise RestartRefusedError(f"{record.id} ({record.profile}) would not come back as it was deployed: "
                                  f"{_first_difference(was, now)}", where=where,
                                  hint="the inventory or this environment changed since the deployment: deploy "
                                       "again yourself (sparkctl up --profile ...) to make the new launch the "
                                       "recorded one")
    if changed:
        raise RestartRefusedError(
            f"{record.id} ({record.profile}) would come back with other secrets than it was deployed with: "
            f"{', '.join(changed)} {'holds' if len(changed) == 1 else 'hold'} another value in this environment "
            f"than at deploy time (a rotated key: clients of the deployment hold the old one)", where=where,
            cause="secret-changed",
            hint="give the watcher the value the deployment was made with (its unit's EnvironmentFile, "
                 "docs/watch.md), or deploy with the new one yourself (sparkctl up --profile "
                 f"{record.profile}) to make it the recorded one")
    gone = missing_paths(d.inventory, record, deadline_s=node_deadline_s)
    if gone:
        shown = "; ".join(f"{p.what} {p.path} ({p.host} on {p.node})" for p in gone[:4]) + (
            f"; and {len(gone) - 4} more" if len(gone) > 4 else "")
        raise RestartRefusedError(f"{record.id} ({record.profile}) would not find what it was deployed with: "
                                  f"{clean(shown, 600)} {'is' if len(gone) == 1 else 'are'} gone",
                                  where=where, cause="file-missing",
                                  hint="put it back where it was (a mount that came off: mount it again; the "
                                       "watcher retries after its backoff), or deploy from where it is now "
                                       f"yourself (sparkctl up --profile {record.profile})")
    return profile


_ENV_HINT = ("give the watcher the variable (its unit's EnvironmentFile, e.g. ~/.config/sparkctl/watch.env, "
             "docs/watch.md), then restart the watcher")


def missing_secrets(record: DeploymentRecord) -> list[str]:
    """The secret variables `record` was deployed with (its API key passed in the engine's secrets file, its HF
    token through HF_TOKEN_PATH) that are not set in this environment: an unattended `up` here would start it
    without them. Used before the watcher restarts a deployment or rolls a crash loop back from it."""
    api = record.profile_data.get("api") or {}
    key_env, hf_env = api.get("api_key_env"), api.get("hf_token_env")
    secrets_file = f"{SECRETS_MOUNT}/{ENGINE_SECRETS_FILE}"
    used_key = any(secrets_file in s.argv for s in record.specs)
    used_hf = any("HF_TOKEN_PATH" in s.env for s in record.specs)
    return [str(n) for n, used in ((key_env, used_key), (hf_env, used_hf)) if n and used and not os.environ.get(str(n))]


def _first_difference(was: list[JSONObject], now: list[JSONObject]) -> str:
    """One line saying where two rank lists first differ: the rank, the field and its first differing item (values
    cut; never a secret: the specs are redacted)."""
    if len(was) != len(now):
        return f"{len(was)} ranks recorded, {len(now)} rendered now"
    for a, b in zip(was, now, strict=True):
        for key in sorted(_COMPARED):
            av, bv = a.get(key), b.get(key)
            if av == bv:
                continue
            where, old, new = key, av, bv
            if isinstance(av, list) and isinstance(bv, list):
                i = next((i for i, (x, y) in enumerate(zip(av, bv)) if x != y), min(len(av), len(bv)))
                where, old, new = f"{key}[{i}]", av[i] if i < len(av) else None, bv[i] if i < len(bv) else None
            elif isinstance(av, dict) and isinstance(bv, dict):
                k = sorted(n for n in set(av) | set(bv) if av.get(n) != bv.get(n))[0]
                where, old, new = f"{key} {k}", av.get(k), bv.get(k)
            return clean(f"rank {a.get('rank')} {where}: recorded {old!r}, now {new!r}", 300)
    return "the ranks differ"


def recorded_replicated_profile(data: ReplicatedRecord, where: str) -> Profile:
    """The profile a replicated deployment was deployed with, as its record kept it (`profile_data`); a record
    written before it was kept, or one that no longer validates, is refused (RestartRefusedError)."""
    from pydantic import ValidationError
    kept = data.profile_data
    if kept is None:
        raise RestartRefusedError("the replicated deployment's record keeps no profile as deployed (written by an "
                                  "older sparkctl); restarting it from the profile file could roll out edits "
                                  "never deployed", where=where, cause="record",
                                  hint=f"deploy it again yourself once (sparkctl up --profile {data.profile})")
    try:
        return Profile.model_validate(kept)
    except ValidationError as exc:
        raise RestartRefusedError(f"the replicated deployment's recorded profile no longer validates: "
                                  f"{str(exc).splitlines()[0]}", where=where, cause="record",
                                  hint=f"deploy it again yourself (sparkctl up --profile {data.profile})"
                                  ) from None


def deployed(where: Deployer | Cluster, profile: Profile | None = None) -> Deployed:
    """What the cluster runs now; with `profile`, what `up` of it would leave running (its kind and name).

    The one place outside the commands that decides between a single group and replicas: bench measures
    what this says, the watcher keeps it running. A damaged replicated record is a LedgerError (exit 6)."""
    d = where if isinstance(where, Deployer) else Deployer(where.inventory, where.reporter, where.ledger)
    if profile is not None:
        return Deployed("replicated" if profile.replicas > 1 else "deployment", profile=profile.name, _d=d)
    rec = Record.load(d.ledger.root)
    if rec.active:
        doc = rec.doc
        return Deployed("replicated", profile=doc.profile, replicated=doc, where=str(rec.path), _d=d,
                        endpoint=doc.endpoint or (doc.router.url if doc.router else None))
    active = d.ledger.active()
    if active is not None:
        return Deployed("deployment", profile=active.profile, deployment=active.id, endpoint=active.endpoint, _d=d)
    return Deployed("down", _d=d)


def _single_confirm(confirm: Confirm, action: str) -> Callable[[Plan], bool]:
    return lambda plan: confirm(action, plan)


def _replicated(d: Deployer, profile: Profile, req: UpRequest,
                confirm: Confirm) -> ReplicatedUpResult | None:
    """The replicated side of `up`: a profile with replicas > 1, or leaving a replicated deployment for one group
    (the router and replicas go down first, then None: the single-group `up` follows)."""
    if profile.replicas == 1 and not is_replicated(d.inventory):
        return None
    rd = _replicas(d)
    if req.dry_run and profile.replicas > 1:
        return ReplicatedUpResult(outcome="dry-run", changed=False, profile=profile.name,
                                  cluster=d.inventory.cluster.name, emulated=d.inventory.emulated,
                                  replicas=profile.replicas, endpoint=router_endpoint(profile, d.inventory),
                                  plan=rd.plan_lines(profile))
    if req.dry_run:
        raise ConfigError("--dry-run from a replicated deployment to a single group is not available yet",
                          hint="run `sparkctl down` first, then `sparkctl up --dry-run`")
    if profile.replicas == 1:
        if not confirm(f"stop the router and replicas, then deploy {profile.name}", None):
            raise Declined
        d.reporter.event("leaving the replicated deployment: the router and its replicas stop first")
        rd.down()
        return None
    if not confirm(f"deploy {profile.name} ({profile.replicas} replicas behind the router)", None):
        raise Declined
    return rd.up(profile, UpOptions(boot_timeout_s=req.boot_timeout_s))


def up(d: Deployer, profile: Profile, req: UpRequest, *, confirm: Confirm) -> UpResult | ReplicatedUpResult:
    """Deploy `profile`: one group, or its replicas behind the router (module docstring for the choice).

    A comparison arm or a tune trial (`req.command` ARM_COMMAND) and the restore after it (RESTORE_COMMAND) are
    one group's `up` inside the compare transaction (deploy/compare.py): one plan through `apply`, one ledger
    record, under the cluster lock its caller holds. Replicas take no part in one: refused before anything changes."""
    if req.command in TRANSACTION_COMMANDS:
        if profile.replicas > 1 or is_replicated(d.inventory):
            raise ConfigError(f"{profile.name}: a comparison or tune deploys one group at a time, and "
                              + (f"this profile has replicas: {profile.replicas}" if profile.replicas > 1
                                 else f"cluster {d.inventory.cluster.name} runs a replicated deployment"),
                              hint="a replicated deployment is measured alone, through its router: sparkctl bench")
        return d.up(profile, UpOptions(no_rollback=req.no_rollback, boot_timeout_s=req.boot_timeout_s,
                                       confirm=_single_confirm(confirm, f"deploy {profile.name}")), command=req.command)
    done = _replicated(d, profile, req, confirm)
    if done is not None:
        return done
    return d.up(profile, UpOptions(dry_run=req.dry_run, no_rollback=req.no_rollback,
                                   boot_timeout_s=req.boot_timeout_s,
                                   confirm=_single_confirm(confirm, f"deploy {profile.name}")))


def rollback(d: Deployer, to: Profile | None, req: UpRequest, *, confirm: Confirm,
             failing: DeploymentRecord | None = None) -> UpResult | ReplicatedUpResult:
    """Roll back to `to`, or to the previous known-good deployment. The router and its replicas hold the nodes'
    ports: with replicas running, or `to` replicated, a rollback goes the way `up` does (a rolling update to a
    replicated profile, or the router and replicas down first for one group). `failing` (the watcher's crash loop):
    the deployment that keeps failing, which the rollback never goes to (`Deployer.rollback`)."""
    if is_replicated(d.inventory) or (to is not None and to.replicas > 1):
        if to is None:
            raise ConfigError("the cluster runs a replicated deployment, which keeps no known-good history of "
                              "its own: say where to roll back to", where="rollback",
                              hint="sparkctl rollback --to dflash-off (one group; the router and replicas stop "
                                   "first), or --to a profile with replicas: K (a rolling update)")
        done = _replicated(d, to, UpRequest(boot_timeout_s=req.boot_timeout_s, dry_run=req.dry_run), confirm)
        if done is not None:
            return done
    what = to.name if to else "the previous known-good deployment"
    return d.rollback(to, UpOptions(boot_timeout_s=req.boot_timeout_s, dry_run=req.dry_run,
                                    confirm=_single_confirm(confirm, f"roll back to {what}")), failing=failing)


def restore(d: Deployer, original: str | None, *, progress: Callable[[str], None], say: str) -> JSONObject:
    """The end of a compare transaction (bench --compare, tune): what ran before it (`original`, a deployment id)
    deployed again through `up` (command RESTORE_COMMAND: a no-op only when it still runs healthy under its own
    record, never onto an arm of the same launch; clears the transaction's record), or, when nothing ran before,
    `down`. `say` is the line announcing it. Never raises a SparkctlError: the result says how it went (`ok`, and
    `error` when it did not work), and `ok` is read back from the cluster after it (`read_back`): what the ledger
    says runs, and that it serves, never what the `up` or `down` meant to do."""
    if original is None:
        progress("nothing ran before the tune: bringing the trial deployment down")
        try:
            down(d, confirm=proceed)
            done: JSONObject = {"ok": True, "action": "down"}
        except SparkctlError as exc:
            done = {"ok": False, "action": "down", "error": exc.render()}
        return read_back(d, None, done, progress)
    rec = d.ledger.load(original)
    progress(say.format(profile=rec.profile, id=original))
    try:
        result = up(d, rec.deployed_profile(), UpRequest(command=RESTORE_COMMAND), confirm=proceed)
    except SparkctlError as exc:
        progress(f"restore FAILED: {exc.message}")
        return read_back(d, rec.profile, {"ok": False, "profile": rec.profile, "error": exc.render()}, progress)
    assert isinstance(result, UpResult)              # a restore is one group's up (above)
    return read_back(d, rec.profile, {"ok": True, "profile": rec.profile, "outcome": str(result.outcome),
                                      "deployment": result.deployment, "endpoint": result.endpoint}, progress)


def read_back(d: Deployer, want: str | None, done: JSONObject, progress: Callable[[str], None]) -> JSONObject:
    """`done` (what a restore did) checked against what the cluster runs now: `want` (a profile name; None:
    nothing) active under a record of its own (not a comparison or tune arm) and healthy. The result's `serving`
    is what runs, read back; `ok` is False, with an `error` naming both, when that is not what was wanted."""
    try:
        now = deployed(d)
        serving = None if now.kind == "down" else now.profile
        rec = d.ledger.active() if now.kind == "deployment" else None
        healthy = rec is not None and d.cluster.health_of(rec)[0]
        arm = rec is not None and rec.command == ARM_COMMAND
    except SparkctlError as exc:
        return {**done, "ok": False, "serving": None, "error": f"what runs after the restore could not be read "
                                                                f"back: {exc.message}"}
    out: JSONObject = {**done, "serving": serving, "serving_deployment": rec.id if rec else None}
    if want is None and now.kind != "down":
        out.update(ok=False, error=f"nothing was to run after the restore, yet {now.kind} {serving} runs")
    elif want is not None and (serving != want or arm or not healthy):
        what = ("nothing runs" if now.kind == "down" else
                f"{'an arm of profile' if arm else 'profile'} {serving} runs"
                + ("" if healthy or now.kind != "deployment" else " unhealthy"))
        out.update(ok=False, error=(f"{done['error']}; " if done.get("error") else "")
                   + f"the restore was to leave {want} serving; read back from the cluster: {what}")
    if not out["ok"] and done.get("ok"):
        progress(f"restore FAILED: {out['error']}")
    return out


def down(d: Deployer, *, confirm: Confirm, dry_run: bool = False
         ) -> DownResult | ReplicatedDownResult | DownPlanResult:
    """Stop what runs: the router and every replica, or the active single-group deployment. `dry_run`: what it
    would stop, in order, and nothing changed."""
    if dry_run:
        return _replicas(d).plan_down() if is_replicated(d.inventory) else d.plan_down()
    if is_replicated(d.inventory):
        if not confirm("stop the router and every replica", None):
            raise Declined
        return _replicas(d).down()
    active = d.ledger.active()
    if active and not confirm(f"stop {active.id} ({active.profile})", None):
        raise Declined
    return d.down()


def preflight(d: Deployer, profile: Profile) -> list[CheckResult]:
    """Read-only checks of what `up` of `profile` would start: one group's ranks, or every replica's (each through
    its own cluster, after the replicas' and the router's layout); raises PreflightError."""
    if profile.replicas > 1:
        return _replicas(d).preflight(profile)
    return d.preflight(profile)


def status(d: Deployer) -> StatusResult | ReplicatedStatusResult:
    """What runs and how it is; `ok` False (exit 8 in the CLI) when it is unhealthy or was interrupted."""
    if is_replicated(d.inventory):
        return _replicas(d).status()
    return d.status()


def logs(d: Deployer, *, rank: int, tail: int, follow: bool, replica: int | None = None,
         router: bool = False) -> Iterator[str]:
    """A rank's engine log of the active deployment; replicated: replica `replica`'s rank log or the router's."""
    if is_replicated(d.inventory):
        if router and replica is not None:
            raise ConfigError("--router and --replica name different logs: give one of them",
                              hint="sparkctl logs --router, or sparkctl logs --replica I --rank N")
        return _replicas(d).follow_log(replica=replica, rank=rank, router=router, tail=tail, follow=follow)
    if router or replica is not None:
        raise ConfigError(f"{'--router' if router else '--replica'}: cluster {d.inventory.cluster.name} runs no "
                          f"replicated deployment (one group, no router)",
                          hint="sparkctl logs --rank N shows its ranks' logs")
    return d.follow_log(rank, tail=tail, follow=follow)
