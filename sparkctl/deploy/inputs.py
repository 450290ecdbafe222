"""What a deployment's launch takes from outside its record, kept at deploy time and checked again before an
unattended restart (door's `as_recorded`), so that the watcher never starts something other than what was deployed:

* **secrets**: the value of each secret variable the launch used (the profile's `api.api_key_env` and
  `api.hf_token_env`, when set) is kept as a fingerprint only: HMAC-SHA256 under a random key of this deployment,
  both in its 0600 record (`DeploymentRecord.secrets`). A variable unset now, or set to another value (a rotated
  key), is named by `unresolved_secrets`; its value is never stored, compared in the clear, or printed.
* **node paths**: every path on a node the launch names (the model, the drafter, any other argv value under the
  models mount such as a chat template, and the models mount itself) that was there when it deployed
  (`DeploymentRecord.needed`). `missing_paths` asks each node again, all nodes at once within one total deadline:
  a process-runtime node is this machine, a docker node is asked over its SSH connector (`test -e`, argv, never a
  shell string). What was absent at deploy time (an emulator's model) is not asked for: only what the deployment
  had.

Example::

    record.secrets = fingerprint(profile.api, os.environ)
    record.needed = present(inventory, specs, deadline_s=30)
    missing, changed = unresolved_secrets(record)        # before a restart
    gone = missing_paths(inventory, record, deadline_s=30)
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets as _secrets
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sparkctl.errors import PreflightError, SparkctlError
from sparkctl.nodes.node_facts import host_model_path, model_paths
from sparkctl.nodes.ssh import connector_for
from sparkctl.sglang.render import MODELS_MOUNT
from sparkctl.state.records import NodePath, SecretPrints

if TYPE_CHECKING:
    from sparkctl.config.inventory import Inventory, Node
    from sparkctl.config.profile import ApiSettings
    from sparkctl.jsontypes import JSONObject
    from sparkctl.sglang.launch import LaunchSpec
    from sparkctl.state.records import DeploymentRecord

PROBE_DEADLINE_S = 30.0       # every node's path checks of one deployment, in total (the watcher passes its own)


# ---- secrets ------------------------------------------------------------------------------------------------------
def secret_names(api: ApiSettings | JSONObject) -> list[str]:
    """The variables holding a deployment's secrets, as its profile names them (api_key_env, hf_token_env)."""
    get = api.get if isinstance(api, dict) else (lambda k: getattr(api, k, None))
    return [str(n) for n in (get("api_key_env"), get("hf_token_env")) if n]


