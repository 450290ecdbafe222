"""The router as a container on rank 0's node (the docker runtime): `docker run` of the engine image the replicas
run, over the node's SSH connector (argv lists, like the engines' containers in `sparkctl.nodes.docker_runtime`).

* Name ``sparkctl-<cluster>-router`` (one router per cluster): a container a dead controller left is found by that
  name and by the record's container ID, never duplicated. One still running the same launch (label
  ``sparkctl.router-identity``: the hash of image + arguments) is kept; any other is replaced.
* Ready when ``/liveness`` answers at the router's URL as the controller reaches it (`RouterSpec.url`: the node's
  address when the router binds 0.0.0.0); a container that exits while starting fails at once with its log tail.
* Stopped with ``docker rm -f`` by the recorded container ID, and only a container labelled
  ``sparkctl.role=router`` (`removable`): a recorded ID that now names something else is left alone.
* Its log: ``docker logs --tail N`` (the container's stdout and stderr).

Example::

    rc = RouterContainer.start(spec, inventory, image="sglang-gb10:ab12")
    rc.alive(); rc.log_tail(); record["router"] = rc.to_dict()
    RouterContainer.from_dict(spec, inventory, record["router"]).stop()
"""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeGuard

import httpx

from sparkctl.jsontypes import JSONObject
from sparkctl.nodes import docker_facts
from sparkctl.router import RouterError, strip_colour
from sparkctl.router.spec import CLUSTER_LABEL, IDENTITY_LABEL, ROLE, ROLE_LABEL, RouterSpec
from sparkctl.tls import tls_context

if TYPE_CHECKING:
    from sparkctl.nodes.ssh import CommandResult

log = logging.getLogger("sparkctl.router")
RUNTIME = "container"


class Runner(Protocol):
    """What the container needs of a node connector (`sparkctl.nodes.ssh.SSHConnector` is one)."""

    def run(self, argv: Sequence[str], *, check: bool = False, timeout: float | None = 60.0,
            merge_stderr: bool = False) -> CommandResult: ...


def router_container_name(cluster: str) -> str:
    """``sparkctl-<cluster>-router`` (Docker's name charset; one router per cluster)."""
    safe = re.sub(r"[^a-zA-Z0-9_.-]+", "-", cluster).strip("-.") or "cluster"
    return f"sparkctl-{safe}-router"


def removable(state: docker_facts.ContainerState | None) -> TypeGuard[docker_facts.ContainerState]:
    """Only a container sparkctl started as a router may be removed by the router's stop."""
    return state is not None and state.labels.get(ROLE_LABEL) == ROLE


def start_move(old: docker_facts.ContainerState | None, spec: RouterSpec, image: str) -> str:
    """What `start` does with the container already holding the router's name: ``run`` (none), ``keep`` (a
    router running this very launch: a dead controller's), ``replace`` (a router of another launch, or stopped),
    ``refuse`` (not a router: never removed)."""
    if old is None:
        return "run"
    if not removable(old):
        return "refuse"
    if old.running and old.labels.get(IDENTITY_LABEL) == spec.identity(image):
        return "keep"
    return "replace"


