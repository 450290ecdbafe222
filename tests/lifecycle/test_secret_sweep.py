"""The secret sweep (issue 16 item 5): every user command, run with a unique API key and HF token in the
environment (SPARKCTL_API_KEY, named by the profile's api.api_key_env, and HF_TOKEN, its api.hf_token_env),
leaves neither value in any file under the state directory, in any stdout or stderr, or in the command line or
environment of any process on this machine; and once `down` has run, no secret file is left on tmpfs.

One deployment shared by every command, a fast emulator (tests/conftest.py FAST_SIM), a tiny bench.
"""
from __future__ import annotations

import json
import secrets
from pathlib import Path

from sparkctl.config.inventory import load_inventory
from sparkctl.nodes.process import secrets_root_for
from sparkctl.state.ledger import Ledger
from testrig.handles import process_handles
from testrig.sweep import files_holding, processes_holding


def _values() -> tuple[str, str]:
    return f"sk-sweep-{secrets.token_hex(8)}", f"hf_sweep{secrets.token_hex(8)}"


def test_no_command_leaves_the_api_key_or_hf_token_anywhere(cli, local_cluster, state_dir, monkeypatch):
    key, token = values = _values()
    monkeypatch.setenv("SPARKCTL_API_KEY", key)
    monkeypatch.setenv("HF_TOKEN", token)
    ledger = Ledger.for_cluster(load_inventory(local_cluster).cluster.name)
    outputs: list[tuple[str, int, str, str]] = []

    def run(*args: str, ok: bool = True) -> str:
        code, out, err = cli(*args)
        outputs.append((" ".join(args), code, out, err))
        if ok:
            assert code == 0, (args, err)
        return out

    run("render", "--profile", "d5")
    run("render", "--profile", "d5", "--rank", "0", "--json")
    run("preflight", "--profile", "d5")
    foreign = f"foreign-{secrets.token_hex(8)}"     # a secret sparkctl never heard of, in the caller's environment
    monkeypatch.setenv("SOME_CLOUD_SECRET_KEY", foreign)
    dep = json.loads(run("up", "--profile", "d5", "--yes", "--json"))["deployment"]
    assert processes_holding(values) == []                    # the engines run: argv and env clean
    # the log pipes are helpers: an allowlisted environment (sparkctl.nodes.environ), so no unknown variable either
    for handle in process_handles(ledger.load(dep)):
        environ = Path(f"/proc/{handle.pid}/environ").read_bytes().split(b"\0")
        assert not [e for e in environ if foreign.encode() in e or e.startswith(b"SPARKCTL_")], handle.pid
    monkeypatch.delenv("SOME_CLOUD_SECRET_KEY")
    sroot = secrets_root_for(ledger.root / "secrets")
    assert (sroot / dep / "rank0" / "hf-token").read_text() == token     # the token reaches the engine, on tmpfs
    run("status")
    run("status", "--json")
    run("logs", "--rank", "0", "--tail", "0")
    run("logs", "--rank", "1", "--tail", "0")
    run("bench", "--gates", "decode", "--runs", "1", "--max-tokens", "8", "--warmup", "0", "--json")
    # the support bundle (doctor --bundle): written into the state directory's tree so the file sweep below greps it
    bundle = state_dir / "doctor-bundle.json"
    run("doctor", "--bundle", str(bundle), "--no-kernel-log")
    run("doctor", "--json", "--no-kernel-log")
    assert json.loads(bundle.read_text())["ranks"]                # argv, env, log tails: there was much to grep
    run("rollback", "--to", "dflash-off", "--yes")
    assert processes_holding(values) == []
    run("status", "--json")
    run("down", "--yes")
    # prepare --check runs ansible-runner with the inventory's local connection; this machine is no Spark (no
    # docker daemon, no fabric), so it reports what it would change and fails its checks: what matters here is
    # that the run happened (artifacts written) and holds no secret.
    run("prepare", "--check", ok=False)
    assert outputs[-1][1] in (0, 3, 7), outputs[-1]
    assert list((ledger.root / "ansible" / "artifacts").glob("*/command"))
    # every output, every state file, every process left
    leaks = [f"`sparkctl {cmd}` {stream}" for cmd, _, out, err in outputs
             for stream, text in (("stdout", out), ("stderr", err)) if key in text or token in text]
    assert leaks == []
    assert len(list(state_dir.rglob("*"))) > 10                 # records, logs, the bench run: there was much to grep
    assert files_holding(state_dir, values) == []
    assert processes_holding(values) == []
    # no secret file is left once its engine is gone
    assert not sroot.exists() or not any(sroot.rglob("*")), sorted(sroot.rglob("*"))
