"""Every lifecycle path on the real engine: SGLang 0.5.23 itself, TP=2 across two loopback "nodes" on this CPU.

One real deployment is shared by the module, in order (each real TP=2 boot costs 35-150 s here): `up` with warm-up
and every gate judged from the real server -> `status` / `logs --rank 1` -> a small `bench` card from the real
scheduler log -> a boot the real server refuses (the real log's line is the evidence, the previous deployment
restored) -> a missing model (preflight, exit 3, the command that builds it) -> rank 1 killed after hand-off (status
8) -> `up` of a second real profile killed during warm-up (a real engine half started, the broken pair replaced), then
`rollback --to` it converges -> the API key (in force throughout) found in no file, log or process -> `down` leaves
no process and frees the ports. Four real TP=2 boots and one refused.

What is not repeated here, and where it is proven (each real TP=2 boot is a minute or more of a 2-core CI
machine): the controller killed at every other step boundary (boot, hand-off: adopted, ...) is
tests/lifecycle/test_crash_matrix.py on the emulator, whose engine tree and records are the same code's; plain
`rollback` (to the previous known-good, no `--to`) is the same transaction as `rollback --to` with the profile read
from the ledger (tests/lifecycle/test_lifecycle.py on the emulator; on real vLLM and SGLang `rollback --to` across
the engines in tests/realengine/test_vllm_lifecycle_real.py); no process of a real engine outliving a stop at
points of its boot is tests/realengine/test_engine_tree_real.py; `sparkctl watch` restarting a real pair as a pair
(rank 1 first, the recorded deployment exactly) is tests/cluster/test_real_engine_containers.py, on the mission's
own path (containers over the test fabric), and on the process runtime with the emulator in tests/watch/.
The engine's environment and tiny model: testrig/realengine (built by .ci/run; under CI=true never skipped).
"""
from __future__ import annotations

import json
import os
import secrets
import signal
from pathlib import Path

import httpx
import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.deploy.cluster import Cluster
from sparkctl.deploy.observe import process_engines
from sparkctl.nodes.process import local_port_free
from sparkctl.state.ledger import Ledger
from testrig.controller import assert_status_interrupted, kill_up_at, passed_gates
from testrig.embedded import stop_recorded_engines, write_real_engine_inventory
from testrig.handles import pid_of
from testrig.sweep import files_holding, processes_holding
from testrig.testenv import need_real_engine

pytestmark = pytest.mark.real_engine

