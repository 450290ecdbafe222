"""The `up` lifecycle on the embedded cluster: full cycle, faults, rollback, lock, SIGINT, ports."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from sparkctl.config.inventory import load_inventory
from sparkctl.nodes import procfs
from sparkctl.state.ledger import Ledger
from testrig.handles import process_handle, process_handles

REPO = Path(__file__).resolve().parents[2]


def _ledger(inv: Path) -> Ledger:
    return Ledger.for_cluster(load_inventory(inv).cluster.name)


def _status(cli) -> dict:
    code, out, err = cli("status", "--json")
    assert code == 0, err
    return json.loads(out)


def test_up_deploys_rank1_first_and_passes_every_gate(cli, local_cluster):
    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
    assert code == 0, err
    first = json.loads(out)
    assert first["outcome"] == "deployed" and first["emulated"] is True
    assert all(g["ok"] for g in first["gates"]) and {g["name"] for g in first["gates"]} == \
        {"health", "models", "settings", "capacity", "workers", "smoke"}
    assert [s["name"] for s in first["steps"]] == ["preflight", "image-build", "image-distribute", "image-verify",
                                                    "boot", "warm-up", "verify", "hand-off"]
    assert first["capacity"]["max_total_num_tokens"] > 0 and first["warmup"]["cold"]["completion_tokens"] > 0
    assert err.index("rank 1 started") < err.index("rank 0 started")     # progress on stderr
    st = _status(cli)
    assert st["healthy"] and st["profile"] == "d5" and st["speculative_algorithm"] == "DFLASH"
    assert st["active"] == first["deployment"] and [r["alive"] for r in st["ranks"]] == [True, True]
    rec = _ledger(local_cluster).load(first["deployment"])
    assert rec.status == "successful" and rec.known_good and [h.rank for h in rec.handles] == [1, 0]


def test_same_profile_on_a_healthy_deployment_changes_nothing(cli, local_cluster):
    first = _up_ok(cli)
    code, out, err = cli("up", "--profile", "d5", "--yes", "--json")
    again = json.loads(out)
    assert code == 0 and again["outcome"] == "unchanged" and "already runs profile d5" in again["reason"]
    assert again["deployment"] == first["deployment"] and _ledger(local_cluster).index()["history"] == \
        [first["deployment"]]


def test_rollback_to_a_profile_replaces_the_engines(cli, local_cluster):
    first = _up_ok(cli)
    code, out, err = cli("rollback", "--to", "dflash-off", "--yes", "--json")
    assert code == 0, err
    off = json.loads(out)
    st = _status(cli)
    assert st["active"] == off["deployment"] and st["profile"] == "dflash-off" and st["healthy"]
    assert st["speculative_algorithm"] is None
    old = _ledger(local_cluster).load(first["deployment"])
    assert old.status == "superseded" and old.superseded_by == off["deployment"]
    assert not any(procfs.running(h.pid, None) for h in process_handles(old))


def test_rollback_without_to_returns_to_the_previous_known_good(cli, local_cluster):
    first = _up_ok(cli)
    _up_ok(cli, "dflash-off")
    code, out, err = cli("rollback", "--yes", "--json")
    assert code == 0, err
    back = json.loads(out)
    assert f"rolling back to {first['deployment']} (d5)" in err
    st = _status(cli)
    assert st["profile"] == "d5" and st["healthy"] and st["active"] == back["deployment"] != first["deployment"]


def test_logs_prints_the_tail_of_that_ranks_log(cli, local_cluster):
    first = _up_ok(cli)
    handle = process_handle(_ledger(local_cluster).load(first["deployment"]), 1)
    code, out, err = cli("logs", "--rank", "1", "--tail", "5")
    assert code == 0, err
    on_disk = Path(handle.log).read_text().splitlines()
    assert out.splitlines() == on_disk[-5:] and len(on_disk) > 5
    code, out, err = cli("logs", "--rank", "7")
    assert code == 2 and out == "" and f"--rank 7: deployment {first['deployment']} has no rank 7" in err
    assert "fix: use one of its ranks: 0, 1 (e.g. --rank 0)" in err


def test_down_stops_every_rank_and_keeps_the_history(cli, local_cluster):
    first = _up_ok(cli)
    code, out, err = cli("down", "--yes", "--json")
    down = json.loads(out)
    assert code == 0 and down["changed"] and down["stopped"] == first["deployment"] and down["settled"] == []
    assert [e.split(" (")[0] for e in down["engines"]] == ["rank 1", "rank 0"]
    assert _status(cli)["active"] is None
    ledger = _ledger(local_cluster)
    rec = ledger.load(first["deployment"])
    assert rec.status == "stopped" and rec.known_good          # still a rollback target
    assert not any(procfs.running(h.pid, None) for h in process_handles(rec))
    assert ledger.index()["history"] == [first["deployment"]]
    for p in (ledger.root / "deployments").iterdir():
        assert p.stat().st_mode & 0o777 == 0o600
    code, out, _ = cli("down", "--yes", "--json")
    assert code == 0 and json.loads(out) == {"changed": False, "reason": "no active deployment and no engine running",
                                             "stopped": None, "engines": [], "settled": [],
                                             "reconciled": []}   # same keys always (reconciled: RENAMED_KEYS)


def test_dry_run_prints_the_steps_and_commands_and_changes_nothing(cli, local_cluster, monkeypatch):
    monkeypatch.setenv("SPARKCTL_API_KEY", "sk-dry-run-secret")
    code, out, err = cli("up", "--profile", "d5", "--dry-run", "--json")
    assert "sk-dry-run-secret" not in err + out and "--config /run/sparkctl-secrets/engine-secrets.yaml" in err
    result = json.loads(out)
    assert code == 0 and result["outcome"] == "dry-run"
    assert [s["name"] for s in result["plan"]["steps"]] == ["preflight", "image-build", "image-distribute",
                                                            "image-verify", "boot", "warm-up", "verify", "hand-off"]
    for name in ("image-build", "image-distribute", "image-verify"):   # the embedded cluster has no image
        assert f"{name}: no-op (process runtime: no image)" in err
    assert "start rank 1 on spark-b, then start rank 0 on spark-a" in err and "[not idempotent]" in err
    # the command each rank's start runs, one line per rank, rank 1 first
    starts = [ln for ln in err.splitlines() if "$ " in ln and "sparkctl.sim" in ln]
    assert ["[spark-b]" in starts[0], "[spark-a]" in starts[1]] == [True, True] and len(starts) == 2
    assert "--node-rank 1" in starts[0] and "--node-rank 0" in starts[1]
    ledger = _ledger(local_cluster)
    assert ledger.index()["history"] == [] and not (ledger.root / "logs").exists()
    # the plan is data: the `up` that follows plans the same steps, and runs exactly those (its stages)
    deployed = _up_ok(cli)
    assert deployed["plan"]["steps"] == result["plan"]["steps"]


def _up_ok(cli, profile="d5") -> dict:
    code, out, err = cli("up", "--profile", profile, "--yes", "--json")
    assert code == 0, err
    result = json.loads(out)
    if result["outcome"] == "deployed":      # apply ran exactly the plan's steps, in its order
        assert [s["name"] for s in result["steps"]] == [s["name"] for s in result["plan"]["steps"]]
    return result


def test_rank1_crash_during_boot_rolls_back_to_previous(cli, local_cluster, faulty_profile):
    prev = _up_ok(cli, "dflash-off")
    name = faulty_profile({"ranks": {"1": {"crash_after_s": 0.3, "boot_s": 3.0}}})
    code, out, err = cli("up", "--profile", name, "--yes")
    assert code == 4, err
    assert "rank 1 (spark-b)" in err and "restored " + prev["deployment"] in err
    st = _status(cli)
    assert st["active"] == prev["deployment"] and st["healthy"]
    failed = _ledger(local_cluster).load(_ledger(local_cluster).index()["history"][-1])
    assert failed.status == "failed" and failed.restored == prev["deployment"] and not failed.known_good
    assert not any(procfs.running(h.pid, None) for h in process_handles(failed))


def test_oom_fails_fast_without_waiting_for_the_timeout(cli, local_cluster, faulty_profile):
    name = faulty_profile({"fail_load_oom": True})
    t0 = time.monotonic()
    code, _, err = cli("up", "--profile", name, "--yes", "--boot-timeout", "60")
    assert code == 4 and time.monotonic() - t0 < 20
    assert "oom" in err.lower() and "log tail" in err and "mem_fraction_static" in err


def test_hang_at_init_times_out_with_evidence(cli, local_cluster, faulty_profile):
    name = faulty_profile({"hang_at_init": True})
    t0 = time.monotonic()
    code, _, err = cli("up", "--profile", name, "--yes", "--boot-timeout", "3")
    assert code == 4 and time.monotonic() - t0 < 30
    assert "not ready within 3s" in err and "last milestone" in err and "log tail" in err


def test_never_healthy_fails_and_rolls_back(cli, local_cluster, faulty_profile):
    prev = _up_ok(cli, "dflash-off")
    name = faulty_profile({"never_healthy": True})
    code, _, err = cli("up", "--profile", name, "--yes", "--boot-timeout", "4")
    assert code == 4, err
    assert "restored " + prev["deployment"] in err
    st = _status(cli)
    assert st["active"] == prev["deployment"] and st["healthy"]


def test_second_concurrent_up_gets_a_lock_error(cli, local_cluster):
    """A first `up` (another process) holds the lock: the second says who holds it and changes nothing."""
    first = subprocess.Popen([sys.executable, "-m", "sparkctl", "up", "--profile", "d5", "--yes"],
                             env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ledger = _ledger(local_cluster)
    try:
        deadline = time.monotonic() + 30
        while not (ledger.root / "lock.holder").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        code, _, err = cli("up", "--profile", "dflash-off", "--yes")
        assert code == 5 and f"cluster is locked by pid {first.pid}" in err and "sparkctl up" in err
    finally:
        _, first_err = first.communicate(timeout=120)
    assert first.returncode == 0, first_err
    assert _status(cli)["profile"] == "d5"


def test_port_in_use_is_a_preflight_error(cli, local_cluster):
    inv = load_inventory(local_cluster)
    with socket.socket() as s:
        s.bind((inv.nodes[0].api_bind, 30000))
        s.listen()
        code, _, err = cli("up", "--profile", "d5", "--yes")
    assert code == 3 and "[spark-a] preflight" in err and "30000" in err and "already in use" in err
    assert _status(cli)["active"] is None


def test_sigint_during_up_releases_lock_and_leaves_nothing_running(local_cluster, state_dir, faulty_profile):
    name = faulty_profile({"boot_s": 30})
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "sparkctl", "up", "--profile", name, "--yes"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ledger = _ledger(local_cluster)
    # Interrupt once both ranks are started (rank 0 starts last), read from the progress on stderr: a fixed sleep
    # after the boot stage appeared was sometimes too short on a loaded machine (SIGINT before rank 1 existed).
    lines: list[str] = []
    both_started = threading.Event()
    stderr = proc.stderr
    assert stderr is not None                       # a pipe

    def read_progress() -> None:
        for line in stderr:
            lines.append(line)
            if "rank 0 started" in line:
                both_started.set()

    reader = threading.Thread(target=read_progress, daemon=True)
    reader.start()
    try:
        assert both_started.wait(120), "".join(lines)
        proc.send_signal(signal.SIGINT)  # boot_s: 30, so the ranks are still booting
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    err = "".join(lines)
    assert proc.returncode == 130, err
    rec = ledger.load(ledger.index()["history"][-1])
    assert rec.status == "canceled" and rec.failure is not None and rec.failure.message.startswith("interrupted")
    # The fault (boot_s: 30, from the profile's SPARKCTL_SIM_CONFIG) reached the engines: the SIGINT
    # landed in boot, not after it (it once did not: the inventory's knobs shadowed the file).
    assert rec.failure.step == "boot", rec.failure
    handles = process_handles(rec)
    assert handles and not any(procfs.running(h.pid, None) for h in handles)
    assert ledger.index()["active"] is None
    with ledger.lock("check"):  # the lock is free again
        pass


def test_preflight_command_is_read_only(cli, local_cluster):
    code, out, err = cli("preflight", "--profile", "d5", "--json")
    data = json.loads(out)
    assert code == 0 and data["ok"] and {c["node"] for c in data["checks"]} == {"spark-a", "spark-b"}
    assert _ledger(local_cluster).index()["history"] == []
    inv = load_inventory(local_cluster)
    with socket.socket() as s:
        s.bind((inv.nodes[1].api_bind, 30000))
        s.listen()
        code, _, err = cli("preflight", "--profile", "d5")
    assert code == 3 and "[spark-b] preflight" in err and "already in use" in err


def test_terminal_prompt_declined_changes_nothing(local_cluster):
    """On a terminal `up` asks before changing anything; answering no cancels with nothing started."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # child: sparkctl on a pseudo-terminal
        os.execvpe(sys.executable, [sys.executable, "-m", "sparkctl", "up", "--profile", "d5"], dict(os.environ))
    seen, deadline = b"", time.monotonic() + 60
    try:
        while b"deploy d5?" not in seen and time.monotonic() < deadline:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                break
        assert b"deploy d5?" in seen, seen.decode(errors="replace")
        os.write(fd, b"n\n")
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 1 and b"nothing was changed" in seen
    assert _ledger(local_cluster).index()["history"] == []


