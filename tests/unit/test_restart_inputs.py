"""deploy/inputs.py: what a restart must find again. Secret fingerprints (never the value, a changed value always
seen, over any values: Hypothesis), the node paths a launch names, and a node that does not answer within the
watcher's deadline (a real TCP peer that never speaks SSH): PreflightError within the deadline, never a wait."""
from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import ApiSettings
from sparkctl.deploy.inputs import fingerprint, missing_paths, needed_paths, referenced_paths, unresolved_secrets
from sparkctl.errors import PreflightError
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.state.records import DeploymentRecord, NodePath, SecretPrints

pytestmark = pytest.mark.unit

API = ApiSettings(api_key_env="SPARKCTL_API_KEY", hf_token_env="HF_TOKEN")
# what a variable can hold: no NUL, at least one character (an empty variable is an unset one)
values = st.text(st.characters(blacklist_characters="\0"), min_size=1, max_size=64)   # lone surrogates too


def _record(secrets: SecretPrints | None) -> DeploymentRecord:
    """A DeploymentRecord kept with these fingerprints: the part `unresolved_secrets` reads (the rest minimal)."""
    return DeploymentRecord(id="20260101T000000Z-d5-abcd", profile="d5", profile_data={}, cluster="c",
                            identity="i" * 16, created="2026-01-01T00:00:00Z", endpoint="http://127.0.0.1:30000",
                            secrets=secrets)


@settings(max_examples=200, deadline=None)
@given(key=values, hf=values, other=values)
def test_a_fingerprint_holds_no_value_and_sees_every_change(key, hf, other):
    env = {"SPARKCTL_API_KEY": key, "HF_TOKEN": hf}
    kept = fingerprint(API, env)
    assert kept is not None and set(kept.prints) == {"SPARKCTL_API_KEY", "HF_TOKEN"}
    text = json.dumps(kept.model_dump(mode="json"))
    assert all(len(v) < 4 or v not in text for v in (key, hf))      # a short value can occur in hex by chance
    rec = _record(kept)
    assert unresolved_secrets(rec, env) == ([], [])
    assert unresolved_secrets(rec, {"HF_TOKEN": hf}) == (["SPARKCTL_API_KEY"], [])
    if other != key:
        assert unresolved_secrets(rec, {**env, "SPARKCTL_API_KEY": other}) == ([], ["SPARKCTL_API_KEY"])
    again = fingerprint(API, env)
    assert again is not None and again.key != kept.key and again.prints != kept.prints   # a key per deployment


def test_no_secret_set_keeps_no_fingerprint_and_an_old_record_answers_for_nothing():
    assert fingerprint(API, {}) is None
    assert unresolved_secrets(_record(None), {}) == ([], [])


def test_the_paths_a_launch_names_on_its_node():
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "/models/M", "--speculative-draft-model-path",
            "/models/D", "--chat-template", "/models/t.jinja", "--tokenizer-path=/models/tok", "--served-model-name",
            "/not/a/models/path", "--config", "/run/secrets/sparkctl.yaml"]
    assert referenced_paths(argv) == [("model", "/models/M"), ("drafter", "/models/D"),
                                      ("--chat-template", "/models/t.jinja"), ("--tokenizer-path", "/models/tok")]


def _inv(tmp_path: Path, runtime: str, port: int = 22) -> Path:
    hosts = {f"spark-{x}": {"ansible_host": "127.0.0.1", "ansible_port": port, "sparkctl_rank": r,
                            "fabric_interface": "lo", "fabric_address": f"127.0.0.{r + 2}", "runtime": runtime,
                            "gpu_runtime": "none", "host_paths": {"models": str(tmp_path / "models")}}
             for x, r in (("a", 0), ("b", 1))}
    doc = {"all": {"vars": {"sparkctl_cluster": f"inputs{port}", "sparkctl_known_hosts": str(tmp_path / "kh"),
                            "ansible_user": "nobody"}, "children": {"sparks": {"hosts": hosts}}}}
    path = tmp_path / "inv.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("runtime", ["process", "docker"])
def test_needed_paths_are_where_the_node_keeps_them(runtime, tmp_path):
    node = load_inventory(_inv(tmp_path, runtime)).node("spark-a")
    spec = LaunchSpec(rank=0, node="spark-a", argv=["python3", "-m", "x", "--model-path", "/opt/M",
                                                    "--chat-template", "/models/t.jinja"], env={}, sglang_version="0")
    got = [(p.what, p.path, p.host) for p in needed_paths(spec, node)]
    models = str(tmp_path / "models")
    mount = ("models mount", "/models", models)
    template = ("--chat-template", "/models/t.jinja", f"{models}/t.jinja")
    # a model outside /models is this machine's own path on a process node, inside the image on a docker node
    assert got == ([mount, ("model", "/opt/M", "/opt/M"), template] if runtime == "process" else [mount, template])


class _Rec2:
    def __init__(self, needed: list[NodePath]) -> None:
        self.id, self.needed = "dep-1", needed


def test_a_node_that_never_answers_costs_one_deadline_and_refuses_nothing(tmp_path):
    """A peer that accepts the TCP connection and never sends an SSH banner (a hung node): the check gives up at the
    deadline with a PreflightError naming the node (nothing changed; backed off, not refused)."""
    silent = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    try:
        import threading
        threading.Thread(target=lambda: held.append(silent.accept()[0]), daemon=True).start()
        inv = load_inventory(_inv(tmp_path, "docker", silent.getsockname()[1]))
        rec = _Rec2([NodePath(node="spark-a", what="model", path="/models/M", host="/srv/models/M")])
        t0 = time.monotonic()
        with pytest.raises(PreflightError) as err:
            missing_paths(inv, rec, deadline_s=1.5)                     # type: ignore[arg-type]
        took = time.monotonic() - t0
        assert 1.4 <= took < 4, f"{took:.2f}s: the deadline is the bound, not the SSH banner's own timeout"
        assert "spark-a: no answer within 1.5s" in err.value.message, err.value.message
    finally:
        silent.close()
        for c in held:
            c.close()


def test_a_path_gone_on_a_process_node_is_named(tmp_path):
    inv = load_inventory(_inv(tmp_path, "process"))
    (tmp_path / "models" / "M").mkdir(parents=True)
    there = NodePath(node="spark-a", what="model", path="/models/M", host=str(tmp_path / "models" / "M"))
    gone = NodePath(node="spark-b", what="drafter", path="/models/D", host=str(tmp_path / "models" / "D"))
    assert missing_paths(inv, _Rec2([there, gone]), deadline_s=5) == [gone]     # type: ignore[arg-type]
