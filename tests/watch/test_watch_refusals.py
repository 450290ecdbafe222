"""Issue 31, item 3: what the watcher's restart cannot resolve makes it refuse loudly, never start something weaker.

Generated over every kind of unresolvable input (`INPUTS`: a secret's variable missing, a secret's value changed
since the deployment, each node path the launch had at deploy time gone: the models mount, the model, the drafter, a
chat template named in extra_args) x the watcher's restart paths (`SHAPES`: one TP group; replicas behind the
router), on the embedded cluster (emulator engines, real processes), a watcher driven poll by poll in this process,
its metrics served over HTTP and its webhook a real server on loopback. After each cell:

* nothing was started: no new deployment record on any ledger (the cluster's, each replica's), the engines that
  survived the kill are the same processes;
* the refusal shows in all four places, naming the variable or the path and its cause: the watcher's log line
  (stderr and watch.log), `sparkctl status` (exit 8, `watcher.refused`, the human `REFUSES` line), the metrics
  (`sparkctl_watch_restart_refused` 1, `sparkctl_watch_refusals_total{cause}`), the webhook's `refused` event;
* no secret value (as deployed, or the rotated one) appears in any file of the state directory (apart from the
  running engines' own 0400 secret files, which is how the key reaches them), the logs, the webhook's bodies or
  `status`' output.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from sparkctl.config.inventory import load_inventory
from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.observe import process_engines
from sparkctl.deploy.replicated import replica_inventory
from sparkctl.state.ledger import Ledger
from sparkctl.state.replicated import Record
from testrig.handles import active, pid_of
from testrig.testenv import need_module
from testrig.watchrig import Hook, alive, metric, wait_until

need_module("prometheus_client", "the watcher's metrics (the `watch` extra)")

API_KEY = "sk-refuse-5eb1c0ffee0042"
HF_TOKEN = "hf_refuse0c0ffee77token"
ROTATED = "-rotated-77aa"
MODEL, DRAFTER, TEMPLATE = "GLM-5.3-Flash-NVFP4", "GLM-5.3-Flash-DFlash2", "chat.jinja"

# input -> (the refusal's cause, what it must name)
INPUTS: dict[str, tuple[str, str]] = {
    "secret-missing": ("secret-missing", "{var}"),
    "secret-changed": ("secret-changed", "{var}"),
    "models-mount-gone": ("file-missing", "models mount /models"),
    "model-gone": ("file-missing", f"/models/{MODEL}"),
    "drafter-gone": ("file-missing", f"/models/{DRAFTER}"),
    "chat-template-gone": ("file-missing", f"/models/{TEMPLATE}"),
}
SHAPES = ("single", "replicated")


@dataclass
class Deployed:
    shape: str
    root: Path
    ledgers: list[Ledger]           # the cluster's, and each replica's
    clusters: list[Cluster]         # the same, to find their engine processes (the rank logs they write)
    victim: int                     # the pid the test kills
    survivors: list[int]            # processes a restart would have replaced: still the same (the router)
    var: str                        # the secret variable this shape's deployment was made with

    def engines(self) -> set[int]:
        """Every engine process of the cluster and its replicas that runs now."""
        return {e.handle.pid for c in self.clusters for e in process_engines(c)}   # type: ignore[union-attr]


def _models(tmp_path: Path) -> Path:
    models = tmp_path / "models"
    for d in (MODEL, DRAFTER):
        (models / d).mkdir(parents=True)
        (models / d / "config.json").write_text("{}")
    (models / TEMPLATE).write_text("{{ messages }}")
    return models


def _inventory(inv: Path, models: Path) -> None:
    doc = yaml.safe_load(inv.read_text())
    for host in doc["all"]["children"]["sparks"]["hosts"].values():
        host["host_paths"] = {"models": str(models)}
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))


def _deploy(shape: str, cli, inv: Path, profiles_dir: Path, monkeypatch) -> Deployed:
    extra = f'  extra_args: ["--chat-template", "/models/{TEMPLATE}"]\n'
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    if shape == "single":
        monkeypatch.setenv("SPARKCTL_API_KEY", API_KEY)
        (profiles_dir / "cell.yml").write_text(f"extends: d5\nserver:\n{extra}")
    else:                          # a replicated deployment takes no API key (the router does not pass one)
        monkeypatch.delenv("SPARKCTL_API_KEY", raising=False)
        (profiles_dir / "cell.yml").write_text(
            "extends: d5\nreplicas: 2\nserver:\n  tp_size: 1\n  max_running_requests: 16\n" + extra
            + "router:\n  policy: round_robin\n  health_check_interval_s: 1\n  drain_timeout_s: 60\n"
              "warmup:\n  requests: 1\n  max_tokens: 16\n")
    code, out, err = cli("up", "--profile", "cell", "--yes", "--json")
    assert code == 0, err
    main = Ledger.for_cluster(load_inventory(inv).cluster.name)
    if shape == "single":
        rec = active(main)
        assert rec.secrets is not None and set(rec.secrets.prints) == {"SPARKCTL_API_KEY", "HF_TOKEN"}
        assert {p.what for p in rec.needed} >= {"models mount", "model", "drafter", "--chat-template"}, rec.needed
        return Deployed(shape, main.root, [main], [Cluster(load_inventory(inv))], pid_of(rec, 1), [],
                        "SPARKCTL_API_KEY")
    data = Record.load(main.root).doc
    replicas = [Ledger.for_cluster(r.cluster) for r in data.replicas]
    recs = [active(lg) for lg in replicas]
    assert all(r.needed and r.secrets and set(r.secrets.prints) == {"HF_TOKEN"} for r in recs)
    subs = [Cluster(replica_inventory(load_inventory(inv), r)) for r in data.replicas]
    return Deployed(shape, main.root, [main, *replicas], subs, pid_of(recs[0], 0),
                    [pid_of(recs[1], 0), (Record.load(main.root).router_entry() or {})["pid"]], "HF_TOKEN")


def _make_unresolvable(what: str, dep: Deployed, models: Path, monkeypatch) -> None:
    if what == "secret-missing":
        monkeypatch.delenv(dep.var)
    elif what == "secret-changed":              # the key rotated in the watcher's environment
        monkeypatch.setenv(dep.var, os.environ[dep.var] + ROTATED)
    elif what == "models-mount-gone":           # the mount came off
        models.rename(models.with_name("models.off"))
    elif what == "model-gone":                  # the model moved
        (models / MODEL).rename(models / f"{MODEL}.moved")
    elif what == "drafter-gone":
        shutil.rmtree(models / DRAFTER)
    elif what == "chat-template-gone":
        (models / TEMPLATE).unlink()


def _records(dep: Deployed) -> list[list[str]]:
    return [sorted(lg.record_ids()) for lg in dep.ledgers]


def _no_secret_anywhere(state_dir: Path, texts: list[str]) -> None:
    values = [API_KEY, HF_TOKEN, API_KEY + ROTATED, HF_TOKEN + ROTATED]
    for path in state_dir.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        if "secrets" in path.relative_to(state_dir).parts:      # a running engine's own secret file: 0400, its key
            assert stat.S_IMODE(path.stat().st_mode) == 0o400, path
            continue
        data = path.read_bytes()
        leaked = [v for v in values if v.encode() in data]
        assert not leaked, f"{path} holds a secret value"
    for text in texts:
        assert not [v for v in values if v in text], text[-2000:]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("unresolvable", list(INPUTS))
def test_an_unresolvable_restart_is_refused_loudly_and_starts_nothing(unresolvable, shape, cli, local_cluster,
                                                                      profiles_dir, state_dir, tmp_path,
                                                                      monkeypatch):
    from sparkctl.watch.log import WatchLog, WatchReporter
    from sparkctl.watch.metrics import WatchMetrics
    from sparkctl.watch.notify import Notifier
    from sparkctl.watch.supervisor import Watcher, WatchOptions

    models = _models(tmp_path)
    _inventory(local_cluster, models)
    hook, metrics, w, dep = Hook(), None, None, None
    try:
        dep = _deploy(shape, cli, local_cluster, profiles_dir, monkeypatch)
        stream = io.StringIO()
        metrics = WatchMetrics(0, cluster=dep.root.name)
        w = Watcher(load_inventory(local_cluster), WatchReporter(WatchLog(dep.root / "watch.log"), stream),
                    WatchOptions(interval_s=0.1, backoff_s=1.0, backoff_max_s=2.0, fail_checks=1, node_deadline_s=5),
                    metrics=metrics, notifier=Notifier(hook.url, timeout_s=30))
        w.begin()
        before = _records(dep)
        engines = dep.engines()
        _make_unresolvable(unresolvable, dep, models, monkeypatch)
        os.kill(dep.victim, signal.SIGKILL)
        wait_until(lambda: not alive(dep.victim), "the engine killed", 20)
        end = time.monotonic() + 90
        while not (w.state.last_action or "").startswith("REFUSED"):
            assert time.monotonic() < end, stream.getvalue()[-3000:]
            assert not (w.state.last_action or "").startswith(("restarted ", "restart of ")), stream.getvalue()
            w._poll_once()
            time.sleep(0.05)
        for _ in range(3):                             # and it goes on checking, refusing, never starting
            w._poll_once()

        cause, named = INPUTS[unresolvable]
        named = named.format(var=dep.var)
        # nothing was started: no record anywhere, no engine process that did not run before, the survivors (the
        # router, the healthy replica) the same processes (a TP group's own rank 0 may follow its dead peer: the
        # emulator's peer timeout, as SGLang's)
        assert _records(dep) == before
        assert dep.engines() <= engines - {dep.victim}, (dep.engines(), engines)
        assert all(alive(pid) for pid in dep.survivors) and not alive(dep.victim)
        assert w.state.restarts == 0 and w.state.failures == 0
        # the log line, on stderr and in watch.log
        log = stream.getvalue()
        line = next(ln for ln in log.splitlines() if "REFUSED to restart" in ln)
        assert f"({cause})" in line and named in line and "nothing was started" in line, line
        assert line.split("REFUSED", 1)[1] in (dep.root / "watch.log").read_text()
        # status: not ok (exit 8), the field, the human line
        code, out, _ = cli("status", "--json")
        st = json.loads(out)
        assert code == 8 and not st["ok"] and named in st["watcher"]["refused"], st
        hcode, human, _ = cli("status")
        assert hcode == 8 and "watcher REFUSES to restart" in human and named in human, human
        # the metrics
        assert metric(metrics.url, "sparkctl_watch_restart_refused") == 1
        assert (metric(metrics.url, "sparkctl_watch_refusals_total", cause=cause) or 0) >= 1
        assert (metric(metrics.url, "sparkctl_watch_restarts_total", outcome="refused") or 0) >= 1
        # the webhook, received by a real server
        event = wait_until(lambda: next((e for e in hook.events if e["event"] == "refused"), None),
                           "the refused event", 15)
        assert event["cause"] == cause and named in event["error"] and named in event["refused"], event
        # no secret value anywhere
        _no_secret_anywhere(state_dir, [log, out, human, *(b.decode(errors="replace") for b in hook.bodies)])
    finally:
        if metrics is not None:
            metrics.close()
        if w is not None and w.outbox is not None:
            w.outbox.close(0.5)
        hook.close()
        _stop(dep, cli, local_cluster)


def _stop(dep: Deployed | None, cli, inv: Path) -> None:
    if dep is None or dep.shape == "single":
        return                                   # local_cluster's teardown stops the cluster's engines
    from testrig.embedded import stop_cluster_engines
    data = Record.load(dep.root).doc
    cli("down", "--yes")
    for entry in data.replicas:
        stop_cluster_engines(replica_inventory(load_inventory(inv), entry))


def test_serving_again_clears_a_refusal_and_a_crash_loop_is_not_rolled_back_onto_a_rotated_key(
        cli, local_cluster, profiles_dir, state_dir, tmp_path, monkeypatch):
    """A refusal lasts while it is true: rank 1 SIGSTOPped with the key rotated in the watcher's environment is
    refused; SIGCONT, the group serves again on its own, and the refusal is cleared (status ok, the gauge 0). The
    crash loop's rollback is held to the same rule: after the watcher's own restart served (the key as deployed),
    the key rotated and the group died within the window (a flap; the crash loop at max_failures 1): it gives up
    without rolling back, naming the variable."""
    from sparkctl.watch.log import WatchLog, WatchReporter
    from sparkctl.watch.metrics import WatchMetrics
    from sparkctl.watch.supervisor import Watcher, WatchOptions
    from testrig.watchrig import engine_pid

    models = _models(tmp_path)
    _inventory(local_cluster, models)
    metrics = None
    stopped: list[int] = []
    try:
        dep = _deploy("single", cli, local_cluster, profiles_dir, monkeypatch)
        stream = io.StringIO()
        metrics = WatchMetrics(0, cluster=dep.root.name)
        w = Watcher(load_inventory(local_cluster), WatchReporter(WatchLog(dep.root / "watch.log"), stream),
                    WatchOptions(interval_s=0.1, backoff_s=0.5, backoff_max_s=1.0, fail_checks=1, max_failures=1,
                                 node_deadline_s=5), metrics=metrics)
        w.begin()

        def poll_until(pred, what: str) -> None:
            end = time.monotonic() + 90
            while not pred():
                assert time.monotonic() < end, f"no {what}:\n" + stream.getvalue()[-3000:]
                w._poll_once()
                time.sleep(0.05)
        monkeypatch.setenv("SPARKCTL_API_KEY", API_KEY + ROTATED)
        engine = engine_pid(dep.victim)
        os.kill(engine, signal.SIGSTOP)
        stopped.append(engine)
        poll_until(lambda: w.state.refused, "refusal")
        assert w.state.refused is not None
        assert "SPARKCTL_API_KEY" in w.state.refused and metric(metrics.url, "sparkctl_watch_restart_refused") == 1
        os.kill(engine, signal.SIGCONT)                              # the same engines serve again, on their own
        stopped.clear()
        poll_until(lambda: w.state.refused is None, "the refusal cleared")
        assert metric(metrics.url, "sparkctl_watch_restart_refused") == 0 and w.state.restarts == 0
        code, out, _ = cli("status", "--json")
        assert code == 0 and json.loads(out)["watcher"]["refused"] is None, out

        monkeypatch.setenv("SPARKCTL_API_KEY", API_KEY)              # the key as deployed: the restart serves
        os.kill(dep.victim, signal.SIGKILL)
        poll_until(lambda: (w.state.last_action or "").startswith("restarted "), "restart")
        monkeypatch.setenv("SPARKCTL_API_KEY", API_KEY + ROTATED)   # rotated after the restart, then it dies
        os.kill(pid_of(Ledger(dep.root).active(), 1), signal.SIGKILL)
        poll_until(lambda: w.state.gave_up, "give-up")
        assert w.state.gave_up is not None
        assert "not rolled back: SPARKCTL_API_KEY set to another value" in w.state.gave_up, w.state.gave_up
        assert w.state.rollbacks == 0 and w.state.flaps == 1
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        if metrics is not None:
            metrics.close()
