"""Profiles and inventories: loading, extends, and every bad input giving one clear error (exit 2)."""
from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.config.inventory import load_inventory, resolve_inventory
from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_shipped_profiles_load_with_the_seed_envelope():
    d5 = load_profile("d5")
    s = d5.server
    assert (s.tp_size, s.mem_fraction_static, s.max_total_tokens, s.mamba_full_memory_ratio, s.context_length,
            s.kv_cache_dtype, s.dsa_prefill_backend, s.dsa_decode_backend) == \
        (2, 0.88, 131072, 2.0, 65536, "bf16", "tilelang", "tilelang")
    assert d5.speculative is not None
    assert (d5.speculative.algorithm, d5.speculative.num_draft_tokens, d5.speculative.draft_attention_backend) == \
        ("DFLASH", 8, "flashinfer")
    assert d5.speculative.draft_model_path is not None and "DFlash2" in d5.speculative.draft_model_path
    assert (d5.warmup.requests, d5.warmup.max_tokens) == (2, 800)
    assert d5.image.sglang_version == "0.5.23"
    assert d5.extends == ["base"]


def test_dflash_off_is_d5_with_only_speculative_off():
    d5, off = load_profile("d5"), load_profile("dflash-off")
    assert off.speculative is None
    a = d5.model_dump(exclude={"name", "path", "description", "speculative", "extends", "rollback_profile"})
    b = off.model_dump(exclude={"name", "path", "description", "speculative", "extends", "rollback_profile"})
    assert a == b
    assert off.extends == ["d5", "base"]


def test_inventories_load_in_rank_order():
    local = resolve_inventory(str(REPO / "inventory" / "local.yml"))
    assert [n.name for n in local.nodes] == ["spark-a", "spark-b"]
    assert local.nodes[0].ssh.connection == "local" and local.nodes[0].runtime == "process"
    example = load_inventory(REPO / "inventory" / "sparks.example.yml")
    assert example.nodes[1].roce_hcas == ["rocep1s0f0", "roceP2p1s0f0"]
    assert example.nodes[0].ssh.user == "spark" and example.cluster.name == "desk"


def test_inventory_resolution_falls_back_to_the_embedded_cluster(monkeypatch, tmp_path):
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    monkeypatch.chdir(tmp_path)
    inv = resolve_inventory(None)
    assert inv.embedded and inv.path.endswith("inventory/local.yml")