def _print(key: str, value: str) -> str:
    # surrogatepass: a variable holding bytes that are not UTF-8 (os.environ decodes them to lone surrogates)
    return hmac.new(bytes.fromhex(key), value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def fingerprint(api: ApiSettings, environ: Mapping[str, str] | None = None) -> SecretPrints | None:
    """Fingerprints of the secret values set in `environ` for `api`'s variables (None when none is set)."""
    env = os.environ if environ is None else environ
    names = [n for n in secret_names(api) if env.get(n)]
    if not names:
        return None
    key = _secrets.token_hex(32)
    return SecretPrints(key=key, prints={n: _print(key, env[n]) for n in names})


def unresolved_secrets(record: DeploymentRecord, environ: Mapping[str, str] | None = None
                       ) -> tuple[list[str], list[str]]:
    """(unset, changed): the secret variables `record` was deployed with that are not set in `environ` now, and
    those set to another value than at deploy time. A record written before fingerprints were kept answers for
    neither (door's comparison of the rendered ranks still sees a variable gone)."""
    env = os.environ if environ is None else environ
    kept = record.secrets
    if kept is None:
        return [], []
    unset = sorted(n for n in kept.prints if not env.get(n))
    changed = sorted(n for n, p in kept.prints.items()
                     if env.get(n) and not hmac.compare_digest(_print(kept.key, env[n]), p))
    return unset, changed


# ---- node paths ---------------------------------------------------------------------------------------------------
def referenced_paths(argv: list[str]) -> list[tuple[str, str]]:
    """(what, path as the engine sees it) for every path a rank's argv names that lives on its node: the model and
    the drafter (any absolute path), and any other flag's value under the models mount (a chat template, a
    tokenizer), `--flag=value` spellings included."""
    out = list(model_paths(argv))
    seen = {p for _, p in out}
    for i, arg in enumerate(argv):
        flag, value = (arg.split("=", 1) if arg.startswith("--") and "=" in arg
                       else (argv[i - 1] if i and argv[i - 1].startswith("--") else "argument", arg))
        if (value == MODELS_MOUNT or value.startswith(MODELS_MOUNT + "/")) and value not in seen:
            seen.add(value)
            out.append((flag, value))
    return out


def needed_paths(spec: LaunchSpec, node: Node) -> list[NodePath]:
    """The node paths rank `spec` needs on `node`: a /models/... path where the node keeps it (host_paths.models),
    any other absolute path as itself on a process-runtime node (it is this machine); on a docker node a path
    outside the mount is inside the image, not the node's to check. The models mount itself comes first."""
    models = node.host_paths.models
    out = [NodePath(node=node.name, what="models mount", path=MODELS_MOUNT, host=models)]
    for what, path in referenced_paths(spec.argv):
        host = host_model_path(path, models)
        if host is None and node.runtime == "process" and path.startswith("/"):
            host = path
        if host is not None and host != models:
            out.append(NodePath(node=node.name, what=what, path=path, host=host))
    return out


def _exists(inventory: Inventory, node: Node, hosts: list[str], timeout: float) -> list[bool]:
    if node.runtime == "process":
        return [os.path.exists(h) for h in hosts]
    results = connector_for(inventory, node).run_many([["test", "-e", h] for h in hosts], timeout=timeout)
    return [r.returncode == 0 for r in results]


def _probe(inventory: Inventory, paths: list[NodePath], deadline_s: float,
           errors: dict[str, str] | None = None) -> dict[tuple[str, str], bool]:
    """Whether each path exists on its node, every node at once within `deadline_s` in total. A node that did not
    answer in time, or whose connector failed (its first line in `errors`), has no entry."""
    by_node: dict[str, list[str]] = {}
    for p in paths:
        by_node.setdefault(p.node, []).append(p.host)
    found: dict[tuple[str, str], bool] = {}
    lock = threading.Lock()

    def ask(name: str, hosts: list[str]) -> None:
        try:
            got = _exists(inventory, inventory.node(name), hosts, deadline_s)
        except (SparkctlError, OSError) as exc:
            if errors is not None:
                errors[name] = (exc.message if isinstance(exc, SparkctlError) else str(exc)).splitlines()[0][:200]
            return
        with lock:
            found.update({(name, h): ok for h, ok in zip(hosts, got, strict=True)})
    threads = [threading.Thread(target=ask, args=(n, hs), name=f"sparkctl-paths-{n}", daemon=True)
               for n, hs in by_node.items()]
    end = time.monotonic() + deadline_s
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    with lock:
        return dict(found)


def present(inventory: Inventory, specs: list[LaunchSpec], *, deadline_s: float = PROBE_DEADLINE_S
            ) -> list[NodePath]:
    """The node paths the ranks need that are there now (what a deployment made now has): recorded by `up`."""
    wanted = [p for s in specs for p in needed_paths(s, inventory.node(s.node))]
    found = _probe(inventory, wanted, deadline_s)
    return [p for p in wanted if found.get((p.node, p.host))]


def missing_paths(inventory: Inventory, record: DeploymentRecord, *, deadline_s: float = PROBE_DEADLINE_S
                  ) -> list[NodePath]:
    """The paths `record` had when it deployed that its nodes no longer have. PreflightError (nothing changed;
    not a refusal: the node may come back) when a node did not answer within `deadline_s`."""
    if not record.needed:
        return []
    errors: dict[str, str] = {}
    found = _probe(inventory, record.needed, deadline_s, errors)
    silent = sorted({p.node for p in record.needed if (p.node, p.host) not in found})
    if silent:
        why = "; ".join(f"{n}: {errors[n]}" if n in errors else f"{n}: no answer within {deadline_s:g}s"
                        for n in silent)
        raise PreflightError(f"the files {record.id} needs could not be checked on {', '.join(silent)} ({why})",
                             where=f"deployment {record.id}",
                             hint="check that the node is up and reachable (sparkctl doctor); the watcher tries "
                                  "again after its backoff")
    return [p for p in record.needed if not found[(p.node, p.host)]]