PORT = 31000          # cpu-tiny's api.port
KEY = f"sk-real-{secrets.token_hex(8)}"


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A two-node process-runtime cluster running real SGLang (inventory, state and profiles of its own)."""
    engine = need_real_engine()
    root = tmp_path_factory.mktemp("real")
    inv = write_real_engine_inventory(root / "inventory.yml", engine)
    profiles = root / "profiles"
    profiles.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARKCTL_INVENTORY", str(inv))
        mp.setenv("SPARKCTL_STATE_DIR", str(root / "state"))
        mp.setenv("SPARKCTL_PROFILES_DIR", str(profiles))
        mp.setenv("SPARKCTL_API_KEY", KEY)      # the real server runs with --api-key: swept for before `down`
        for key in [k for k in os.environ if k.startswith("SPARKCTL_SIM_") or k == "SPARKCTL_CRASH_AT"]:
            mp.delenv(key)
        try:
            yield inv, profiles
        finally:
            stop_recorded_engines(inv)


def _up(cli, profile: str) -> dict:
    code, out, err = cli("up", "--profile", profile, "--yes", "--json")
    assert code == 0, err[-4000:]
    return json.loads(out)


def _status(cli) -> tuple[int, dict]:
    code, out, _ = cli("status", "--json")
    return code, json.loads(out)


def test_up_tp2_on_the_real_engine_gates_from_the_real_server(cli, real_cluster):
    res = _up(cli, "cpu-tiny")
    assert res["outcome"] == "deployed" and res["emulated"] is False
    gates = passed_gates(res)
    # settings in force from the real /get_server_info, capacity from the real log's KV line
    assert "tp_size=2" in gates["settings"]["evidence"] and "context_length=1024" in gates["settings"]["evidence"]
    assert "max_total_num_tokens=16384" in gates["capacity"]["evidence"]
    # the busy-machine bounds the profile sets are the ones the real server runs with (its own /get_server_info)
    code, data = _status(cli)
    info = httpx.get(data["endpoint"] + "/get_server_info", headers={"Authorization": f"Bearer {KEY}"}, timeout=30,
                     trust_env=False).json()
    assert (info["dist_timeout"], info["watchdog_timeout"]) == (1800, 600), info.get("dist_timeout")
    assert "worker-ready" in gates["workers"]["evidence"]


def test_status_and_rank1_log_are_the_real_servers(cli, real_cluster):
    code, data = _status(cli)
    assert code == 0 and data["ok"], data
    code, out, _ = cli("status")
    assert "healthy" in out and "real SGLang on this machine's CPU" in _notice(cli)
    code, out, err = cli("logs", "--rank", "1", "--tail", "400")
    assert code == 0, err
    # rank 1 of a real TP=2 pair serves SGLang's own dummy health server (real-engine.md)
    assert "Dummy health check server started" in out and " TP1] " in out


def _notice(cli) -> str:
    _, _, err = cli("status")
    return err


def test_bench_card_measures_the_real_engine(cli, real_cluster, tmp_path):
    code, out, err = cli("bench", "--runs", "2", "--max-tokens", "24", "--warmup", "1", "--ttft-sizes", "128,256,512",
                         "--ttft-runs", "2", "--concurrency", "1,2", "--g6-max-tokens", "8",
                         "--out", str(tmp_path / "card"), "--json")
    assert code == 0, err[-3000:]
    card = json.loads((tmp_path / "card" / "report.json").read_text())
    assert card["emulated"] is False and card["status"] == "successful"
    results = card["arms"][0]["results"]
    code_class = results["decode"]["classes"]["code"]
    assert code_class["decode_tok_s"]["median"] > 0 and all(r["completion_tokens"] == 24 for r in code_class["runs"])
    assert [lv["concurrency"] for lv in results["concurrency"]["levels"]] == [1, 2]
    # the radix cache hit is read from the real scheduler's "Prefill batch ... #cached-token" line
    assert results["ttft"]["cached_repeat"]["radix_cached"] is True
    # calibrated within the 1,024 window, then each prompt fitted by the real server's own count (issue 31: a
    # calibrated "~256" once held 225 real tokens): every labelled size is within 2 % of its label, and the count
    # the fit saw behind its probe marker is the count the measured request got
    assert results["ttft"]["calibration"]["measured"] is True, results["ttft"]["calibration"]
    assert results["ttft"]["calibration"]["marker_tokens"] is not None, results["ttft"]["calibration"]
    sizes = {x["target_tokens"]: x for x in results["ttft"]["sizes"]}
    assert set(sizes) == {128, 256, 512} and all(x["status"] == "measured" for x in sizes.values()), sizes
    for label, size in sizes.items():
        assert len(size["runs"]) == 2 and size["note"] is None, size
        assert all(abs(r["prompt_tokens"] - label) <= 0.02 * label for r in size["runs"]), size["runs"]
        assert [f["tokens"] for f in size["fit"]] == [r["prompt_tokens"] for r in size["runs"]], size


def test_a_boot_the_real_server_refuses_is_rolled_back_with_its_log_line(cli, real_cluster):
    _, profiles = real_cluster
    # Rendered and parsed fine; the real server refuses it at start-up (the tiny model's config holds far less).
    (profiles / "too-long.yml").write_text("extends: cpu-tiny\nserver:\n  context_length: 999999\n")
    code, out, err = cli("up", "--profile", "too-long", "--yes")
    assert code == 4, err[-3000:]
    assert "context_length" in err and "999999" in err, err[-3000:]      # the real log's own line, as evidence
    assert "restored" in err or "rolled back" in err, err[-3000:]
    code, data = _status(cli)
    assert code == 0 and data["profile"] == "cpu-tiny", data


def test_a_missing_model_is_a_preflight_failure_naming_the_build(cli, real_cluster):
    _, profiles = real_cluster
    (profiles / "no-model.yml").write_text("extends: cpu-tiny\nmodel:\n  path: /models/not-built\n")
    code, out, err = cli("up", "--profile", "no-model", "--yes")
    assert code == 3, err[-3000:]
    assert "not-built is missing" in err and "testrig.realengine build" in err, err[-3000:]
    assert _status(cli)[1]["profile"] == "cpu-tiny"


def test_rank1_killed_after_hand_off_is_status_8(cli, real_cluster):
    inv, _ = real_cluster
    ledger = Ledger.for_cluster(load_inventory(inv).cluster.name)
    active = ledger.load(ledger.index()["active"])
    os.kill(pid_of(active, 1), signal.SIGKILL)      # the log pipe: the kernel takes the engine with it (PDEATHSIG)
    code, data = _status(cli)
    assert code == 8 and not data["ok"], data


def test_controller_killed_in_warm_up_then_rollback_to_a_second_real_profile_converges(cli, real_cluster):
    """On the pair whose rank 1 died above: `up` of a second real profile (it stops what is left of the broken pair
    first), its controller SIGKILLed during warm-up (a real pair half started: the marker is the step's own progress
    line, a warm-up request, not the plan's line naming it): `status` says interrupted, then `rollback --to` that
    profile settles what the dead controller left and deploys it. (One test for both: each real TP=2 boot is a
    minute or more of a 2-core CI machine.)"""
    pid = kill_up_at(r"warm-up +warm-up: \d+ x", "cpu-tiny-small", after=r"boot +done")
    assert_status_interrupted(cli, pid, "warm-up")
    code, out, err = cli("rollback", "--to", "cpu-tiny-small", "--yes", "--json")
    assert code == 0, err[-3000:]
    assert json.loads(out)["outcome"] == "deployed", out
    code, data = _status(cli)
    assert code == 0 and data["profile"] == "cpu-tiny-small" and not data["interrupted"], data


def test_the_api_key_is_in_no_file_log_or_process_of_the_real_deployment(cli, real_cluster):
    """Everything above ran with an API key (the real SGLang prints its server_args, api_key included, into the
    rank logs): the key is in no file of the state directory (records, rank logs, cards, journals) and in no
    process's command line or environment; the real server does require it."""

    inv, _ = real_cluster
    state = Path(os.environ["SPARKCTL_STATE_DIR"])
    assert len(list(state.rglob("*.log"))) >= 2                 # the real engines' logs are among what is searched
    assert files_holding(state, (KEY,)) == []
    assert processes_holding((KEY,)) == []
    code, data = _status(cli)
    assert code == 0, data
    r = httpx.get(data["endpoint"] + "/v1/models", timeout=10, trust_env=False)
    assert r.status_code == 401, r.text[:200]                   # the key is in force on the real server
    r = httpx.get(data["endpoint"] + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10,
                  trust_env=False)
    assert r.status_code == 200, r.text[:200]


def test_down_leaves_no_real_engine(cli, real_cluster):
    inv, _ = real_cluster
    code, out, err = cli("down", "--yes")
    assert code == 0 and "stopped rank 1" in out and "stopped rank 0" in out, out + err
    inventory = load_inventory(inv)
    assert process_engines(Cluster(inventory)) == []
    assert all(local_port_free(n.api_bind, PORT) for n in inventory.nodes)
    # no SGLang process of ours is left (rank 1 exits on its own once rank 0 is gone; the pipe's group is killed)
    ours = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _names(p, str(inventory.nodes[0].api_bind))]
    assert ours == [], ours


def _names(proc: Path, address: str) -> bool:
    try:
        return address in (proc / "cmdline").read_bytes().decode("utf-8", "replace")
    except OSError:
        return False
