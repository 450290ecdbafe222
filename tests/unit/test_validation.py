"""Bad input refused at the CLI boundary (exit 2) with the file, the key and the fix: issue 9's validation gaps.

Each case runs `sparkctl render` (the quickest command that loads and checks everything) and checks the one
line it prints: `<file>: <key>: <what> / fix: <what to do>`, never a traceback, nothing on stdout.
"""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPARKS = REPO / "sparkctl" / "data" / "inventory" / "sparks.example.yml"
HOST = "{{fabric_interface: e, fabric_address: {addr}}}"


def _refused(cli, *args: str) -> str:
    code, out, err = cli("render", *args)
    assert code == 2, err
    assert out == "" and "Traceback" not in err and "internal error" not in err
    assert "\n  fix: " in err, err
    return err


def _head(err: str) -> str:
    """The first line without the 'sparkctl: ' prefix: '<file>: <key>: <message>'."""
    return err.splitlines()[0].removeprefix("sparkctl: ")


PROFILE_CASES = [
    # (profile body, key, message fragment, fix fragment)
    ("extends: d5\nspeculative: {algorithm: FOOBAR}\n", "speculative.algorithm",
     "'FOOBAR' is not accepted by SGLang 0.5.23", "known: DFLASH, UNO, DSPARK, EAGLE, EAGLE3"),
    ("extends: d5\nspeculative: {algorithm: dflash}\n", "speculative.algorithm",
     "'dflash' is not accepted", "did you mean 'DFLASH'?"),
    ("extends: d5\nspeculative: {algorithm: EAGEL3}\n", "speculative.algorithm",
     "'EAGEL3' is not accepted", "did you mean 'EAGLE3'?"),
    ("extends: d5\nimage: {sglang_version: 0.5.11}\nserver: {dsa_prefill_backend: null, dsa_decode_backend: null}\n"
     "speculative: {algorithm: DSPARK}\n", "speculative.algorithm", "'DSPARK' is not accepted by SGLang 0.5.11",
     "known: DFLASH, EAGLE, EAGLE3, STANDALONE, NGRAM, NEXTN"),
    ("extends: d5\nspeculative: {draft_model_path: null}\n", "speculative.draft_model_path",
     "algorithm DFLASH needs a draft model", "set speculative.draft_model_path to the drafter under /models"),
    ("extends: base\nspeculative: {algorithm: EAGLE}\n", "speculative.draft_model_path",
     "algorithm EAGLE needs a draft model", "use algorithm: NEXTN for the model's own MTP layers"),
    ("extends: d5\nspeculative: {num_draft_tokens: 1000}\n", "speculative.num_draft_tokens",
     "less than or equal to 64 (got 1000)", "tokens verified per step, 1..64"),
    ("extends: d5\nspeculative: {num_draft_tokens: 0}\n", "speculative.num_draft_tokens",
     "greater than or equal to 1 (got 0)", "tokens verified per step, 1..64"),
    ("extends: d5\napi: {port: 25000}\n", "api.port", "25000 is also api.dist_port (set in "
     + str(REPO / "sparkctl" / "data" / "profiles" / "base.yml"), "give api.port and api.dist_port different values"),
    ("extends: d5\napi: {dist_port: 30000}\n", "api.dist_port", "30000 is also api.port",
     "give api.port and api.dist_port different values"),
    ('extends: d5\nenv: {NCCL_DEBUG: "INFO\\nLD_PRELOAD=/tmp/x.so"}\n', "env.NCCL_DEBUG",
     "value contains '\\n'", "environment values must be one line"),
    ('extends: d5\nenv: {NCCL_DEBUG: "INFO\\0"}\n', "env.NCCL_DEBUG", "value contains '\\x00'", "without NUL"),
    ('extends: d5\nenv: {"BAD NAME": "1"}\n', "env['BAD NAME']", "not an environment variable name",
     "letters, digits and underscores"),
    ('extends: d5\nenv: {"A\\nB=1": "1"}\n', "env['A\\nB=1']", "not an environment variable name",
     "letters, digits and underscores"),
    ("extends: d5\nenv: {NCCL_DEBUG: }\n", "env.NCCL_DEBUG", "needs a single value (got None)", 'NCCL_DEBUG: ""'),
    ("extends: nosuch\n", "extends", "no profile named 'nosuch'", "known profiles: "),
    ("extends: d55\n", "extends", "no profile named 'd55'", "did you mean 'd5'?"),
]


@pytest.mark.parametrize("body,key,message,fix", PROFILE_CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(PROFILE_CASES)])
def test_bad_profile_names_file_key_and_fix(cli, profiles_dir, body, key, message, fix):
    path = profiles_dir / "v.yml"
    path.write_text(body)
    err = _refused(cli, "--profile", "v", "--inventory", str(SPARKS))
    assert _head(err).startswith(f"{path}: {key}: "), err
    assert message in err and fix in err


def test_missing_drafter_points_at_the_file_that_chose_the_algorithm(cli, profiles_dir):
    """d5 sets the algorithm; a child that only drops the drafter is the file named (its key is the drafter)."""
    (profiles_dir / "child.yml").write_text("extends: d5\ndescription: x\n")
    (profiles_dir / "v.yml").write_text("extends: child\nspeculative: {draft_model_path: null}\n")
    err = _refused(cli, "--profile", "v", "--inventory", str(SPARKS))
    assert _head(err).startswith(f"{profiles_dir / 'v.yml'}: speculative.draft_model_path: ")


