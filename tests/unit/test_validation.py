"""Bad input refused at the CLI boundary (exit 2) with the file, the key and the fix: issue 9's validation gaps.

Each case runs `sparkctl render` (the quickest command that loads and checks everything) and checks the one
line it prints: `<file>: <key>: <what> / fix: <what to do>`, never a traceback, nothing on stdout.
"""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPARKS = REPO / "inventory" / "sparks.example.yml"
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
     + str(REPO / "profiles" / "base.yml"), "give api.port and api.dist_port different values"),
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


@pytest.mark.parametrize("body,key,message,fix", PROFILE_CASES,
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(PROFILE_CASES)])
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
     "3 node(s) with 3 GPU(s) cannot hold the 2 ranks of server.tp_size (set in " + str(REPO / "profiles" / "base.yml"),
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


# Issue 16: one value policy (sparkctl/config/values.py) over every field. Each case: the profile body (extending
# d5), the key named, what was wrong, the fix.
POLICY_PROFILE_CASES = [
    ("api: {port: true}\n", "api.port", "true is a boolean, not a number", "write the number itself"),
    ("server: {max_total_tokens: true}\n", "server.max_total_tokens", "true is a boolean, not a number",
     "--max-total-tokens"),
    ("server: {mem_fraction_static: .nan}\n", "server.mem_fraction_static", "", ""),
    ("warmup: {timeout_s: .inf}\n", "warmup.timeout_s", "not a finite number", "give a number"),
    ("server: {tp_size: \"2\"}\n", "server.tp_size", "valid integer", "tp_size is --tp-size"),
    ("image: {sglang_version: 0.5}\n", "image.sglang_version", "0.5 is a float, not a string",
     'quote it: sglang_version: "0.5"'),
    ("model: {trust_remote_code: yes}\n", "model.trust_remote_code", "valid boolean (got 'yes')", ""),
    ("model: {path: \"-oProxyCommand=x\"}\n", "model.path", "starts with '-'", "remove the leading '-'"),
    ("model: {path: \"--api-key=x\"}\n", "model.path", "starts with '-'", "remove the leading '-'"),
    ("model: {path: \"\"}\n", "model.path", "is empty", "absolute path"),
    ("model: {path: models/x}\n", "model.path", "'models/x' is not an absolute path", "starting with '/'"),
    ("model: {path: /models/../etc}\n", "model.path", "has a '..' segment", "without '..'"),
    ("model: {path: /models//x/}\n", "model.path", "is not normalised", "write it as '/models/x'"),
    ("model: {path: /etc/x}\n", "model.path", "'/etc/x' is not under /models", "host_paths.models"),
    ("speculative: {draft_model_path: /srv/d}\n", "speculative.draft_model_path", "is not under /models", ""),
    ("model: {served_name: \"--port\"}\n", "model.served_name", "starts with '-'", ""),
    ("model: {served_name: \"a\\tb\"}\n", "model.served_name", "control character '\\t'", "one line"),
    ("server: {kv_cache_dtype: \"bf16 --x\"}\n", "server.kv_cache_dtype", "contains whitespace", ""),
    ("image: {base_image: Lmsysorg/SGLang:v1}\n", "image.base_image", "is not an image reference",
     "did you mean 'lmsysorg/sglang:v1'?"),
    ("image: {ref: \"a:b:c\"}\n", "image.ref", "is not an image reference", "lowercase repository"),
    ("image: {patch_series: ../../etc}\n", "image.patch_series", "is not a plain name", "no '/', '..'"),
    ("env: {PYTHONPATH: /tmp/x}\n", "env.PYTHONPATH", "loader/interpreter variable (PYTHON*)", "patch series"),
    ("env: {LD_PRELOAD: /tmp/x.so}\n", "env.LD_PRELOAD", "loader/interpreter variable (LD_*)", ""),
    ("env: {PATH: /tmp}\n", "env.PATH", "loader/interpreter variable (PATH)", ""),
    ("env: {SGLANG_HOST_IP: 1.2.3.4}\n", "env.SGLANG_HOST_IP", "is set by sparkctl", "fabric_address"),
    ("env: {HF_TOKEN_PATH: /tmp/t}\n", "env.HF_TOKEN_PATH", "is set by sparkctl", "api.hf_token_env"),
    ("env: {NCCL_SOCKET_IFNAME: eth0}\n", "env.NCCL_SOCKET_IFNAME", "is set by sparkctl", "fabric_interface"),
    ("env: {HF_TOKEN: hf_x}\n", "env.HF_TOKEN", "is set by sparkctl", "never in env"),
    ("env: {NCCL_DEBUG: \"\\e[31m\"}\n", "env.NCCL_DEBUG", "control character", ""),
    ("server: {extra_args: [--max-totl-tokens, \"5\"]}\n", "server.extra_args",
     "'--max-totl-tokens' is not a flag of SGLang 0.5.23", "did you mean '--max-total-tokens'?"),
    ("server: {extra_args: [--max-prefill-tokens, lots]}\n", "server.extra_args",
     "--max-prefill-tokens takes an integer (got 'lots')", ""),
    ("server: {extra_args: [--context-length, \"4096\"]}\n", "server.extra_args",
     "--context-length is already set by server.context_length", "remove it from extra_args"),
    ("server: {extra_args: [--enable-cache-report, --enable-cache-report]}\n", "server.extra_args",
     "--enable-cache-report is given twice", "set it once"),
    ("server: {extra_args: [--enable-cache-report=1]}\n", "server.extra_args", "takes no value", ""),
    ("server: {extra_args: [--tool-call-parser, --port]}\n", "server.extra_args", "needs a value", ""),
    ("server: {extra_args: [stray]}\n", "server.extra_args", "a value with no flag before it", ""),
    ("server: {extra_args: [--api-key, k]}\n", "server.extra_args", "--api-key is set by sparkctl",
     "api.api_key_env"),
]