def test_explicit_rank_reorders_nodes(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text("all:\n  hosts:\n"
                   "    b: {sparkctl_rank: 1, fabric_interface: e, fabric_address: 198.18.0.2}\n"
                   "    a: {sparkctl_rank: 0, fabric_interface: e, fabric_address: 198.18.0.1}\n")
    assert [n.name for n in load_inventory(inv).nodes] == ["a", "b"]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


BAD_PROFILES = [
    ("server:\n  mem_fraction_statc: 0.8\n", "server.mem_fraction_statc", "did you mean 'mem_fraction_static'"),
    ("server:\n  tp_size: two\n", "server.tp_size", "integer"),
    ("server:\n  mem_fraction_static: 1.2\n", "server.mem_fraction_static", "less than 1"),
    ("server:\n  mem_fraction_static: 0\n", "server.mem_fraction_static", "greater than 0"),
    ("speculative:\n  algorithm: DFLASH2\n", "speculative.algorithm", "DFlash2 drafters run under"),
    ("modle:\n  path: /m\n", "modle", "did you mean 'model'"),
]


@pytest.mark.parametrize("body,key,fragment", BAD_PROFILES)
def test_bad_profile_gives_one_clear_error(cli, profiles_dir, body, key, fragment):
    path = _write(profiles_dir / "bad.yml", "extends: d5\n" + body)
    code, out, err = cli("render", "--profile", "bad")
    assert code == 2, err
    assert "Traceback" not in err and out == ""
    assert str(path) in err and key in err and fragment in err


def test_extends_cycle_is_rejected(cli, profiles_dir):
    _write(profiles_dir / "a.yml", "extends: b\n")
    _write(profiles_dir / "b.yml", "extends: a\n")
    code, _, err = cli("render", "--profile", "a")
    assert code == 2 and "extends cycle: a -> b -> a" in err and "Traceback" not in err


def test_unknown_profile_suggests(cli):
    code, _, err = cli("render", "--profile", "d6")
    assert code == 2 and "no profile named 'd6'" in err and "did you mean 'd5'" in err


BAD_INVENTORIES = [
    ("all:\n  hosts:\n    a: {fabric_interface: e}\n", "hosts.a.fabric_address: missing"),
    ("all:\n  hosts:\n    a: {fabric_interface: e, fabric_address: not-an-ip}\n", "not an IPv4 address"),
    ("all:\n  hosts:\n    a: {fabric_interface: e, fabric_adress: 198.18.0.1}\n", "did you mean 'fabric_address'"),
    ("all:\n  children:\n    g1: {hosts: {a: {fabric_interface: e, fabric_address: 198.18.0.1}}}\n"
     "    g2: {hosts: {a: {fabric_interface: e, fabric_address: 198.18.0.2}}}\n", "two nodes named 'a'"),
    ("all:\n  hosts:\n    a: {fabric_interface: e, fabric_address: 198.18.0.1}\n"
     "    a: {fabric_interface: e, fabric_address: 198.18.0.2}\n", "duplicate key 'a'"),
    ("all:\n  hosts:\n    a: {fabric_interface: e, fabric_address: 198.18.0.1, runtime: podman}\n", "runtime"),
    ("nodes: []\n", "top-level 'all:' is missing"),
]


@pytest.mark.parametrize("body,fragment", BAD_INVENTORIES)
def test_bad_inventory_gives_one_clear_error(cli, tmp_path, body, fragment):
    inv = _write(tmp_path / "inv.yml", body)
    code, out, err = cli("render", "--profile", "d5", "--inventory", str(inv))
    assert code == 2, err
    assert "Traceback" not in err and str(inv) in err and fragment in err


def test_schema_export_covers_profile_and_inventory(cli):
    import json
    code, out, _ = cli("schema", "profile")
    schema = json.loads(out)
    assert code == 0 and "server" in schema["properties"] and "extends" in schema["properties"]
    code, out, _ = cli("schema", "inventory")
    assert code == 0 and "fabric_address" in json.loads(out)["$defs"]["host"]["properties"]


def test_profiles_lists_descriptions(cli):
    code, out, _ = cli("profiles")
    assert code == 0
    names = [line.split()[0] for line in out.splitlines()]
    assert {"base", "d5", "dflash-off"} <= set(names)


def test_yaml_syntax_error_names_line(tmp_path):
    inv = _write(tmp_path / "inv.yml", "all:\n  hosts: [\n")
    with pytest.raises(ConfigError) as exc:
        load_inventory(inv)
    assert exc.value.where is not None and f"{inv}:" in exc.value.where


def test_ledger_lock_is_exclusive_across_processes_and_reentrant_within_one(tmp_path):
    import subprocess
    import sys

    from sparkctl.state.ledger import Ledger
    ledger = Ledger(tmp_path / "c")
    probe = ("import sys; from pathlib import Path; from sparkctl.state.ledger import Ledger\n"
             "from sparkctl.errors import LockHeldError\n"
             "try:\n    Ledger(Path(sys.argv[1])).lock('probe').__enter__()\nexcept LockHeldError as e:\n"
             "    print(e.message); sys.exit(5)\n")
    with ledger.lock("outer"):
        with ledger.lock("inner"):  # same process: re-entrant
            res = subprocess.run([sys.executable, "-c", probe, str(ledger.root)], capture_output=True, text=True)
            assert res.returncode == 5 and "running `sparkctl outer`" in res.stdout
        res = subprocess.run([sys.executable, "-c", probe, str(ledger.root)], capture_output=True, text=True)
        assert res.returncode == 5  # still held after the inner exit
    res = subprocess.run([sys.executable, "-c", probe, str(ledger.root)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_corrupt_record_is_reported_not_replaced(tmp_path):
    from sparkctl.errors import LedgerError
    from sparkctl.state.ledger import Ledger
    ledger = Ledger(tmp_path / "c")
    ledger.set_active(None)
    ledger.index_path.write_text("{not json")
    # cluster.json is a cache of the records (issue 15): rebuilt from them, never read as the truth or replaced
    assert ledger.active() is None and ledger.index_path.read_text() == "{not json"
    (ledger.root / "deployments").mkdir()
    (ledger.root / "deployments" / "x.json").write_text("{not json")
    with pytest.raises(LedgerError) as exc:
        ledger.active()
    assert "corrupt" in exc.value.message


def _policy_types(annotation, metadata=()) -> list:
    """Each leaf type of a field: (annotation, its policy name or None); models are walked, not leaves."""
    import typing

    from pydantic import BaseModel

    from sparkctl.config.values import Policy, policy_of
    names = [m.name for m in metadata if isinstance(m, Policy)]
    if names:
        return [(annotation, names[0])]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return []
    name = policy_of(annotation)
    if name:
        return [(annotation, name)]
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if not args:
        return [(annotation, None)]
    return [leaf for a in args for leaf in _policy_types(a)]


def _models():
    from pydantic import BaseModel

    from sparkctl.config import inventory, profile
    out = []
    for mod in (profile, inventory):
        out += [v for v in vars(mod).values() if isinstance(v, type) and issubclass(v, BaseModel)
                and v is not BaseModel and v.__module__ == mod.__name__]
    return out


def test_every_profile_and_inventory_field_is_a_value_policy_type():
    """The policy is not a convention: a field typed `str` or `int` (no policy) fails this test."""
    missing = []
    for model in _models():
        assert model.model_config.get("strict") is True, model
        for name, info in model.model_fields.items():
            for leaf, policy in _policy_types(info.annotation, info.metadata):
                if policy is None:
                    missing.append(f"{model.__name__}.{name}: {leaf!r}")
    assert _models() and not missing, missing