@pytest.mark.parametrize("content,message", [
    (b"\x7fELF\x02\x01\x01\x00\x00\x00\xd0\xfe\xff", "not UTF-8 text (byte 0xd0 at offset 10)"),
    (b"model:\n  path: /m\x00\n", "not a YAML text file: control character #x0000 at offset 17"),
    ("server: {tp_size: 2}\n".encode("utf-16"), "not UTF-8 text (byte 0xff at offset 0)"),
])
def test_binary_or_non_utf8_profile_is_a_clear_error(cli, profiles_dir, content, message):
    path = profiles_dir / "v.yml"
    path.write_bytes(content)
    err = _refused(cli, "--profile", "v", "--inventory", str(SPARKS))
    assert _head(err) == f"{path}: {message}" and "UTF-8 YAML text" in err


def _hosts(*addrs: str, extra: str = "") -> str:
    rows = "".join(f"    n{i}: {HOST.format(addr=a)}\n" for i, a in enumerate(addrs))
    return f"all:\n{extra}  hosts:\n{rows}"


INVENTORY_CASES = [
    # (inventory body, key, message fragment, fix fragment)
    (_hosts("198.18.0.1", "198.18.0.1"), "hosts.n1.fabric_address", "198.18.0.1 is also hosts.n0.fabric_address",
     "give every node its own address on the fabric link"),
    (_hosts("198.18.0.1", "198.18.0.2", extra="  vars: {sparkctl_cluster: ../x}\n"), "all.vars.sparkctl_cluster",
     "'../x' is not a plain cluster name", "letters, digits, '-' and '_' only"),
    (_hosts("198.18.0.1", "198.18.0.2", extra="  vars: {sparkctl_cluster: /abs}\n"), "all.vars.sparkctl_cluster",
     "'/abs' is not a plain cluster name", "letters, digits, '-' and '_' only"),
    (_hosts("198.18.0.1", "198.18.0.2", extra="  vars: {sparkctl_cluster: a/b}\n"), "all.vars.sparkctl_cluster",
     "'a/b' is not a plain cluster name", "it becomes a directory under the state root"),
    (_hosts("198.18.0.1", "198.18.0.2", extra="  vars: {sparkctl_cluster: '..'}\n"), "all.vars.sparkctl_cluster",
     "'..' is not a plain cluster name", "letters, digits"),
    (_hosts("198.18.0.1", "198.18.0.2", "198.18.0.3"), "hosts",
     "3 node(s) with 3 GPU(s) cannot hold the 2 ranks of server.tp_size (set in " + str(REPO / "sparkctl" / "data" / "profiles" / "base.yml"),
     "list 2 single-GPU nodes"),
    (_hosts("198.18.0.1"), "hosts", "1 node(s) with 1 GPU(s) cannot hold the 2 ranks", "list 2 single-GPU nodes"),
    ("all:\n  hosts:\n    a: {sparkctl_rank: 0, fabric_interface: e, fabric_address: 198.18.0.1}\n"
     "    b: {fabric_interface: e, fabric_address: 198.18.0.2}\n", "hosts.b.sparkctl_rank",
     "missing (other hosts set it)", "set sparkctl_rank on all nodes"),
    ("all:\n  hosts:\n    a: {sparkctl_rank: 0, fabric_interface: e, fabric_address: 198.18.0.1}\n"
     "    b: {sparkctl_rank: 2, fabric_interface: e, fabric_address: 198.18.0.2}\n", "sparkctl_rank",
     "must have ranks 0..1 once each (got [0, 2])", "without gaps or repeats"),
    ("all:\n  hosts:\n    a: {sparkctl_rank: zero, fabric_interface: e, fabric_address: 198.18.0.1}\n"
     "    b: {sparkctl_rank: 1, fabric_interface: e, fabric_address: 198.18.0.2}\n", "hosts.a.sparkctl_rank",
     "not an integer (got 'zero')", "set sparkctl_rank on all nodes"),
]


@pytest.mark.parametrize("body,key,message,fix", INVENTORY_CASES,
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(INVENTORY_CASES)])
def test_bad_inventory_names_the_inventory_key_and_fix(cli, tmp_path, state_dir, body, key, message, fix):
    inv = tmp_path / "inv.yml"
    inv.write_text(body)
    err = _refused(cli, "--profile", "d5", "--inventory", str(inv))
    assert _head(err).startswith(f"{inv}: {key}: "), err
    assert message in err and fix in err
    assert not state_dir.exists() and not (tmp_path / "x").exists()  # nothing written, inside or outside


def test_binary_inventory_is_a_clear_error(cli, tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    err = _refused(cli, "--profile", "d5", "--inventory", str(inv))
    assert _head(err) == f"{inv}: not UTF-8 text (byte 0x89 at offset 0)"


def test_plain_cluster_names_still_load(tmp_path):
    from sparkctl.config.inventory import load_inventory
    for name in ("desk", "t12x34", "testcluster-va-lifecycle_0", "A1"):
        inv = tmp_path / "inv.yml"
        inv.write_text(_hosts("198.18.0.1", "198.18.0.2", extra=f"  vars: {{sparkctl_cluster: {name}}}\n"))
        assert load_inventory(inv).cluster.name == name