@pytest.mark.parametrize("body,key,message,fix", POLICY_PROFILE_CASES,
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(POLICY_PROFILE_CASES)])
def test_value_policy_refuses_with_file_key_and_fix(cli, profiles_dir, body, key, message, fix):
    path = profiles_dir / "v.yml"
    path.write_text("extends: d5\n" + body)
    err = _refused(cli, "--profile", "v", "--inventory", str(SPARKS))
    assert _head(err).startswith(f"{path}: {key}: "), err
    assert message in err and fix in err


def test_env_values_are_the_strings_as_written(cli, profiles_dir):
    """YAML 1.1 read 010, 12:30, yes, 0x1F as 8, 750, true, 31; sparkctl passes what the file says."""
    (profiles_dir / "v.yml").write_text("extends: d5\nenv: {A: 010, B: 12:30, C: yes, D: 0x1F, E: 1e3, F: true}\n")
    import json
    code, out, err = cli("render", "--profile", "v", "--inventory", str(SPARKS), "--json", "--rank", "0")
    assert code == 0, err
    env = json.loads(out)["ranks"][0]["env"]
    assert {k: env[k] for k in "ABCDEF"} == {"A": "010", "B": "12:30", "C": "yes", "D": "0x1F", "E": "1e3",
                                             "F": "true"}


def test_yaml_1_2_core_schema_outside_env(profiles_dir):
    """Outside env too: `yes` is a string (so a boolean field refuses it), 010 is ten (not octal 8)."""
    from sparkctl.config.loader import read_yaml
    path = profiles_dir / "doc.yml"
    path.write_text("a: 010\nb: 0x1F\nc: 12:30\nd: yes\ne: 2024-01-01\nf: 0o17\ng: ~\nh: True\n")
    assert read_yaml(path) == {"a": 10, "b": 31, "c": "12:30", "d": "yes", "e": "2024-01-01", "f": 15, "g": None,
                               "h": True}


def _inventory(**host: str) -> str:
    host = {"fabric_interface": "eth0", "fabric_address": "198.18.0.1", **host}
    rows = "".join(f"      {k}: {v}\n" for k, v in host.items())
    return ("all:\n  hosts:\n    a:\n" + rows +
            "    b: {fabric_interface: eth0, fabric_address: 198.18.0.2}\n")


POLICY_INVENTORY_CASES = [
    ({"fabric_interface": '"eth0\\n    evil0:"'}, "hosts.a.fabric_interface", "control character '\\n'", "one line"),
    ({"fabric_interface": "en/p1"}, "hosts.a.fabric_interface", "not a Linux interface name", "ip link"),
    ({"fabric_interface": "enp1s0f0np0abcde"}, "hosts.a.fabric_interface", "is 16 bytes: Linux interface names "
     "are 1-15 bytes", ""),
    ({"fabric_interface": '"a:1"'}, "hosts.a.fabric_interface", "not a Linux interface name", ""),
    ({"fabric_interface": '"eth0,eth1"'}, "hosts.a.fabric_interface", "comma list", ""),
    ({"roce_hcas": "[mlx5_0, 'x y']"}, "hosts.a.roce_hcas[1]", "not an RDMA device name", "ibv_devices"),
    ({"ansible_host": '"-oProxyCommand=id"'}, "hosts.a.ansible_host", "starts with '-'", "remove the leading '-'"),
    ({"ansible_host": '"a b"'}, "hosts.a.ansible_host", "contains whitespace", ""),
    ({"ansible_user": '"-l root"'}, "hosts.a.ansible_user", "", ""),
    ({"ansible_port": "true"}, "hosts.a.ansible_port", "true is a boolean, not a number", ""),
    ({"ansible_port": "70000"}, "hosts.a.ansible_port", "less than or equal to 65535", ""),
    ({"ansible_ssh_private_key_file": "id_rsa"}, "hosts.a.ansible_ssh_private_key_file",
     "is not an absolute path", "(or ~/...)"),
    ({"host_paths": "{models: /srv/../etc}"}, "hosts.a.host_paths.models", "has a '..' segment", ""),
    ({"host_paths": "{cache: relative}"}, "hosts.a.host_paths.cache", "is not an absolute path", ""),
    ({"gpus": "1.5"}, "hosts.a.gpus", "valid integer", ""),
    ({"api_bind": '"-x"'}, "hosts.a.api_bind", "starts with '-'", ""),
    ({"runtime": "true"}, "hosts.a.runtime", "", ""),
]


