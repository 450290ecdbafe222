"""Every runtime's displayed argv (`up --dry-run`, the docker runtime's config hash) is redacted by field: the
value of a secret flag is '***' by position, and any other argument stays as it is, even when it equals a secret
(an API key "8" never hides ``--speculative-num-draft-tokens 8``). Generated over every value of the rendered D5
argv taken in turn as the API key (and the HF token), for the process and the docker runtime."""
from __future__ import annotations

import dataclasses

import pytest

from sparkctl.config.inventory import load_inventory
from sparkctl.config.profile import load_profile
from sparkctl.nodes.container import container_config
from sparkctl.nodes.docker_runtime import DockerRuntime
from sparkctl.nodes.process import ProcessRuntime
from sparkctl.nodes.ssh import CommandResult
from sparkctl.redaction import REDACTED
from sparkctl.sglang.launch import LaunchSpec
from sparkctl.sglang.render import render
from testrig.embedded import write_embedded_inventory

SECRET_FLAGS = ["--api-key", "{v}", "--admin-api-key={v}", "--ssl-keyfile-password", "{v}"]


@pytest.fixture(scope="module")
def inventory(tmp_path_factory):
    return load_inventory(write_embedded_inventory(tmp_path_factory.mktemp("inv") / "inventory.yml", {}))


def _values(inventory) -> list[str]:
    """Every argument of the rendered D5 argv that is a value (not a flag): numbers, paths, names."""
    argv = render(load_profile("d5"), inventory, environ={"SPARKCTL_API_KEY": "k", "HF_TOKEN": "t"}).specs[0].argv
    return sorted({a for a in argv[3:] if not a.startswith("-")})


def _specs(inventory, value: str) -> list[LaunchSpec]:
    """D5 rendered with API key and HF token equal to `value`, each rank's argv also carrying the secret flags
    with that value (what a LaunchSpec built at the runtime level may hold)."""
    specs = render(load_profile("d5"), inventory, environ={"SPARKCTL_API_KEY": value, "HF_TOKEN": value}).specs
    assert all(value in s.secret_values for s in specs)
    flags = [f.format(v=value) for f in SECRET_FLAGS]
    return [dataclasses.replace(s, argv=s.argv + flags) for s in specs]


def _check(shown: list[str], argv: list[str], value: str) -> None:
    """`shown` is `argv` with exactly the secret flags' values hidden; every other occurrence of `value` stays."""
    tail = ["--api-key", REDACTED, f"--admin-api-key={REDACTED}", "--ssl-keyfile-password", REDACTED]
    assert len(shown) == len(argv) and shown[-len(tail):] == tail, shown[-len(tail):]
    assert shown[:-len(tail)] == argv[:-len(tail)]        # nothing else changed, `value` included where it is
    assert value in argv[:-len(tail)] or value not in shown


def test_the_values_taken_as_secrets_include_the_speculative_and_capacity_numbers(inventory):
    values = _values(inventory)
    assert {"8", "2", "131072", "65536", "0.88"} <= set(values) and len(values) > 15


def test_process_runtime_redacts_argv_by_field(inventory, tmp_path):
    rt = ProcessRuntime(tmp_path / "logs" / "dep-1", {}, secrets_root=tmp_path / "secrets")
    for value in _values(inventory):
        for spec in _specs(inventory, value):
            shown = rt.launch_argv(spec, "dep-1")
            _check(shown, rt._command(spec), value)


def test_process_runtime_keeps_draft_tokens_when_the_key_is_8(inventory, tmp_path):
    rt = ProcessRuntime(tmp_path / "logs" / "dep-1", {}, secrets_root=tmp_path / "secrets")
    spec = _specs(inventory, "8")[0]
    shown = rt.launch_argv(spec, "dep-1")
    i = shown.index("--speculative-num-draft-tokens")
    assert shown[i + 1] == "8"
    assert shown[shown.index("--api-key") + 1] == REDACTED and f"--admin-api-key={REDACTED}" in shown
    assert "--admin-api-key=8" not in shown and shown.count("8") == spec.argv.count("8") - 2


class _NoInfiniband:
    address = "root@198.19.0.1:22"

    def run(self, argv, **_kw):  # noqa: ANN001
        assert argv[:2] == ["ls", "-1A"], argv          # the only command launch_argv may run (a read-only probe)
        return CommandResult("spark-a", list(argv), 2, "", "No such file", 0.0)


def test_docker_runtime_redacts_argv_by_field(inventory):
    for value in _values(inventory):
        for spec in _specs(inventory, value):
            node = inventory.node(spec.node)
            rt = DockerRuntime(inventory, node, cluster="desk", connector=_NoInfiniband(),  # type: ignore[arg-type]
                               environ={"SPARKCTL_ENGINE_IMAGE": "sglang-gb10:abc"})
            shown = rt.launch_argv(spec, "dep-1")
            full = rt._config(spec, "dep-1").argv
            assert shown[:full.index("--env-file")] == full[:full.index("--env-file")]   # docker's own flags
            _check(shown, full, value)


def test_docker_config_hash_counts_a_number_equal_to_a_secret(inventory):
    """The reuse hash is over the argv redacted by field: two launches that differ only in a number equal to the
    API key are two launches (by value they hashed the same: '***' in both), while the secret itself never
    counts (a new key is the same launch)."""
    spec = _specs(inventory, "8")[0]
    node = inventory.node(spec.node)

    def label(s: LaunchSpec) -> str:
        return container_config(s, node, cluster="desk", deployment_id="dep-1",
                                image="sglang-gb10:abc").labels["sparkctl.config-hash"]
    i = spec.argv.index("--speculative-num-draft-tokens")
    other = dataclasses.replace(spec, argv=spec.argv[:i + 1] + ["4"] + spec.argv[i + 2:],
                                secret_values=frozenset({"8", "4"}))
    assert label(spec) != label(other)
    assert label(spec) == label(_specs(inventory, "9")[0])    # another key (same numbers): the same launch
