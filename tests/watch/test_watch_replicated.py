"""A replicated deployment (2 x TP=1 behind the real sglang-router) under the watcher: a replica's engine killed
is redeployed alone through the replicated `up` (out of the router, its own `up` and gates, back in) while a client
loop through the router sees no failed request, and a router that died is started again; the router's endpoint
generates through both replicas afterwards."""
from __future__ import annotations

import json
import os
import re
import signal

import httpx

from sparkctl.state.ledger import Ledger
from sparkctl.state.replicated import Record
from testrig.embedded import stop_cluster_engines, write_replicated_profile
from testrig.handles import active, pid_of
from testrig.testenv import need_module
from testrig.watchrig import ledger_of, polls_after, wait_until

need_module("sglang_router", "the router extra (sglang-router) is not installed")


def _status(cli) -> tuple[int, dict]:
    code, out, _ = cli("status", "--json")
    return code, json.loads(out)


def _generates(endpoint: str) -> bool:
    r = httpx.post(endpoint + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 4}}, timeout=30)
    return r.status_code == 200


class _ClientLoop:
    """Generations through the router, one after another on a thread, until the block ends: how many answered
    200 and what every other one got (a status or the error)."""

    def __init__(self, endpoint: str) -> None:
        import threading
        self.endpoint, self.ok = endpoint, 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                r = httpx.post(self.endpoint + "/generate", json={"text": "hi", "sampling_params": {
                    "max_new_tokens": 4}}, timeout=30)
                if r.status_code == 200:
                    self.ok += 1
                else:
                    self.failed.append(f"{r.status_code}: {r.text[:200]}")
            except httpx.HTTPError as exc:
                self.failed.append(repr(exc))
            self._stop.wait(0.05)

    def __enter__(self) -> _ClientLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def test_a_replica_killed_and_the_router_killed_are_brought_back(cli, local_cluster, profiles_dir, watcher):
    write_replicated_profile(profiles_dir / "rep.yml", 16)
    code, out, err = cli("up", "--profile", "rep", "--yes", "--json")
    assert code == 0, err
    endpoint = json.loads(out)["endpoint"]
    root = ledger_of(local_cluster).root
    rec = Record.load(root).doc
    try:
        run = watcher()
        assert "desired state replicated:rep" in run.stderr
        replica0 = Ledger.for_cluster(rec.replicas[0].cluster)
        old = active(replica0)
        with _ClientLoop(endpoint) as client:      # a client the whole time: the router serves from replica 1
            os.kill(pid_of(old, 0), signal.SIGKILL)
            run.wait_for(r"detected: replicated:rep is not serving \(replica\): replica 0 unhealthy")
            run.wait_for(r"restarted replicated:rep as ", timeout=120)
        assert client.ok >= 5 and client.failed == [], (client.ok, client.failed[:5])
        assert "replica 0: out of the router" in run.stderr and "replica 0: back into the router" in run.stderr
        assert run.stderr.count("restarting replicated:rep") == 1      # a dead replica is not waited for (drain)
        assert "replica 1: out of the router" not in run.stderr          # the healthy one kept serving
        code, st = _status(cli)
        assert code == 0 and st["healthy"] and st["router"]["healthy_workers"] == 2, st
        assert active(replica0).id != old.id and st["watcher"]["restarts"] == 1
        os.kill(Record.load(root).doc.model_dump(mode="json")["router"]["pid"], signal.SIGKILL)
        run.wait_for(r"detected: replicated:rep is not serving \(router\)", after=r"restarted replicated:rep")
        wait_until(lambda: run.stderr.count("restarted replicated:rep as ") == 2, "the router started again", 120)
        code, st = _status(cli)
        assert code == 0 and st["healthy"] and st["router"]["healthy_workers"] == 2, st
        assert re.search(r"router-start", run.stderr) and _generates(endpoint)
        code, _, err = cli("down", "--yes")               # and a user's down of it stays down
        assert code == 0, err
        run.wait_for(r"followed a command: desired state replicated:rep -> down")
        polls_after(root, 5)
        assert run.stderr.count("restarting replicated:rep") == 2, run.stderr
        assert Record.load(root).doc.model_dump(mode="json").get("router") is None
    finally:
        code, _, err = cli("down", "--yes")
        assert code == 0, err
        from sparkctl.config.inventory import load_inventory
        from sparkctl.deploy.replicated import replica_inventory
        for entry in rec.replicas:
            stop_cluster_engines(replica_inventory(load_inventory(local_cluster), entry))


def test_a_replica_restart_is_the_recorded_profile_never_the_file_edited_since(cli, local_cluster, profiles_dir,
                                                                               watcher):
    """Issue 31: a replicated restart re-read the profile file and rolled saved-but-undeployed edits out, to the
    healthy replica too. Now the record keeps the profile as deployed and the restart deploys exactly that."""
    write_replicated_profile(profiles_dir / "rep.yml", 16)
    code, out, err = cli("up", "--profile", "rep", "--yes", "--json")
    assert code == 0, err
    root = ledger_of(local_cluster).root
    rec = Record.load(root).doc
    assert (rec.profile_data or {})["server"]["max_running_requests"] == 16
    try:
        ledgers = [Ledger.for_cluster(r.cluster) for r in rec.replicas]
        before = [active(lg) for lg in ledgers]
        write_replicated_profile(profiles_dir / "rep.yml", 32)          # saved, never deployed
        run = watcher()
        os.kill(pid_of(before[0], 0), signal.SIGKILL)
        run.wait_for(r"restarted replicated:rep as ", timeout=120)
        after = [active(lg) for lg in ledgers]
        assert after[1].id == before[1].id, "the healthy replica was left alone"
        assert "replica 1: out of the router" not in run.stderr
        assert after[0].id != before[0].id and after[0].profile_data == before[0].profile_data
        assert Record.load(root).doc.model_dump(mode="json")["profile_data"]["server"]["max_running_requests"] == 16
        code, st = _status(cli)
        assert code == 0 and st["healthy"], st
    finally:
        code, _, err = cli("down", "--yes")
        assert code == 0, err
        from sparkctl.config.inventory import load_inventory
        from sparkctl.deploy.replicated import replica_inventory
        for entry in rec.replicas:
            stop_cluster_engines(replica_inventory(load_inventory(local_cluster), entry))