def test_why_a_restore_failed_reaches_the_error_and_the_ledger(cli, local_cluster, faulty_profile, profiles_dir,
                                                               tmp_path):
    prev = _up_ok(cli, faulty_profile({}))              # boots clean; its fault file is read again at restore
    (tmp_path / "sim-faults.json").write_text(json.dumps({"fail_load_oom": True}))
    bad = tmp_path / "bad-faults.json"
    bad.write_text(json.dumps({"ranks": {"1": {"crash_after_s": 0.3, "boot_s": 3.0}}}))
    (profiles_dir / "bad.yml").write_text(f"extends: dflash-off\nenv: {{SPARKCTL_SIM_CONFIG: '{bad}'}}\n")
    code, _, err = cli("up", "--profile", "bad", "--yes", "--boot-timeout", "30")
    assert code == 4, err
    assert f"restoring {prev['deployment']} FAILED" in err and "oom" in err.lower()
    ledger = _ledger(local_cluster)
    failed = ledger.load(ledger.index()["history"][-1])
    assert failed.status == "failed" and failed.failure is not None and failed.failure.step == "boot"
    assert failed.restored is None and failed.restore_error is not None
    assert "oom" in failed.restore_error.lower()
    assert ledger.index()["active"] is None
    assert not any(procfs.running(h.pid, None) for h in process_handles(ledger.load(prev["deployment"])))


def test_a_profile_on_a_real_engines_store_port_fails_its_own_up_on_a_test_cluster(cli, local_cluster, profiles_dir):
    """The suite's embedded clusters reserve the real engines' TCP-store ports (testrig.embedded, the emulator's
    `reserved_ports` knob carried by the inventory): an emulated `up` on one of them fails itself, naming the knob
    and the fix, instead of making a real engine beside it fail with EADDRINUSE; an `up` on a port of its own works."""
    from testrig.embedded import REAL_ENGINE_STORE_PORTS
    from testrig.testenv import free_port
    (profiles_dir / "on-26000.yml").write_text(f"extends: d5\napi:\n  dist_port: {REAL_ENGINE_STORE_PORTS[0]}\n")
    code, out, err = cli("up", "--profile", "on-26000", "--yes")
    assert code != 0 and "reserved_ports" in err and "api.dist_port of its own" in err, err[-3000:]
    node = load_inventory(local_cluster).rank0.api_bind
    (profiles_dir / "own.yml").write_text(f"extends: d5\napi:\n  dist_port: {free_port(node)}\n")
    code, out, err = cli("up", "--profile", "own", "--yes")
    assert code == 0, err[-3000:]