@dataclass
class RouterContainer:
    spec: RouterSpec
    node: str                      # rank 0's node (inventory name)
    runner: Runner
    name: str
    container_id: str
    image: str

    runtime = RUNTIME
    kept = False                   # start found this very launch running (a dead controller's) and kept it

    # ---- record --------------------------------------------------------------------------------------------
    def to_dict(self) -> JSONObject:
        return {"runtime": RUNTIME, "node": self.node, "container": self.name, "container_id": self.container_id,
                "image": self.image, "argv": self.spec.args()}

    @classmethod
    def from_dict(cls, spec: RouterSpec, runner: Runner, d: JSONObject) -> RouterContainer:
        """The router a previous controller started (read from its record): liveness and stop by container ID."""
        return cls(spec, str(d["node"]), runner, str(d["container"]), str(d.get("container_id") or d["container"]),
                   str(d.get("image", "")))

    @property
    def where(self) -> str:
        return f"container {self.name} on {self.node}"

    # ---- start ---------------------------------------------------------------------------------------------
    @classmethod
    def start(cls, spec: RouterSpec, runner: Runner, *, node: str, cluster: str, image: str,
              ready_timeout_s: float = 60.0) -> RouterContainer:
        """Run the router (or keep the one a dead controller left running this very launch) and wait until it is
        live. RouterError names the node, the container and the log tail when it does not come up."""
        name = router_container_name(cluster)
        old = _inspect(runner, name, node)
        move = start_move(old, spec, image)
        if move == "refuse":
            raise RouterError(f"a container named {name} on {node} is not a sparkctl router (no {ROLE_LABEL}="
                              f"{ROLE} label)", where=f"[{node}] docker",
                              hint=f"rename or remove that container (docker rm -f {name}), then run up again")
        if move == "keep" and old is not None:
            log.info("[%s] router container %s already runs this launch: kept", node, name)
            rc = cls(spec, node, runner, name, old.id, image)
            rc.kept = True
        else:
            if old is not None:
                log.info("[%s] replacing router container %s (%s)", node, name, old.describe())
                _rm(runner, old.id, node)
            res = runner.run(spec.container_argv(image, name, cluster=cluster), timeout=120)
            if res.returncode != 0:
                runner.run(["docker", "rm", "--force", name])       # docker run may leave it created
                low = res.stderr.lower()
                hint = (f"the router runs from the engine image the replicas run; {image} is not on {node} yet "
                        f"(the image stage puts it there)" if "no such image" in low else
                        "read the docker error below")
                raise RouterError(f"docker run of the router ({name}) failed, exit {res.returncode}",
                                  where=f"[{node}] docker", hint=hint, evidence=res.output[-2000:])
            cid = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else name
            rc = cls(spec, node, runner, name, cid, image)
        try:
            rc.wait_live(ready_timeout_s)
        except BaseException:       # not live, or interrupted while waiting: nothing of it outlives the start
            rc.stop()
            raise
        return rc

    # ---- observe -------------------------------------------------------------------------------------------
    def state(self) -> docker_facts.ContainerState | None:
        return _inspect(self.runner, self.container_id, self.node)

    def alive(self) -> bool:
        """The recorded container exists, is a router, and runs."""
        st = self.state()
        return removable(st) and bool(st and st.running)

    def wait_live(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while True:
            try:
                live = httpx.get(self.spec.url + "/liveness", timeout=1.0, trust_env=False, verify=tls_context())
                if live.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            st = self.state()
            if st is None or not st.running:
                raise RouterError(f"router container {self.name} on {self.node} "
                                  f"{'is gone' if st is None else st.describe()} while starting",
                                  where=f"[{self.node}] docker logs {self.name}", evidence=self.log_tail())
            if time.monotonic() >= end:
                raise RouterError(f"router container {self.name} not live on {self.spec.url} within "
                                  f"{timeout_s:g}s", where=f"[{self.node}] docker logs {self.name}",
                                  hint="is the router's port reachable from the controller?",
                                  evidence=self.log_tail())
            time.sleep(0.2)

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of its Docker log (stdout and stderr), colour codes stripped."""
        res = self.runner.run(["docker", "logs", "--tail", str(lines), self.container_id], merge_stderr=True)
        return strip_colour(res.stdout).rstrip("\n") if res.returncode == 0 else ""

    # ---- stop ----------------------------------------------------------------------------------------------
    def stop(self, timeout_s: float = 10.0) -> bool:
        """``docker rm -f`` of the recorded container, only when it is labelled a router; False when there was
        nothing of ours to remove (gone already, or the ID now names another container: left alone)."""
        st = self.state()
        if not removable(st):
            if st is not None:
                log.warning("[%s] %s is not a router container (no %s=%s): left alone", self.node,
                            self.container_id[:12], ROLE_LABEL, ROLE)
            return False
        _rm(self.runner, st.id, self.node, timeout=timeout_s + 60)
        return True


def _inspect(runner: Runner, ref: str, node: str) -> docker_facts.ContainerState | None:
    fact = docker_facts.container_state(ref)
    res = runner.run(list(fact.argv))
    if res.returncode != 0:
        if "no such" in res.stderr.lower():
            return None
        raise RouterError(f"docker inspect {ref} failed on {node} (exit {res.returncode})",
                          where=f"[{node}] docker", evidence=res.output[-2000:])
    return fact.parse(res.stdout)


def _rm(runner: Runner, cid: str, node: str, timeout: float = 60.0) -> None:
    res = runner.run(["docker", "rm", "--force", cid], timeout=timeout)
    if res.returncode != 0 and "no such container" not in res.stderr.lower():
        raise RouterError(f"docker rm -f {cid[:12]} (the router) failed on {node}", where=f"[{node}] docker",
                          evidence=res.output[-2000:])


def labelled_routers(runner: Runner, cluster: str) -> list[str]:
    """IDs of the router containers of ``cluster`` on the node (running or not): what a test or `repair` finds
    when the record is gone."""
    res = runner.run(["docker", "ps", "-a", "--no-trunc", "--filter", f"label={ROLE_LABEL}={ROLE}",
                      "--filter", f"label={CLUSTER_LABEL}={cluster}", "--format", "{{.ID}}"], check=True)
    return res.stdout.split()