@pytest.mark.parametrize("host,key,message,fix", POLICY_INVENTORY_CASES,
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(POLICY_INVENTORY_CASES)])
def test_inventory_value_policy_names_the_ansible_key(cli, tmp_path, host, key, message, fix):
    inv = tmp_path / "inv.yml"
    inv.write_text(_inventory(**host))
    err = _refused(cli, "--profile", "d5", "--inventory", str(inv))
    assert _head(err).startswith(f"{inv}: {key}: "), err
    assert message in err and fix in err


@pytest.mark.parametrize("body,message", [
    ("all: [1, 2]\n", "all: expected a mapping (got list)"),
    ("all:\n  hosts: [a, b]\n", "all.hosts: expected a mapping (got list)"),
    ("all:\n  hosts:\n    a: 5\n", "all.hosts.a: expected the host's variables as a mapping (got int)"),
    ("all:\n  vars: [x]\n  hosts: {}\n", "all.vars: expected a mapping (got list)"),
    ("all:\n  hosts:\n    1: {fabric_interface: e, fabric_address: 198.18.0.1}\n", "key 1 is not a string"),
])
def test_inventory_of_the_wrong_shape_is_refused(cli, tmp_path, body, message):
    inv = tmp_path / "inv.yml"
    inv.write_text(body)
    err = _refused(cli, "--profile", "d5", "--inventory", str(inv))
    assert message in _head(err), err


# Bounded parsing: each refused quickly, naming the file (the figures are in benchmarks/bench_yaml_bounds.py).
def _bomb(levels: int = 14) -> str:
    lines = ["l0: &l0 [" + ",".join(['"lol"'] * levels) + "]"]
    lines += [f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * levels) + "]" for i in range(1, levels)]
    return "extends: d5\nx:\n" + "".join(f"  {line}\n" for line in lines)


@pytest.mark.parametrize("body,message", [
    (_bomb(), "expands to more than 1000000 nodes and characters through its aliases"),
    ("extends: d5\nx: &a [*a]\n", "a recursive alias"),
    ("extends: d5\nx: " + "[" * 5000 + "]" * 5000 + "\n", "nesting deeper than 32 levels"),
    ("extends: d5\n" + "#" * (1 << 20) + "\n", "more than the 1048576 bytes a profile or inventory may have"),
])
def test_hostile_yaml_is_refused_with_the_file_named(cli, profiles_dir, body, message):
    path = profiles_dir / "v.yml"
    path.write_text(body)
    err = _refused(cli, "--profile", "v", "--inventory", str(SPARKS))
    assert _head(err).startswith(str(path)) and message in err, err


def test_an_endless_file_is_refused_after_the_bound_not_read(cli):
    err = _refused(cli, "--profile", "d5", "--inventory", "/dev/zero")
    assert _head(err) == "/dev/zero: more than the 1048576 bytes a profile or inventory may have"


def test_a_long_extends_chain_is_refused_not_a_recursion_error(cli, profiles_dir):
    (profiles_dir / "c0.yml").write_text("extends: d5\n")
    for i in range(1, 1200):
        (profiles_dir / f"c{i}.yml").write_text(f"extends: c{i - 1}\n")
    err = _refused(cli, "--profile", "c1199", "--inventory", str(SPARKS))
    assert _head(err).startswith(f"{profiles_dir / 'c1199.yml'}: extends: chain longer than 16 profiles"), err


# CLI numbers (sparkctl/cli/bounds.py): a usage error naming the flag, before anything runs.
@pytest.mark.parametrize("args,flag", [
    (["up", "--profile", "d5", "--boot-timeout", "-5"], "--boot-timeout"),
    (["up", "--profile", "d5", "--boot-timeout", "0"], "--boot-timeout"),
    (["up", "--profile", "d5", "--boot-timeout", "nan"], "--boot-timeout"),
    (["up", "--profile", "d5", "--boot-timeout", "inf"], "--boot-timeout"),
    (["rollback", "--boot-timeout", "1e999"], "--boot-timeout"),
    (["logs", "--tail", "-3"], "--tail"),
    (["logs", "--tail", "2.5"], "--tail"),
    (["logs", "--rank", "-1"], "--rank"),
    (["render", "--profile", "d5", "--rank", "-1"], "--rank"),
])
def test_cli_numbers_out_of_range_exit_2_naming_the_flag(cli, state_dir, args, flag):
    code, out, err = cli(*args)
    assert code == 2, err
    assert f"Invalid value for '{flag}'" in err and "Traceback" not in err
    assert not state_dir.exists()  # refused before any command touched the cluster
