"""CLI habits from issue 9: exit codes that scripts can rely on, flags that behave like flags, no deploy unasked."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPARKS = str(REPO / "inventory" / "sparks.example.yml")


def test_help_shows_flags_without_a_value_and_yes_takes_none(cli):
    code, out, _ = cli("up", "--help")
    assert code == 0
    for name in ("--yes", "--dry-run", "--json", "--no-rollback", "--help"):
        line = next(ln for ln in out.splitlines() if name in ln)
        assert "<bool>" not in line, line
    code, out, _ = cli("--help")
    assert code == 0 and "<bool>" not in out
    code, _, err = cli("up", "--profile", "d5", "--yes", "true")
    assert code == 2 and "unexpected extra argument" in err.lower()


@pytest.mark.parametrize("argv", [["-v", "render", "--profile", "d5"], ["render", "--profile", "d5", "-v"],
                                  ["render", "-v", "--profile", "d5", "--verbose"]])
def test_verbose_works_before_or_after_the_subcommand(cli, argv):
    code, out, err = cli(*argv)
    assert code == 0, err
    assert "--model-path" in out


def test_hoist_verbose_leaves_arguments_after_double_dash():
    from sparkctl.cli.main import _hoist_verbose
    assert _hoist_verbose(["up", "-v", "--profile", "d5"]) == ["--verbose", "up", "--profile", "d5"]
    assert _hoist_verbose(["x", "--", "-v"]) == ["x", "--", "-v"]
    assert _hoist_verbose(["status"]) == ["status"]


@pytest.mark.parametrize("value", ["not-a-url", "ftp://h:1", "http://", "http://h:port"])
def test_bench_endpoint_that_is_not_a_url_is_exit_2(cli, value, state_dir):
    code, out, err = cli("bench", "--endpoint", value)
    assert code == 2 and out == ""
    assert f"--endpoint: {value!r} is not a URL" in err and "fix: give the server's base URL" in err
    assert "cannot reach" not in err


def test_rollback_with_no_history_is_exit_2_naming_what_to_do(cli, state_dir, local_cluster):
    code, out, err = cli("rollback", "--yes")
    assert code == 2 and out == ""
    assert "nothing to roll back to: no earlier known-good deployment is recorded; nothing was changed" in err
    assert "fix: name the profile to go to: sparkctl rollback --to PROFILE" in err


@pytest.mark.parametrize("argv", [["up", "--profile", "d5"], ["rollback", "--to", "dflash-off"]])
def test_non_interactive_change_without_yes_is_refused_on_a_real_cluster(cli, state_dir, argv):
    code, out, err = cli(*argv, "--inventory", SPARKS)
    assert code == 2 and out == ""
    assert "without confirmation: stdin is not a terminal" in err and "nothing was changed" in err
    assert "fix: add --yes to confirm non-interactively" in err
    assert not (state_dir / "desk" / "deployments").exists()


# ---------------------------------------------------------------- issue 17: conventional habits

def _commands():
    """(name, click command) of every leaf command of the CLI, e.g. ('image plan', <Command>)."""
    import typer as _typer

    from sparkctl.cli.main import app

    out = []

    def walk(cmd, prefix):
        if hasattr(cmd, "commands"):
            for name, sub in sorted(cmd.commands.items()):
                walk(sub, f"{prefix} {name}".strip())
        else:
            out.append((prefix, cmd))
    walk(_typer.main.get_command(app), "")
    return out


def test_version_and_short_help(cli):
    from sparkctl.resources import version
    code, out, _ = cli("--version")
    assert code == 0 and out.strip() == f"sparkctl {version()}"
    for argv in (["-h"], ["up", "-h"], ["image", "plan", "-h"]):
        code, short, _ = cli(*argv)
        code_long, long, _ = cli(*argv[:-1], "--help")
        assert code == code_long == 0 and short == long and "Usage:" in short


def test_every_help_documents_the_exit_codes(cli):
    for name, _cmd in _commands():
        code, out, _ = cli(*name.split(), "--help")
        assert code == 0 and "1 cancelled at the prompt" in " ".join(out.split()), name


def test_shell_completion_script(cli):
    code, out, err = cli("--show-completion", "bash")
    assert code == 0 and "_sparkctl_completion" in out and "complete " in out, (code, out[-2000:], err[-2000:])
    code, out, _ = cli("--help")
    assert "--install-completion" in out and "<bool>" not in out


# Commands that read no inventory: the file formats, and patch series checked against released SGLang wheels.
NO_INVENTORY = {"schema", "patches check"}


def test_inventory_option_on_every_command_that_reads_one():
    for name, cmd in _commands():
        opts = {o for p in cmd.params for o in p.opts}
        assert ("--inventory" in opts) == (name not in NO_INVENTORY), name


def test_profiles_takes_an_inventory_and_checks_each_profile_against_it(cli, tmp_path):
    import json
    code, out, err = cli("profiles", "--inventory", SPARKS, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["inventory"] == SPARKS and not doc["emulated"]
    assert {p["name"] for p in doc["profiles"]} >= {"base", "d5", "dflash-off"}
    assert all(p["renders"] and p["problem"] is None for p in doc["profiles"])
    one = tmp_path / "one.yml"    # one node: no shipped profile (TP=2) renders there, and each says why
    import yaml
    inv = yaml.safe_load(Path(SPARKS).read_text())
    hosts = inv["all"]["children"]["sparks"]["hosts"]
    hosts.pop(sorted(hosts)[1])
    one.write_text(yaml.safe_dump(inv))
    code, out, err = cli("profiles", "--inventory", str(one), "--json")
    assert code == 0, err
    for p in json.loads(out)["profiles"]:
        assert not p["renders"] and "cannot hold the 2 ranks" in p["problem"], p


def test_exit_1_is_only_cancelled():
    """Exit 1 is reserved for "cancelled at the prompt": no other error class may carry it (the base is 2)."""
    import importlib
    import pkgutil

    import sparkctl
    from sparkctl.errors import CancelledError, SparkctlError
    for mod in pkgutil.walk_packages(sparkctl.__path__, "sparkctl."):
        if not mod.name.startswith(("sparkctl.sim.__main__", "sparkctl.__main__")):
            importlib.import_module(mod.name)

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)
    ones = [c for c in [SparkctlError, *subclasses(SparkctlError)] if c.exit_code == 1]
    assert ones == [CancelledError]


def test_logs_with_nothing_deployed_is_exit_2(cli, state_dir, local_cluster):
    code, out, err = cli("logs")
    assert code == 2 and out == "" and "no deployment recorded yet" in err


def test_quiet_silences_progress_anywhere_on_the_line(cli, state_dir, local_cluster):
    code, out, err = cli("up", "--profile", "d5", "--dry-run", "-q")
    assert code == 0, err
    assert not [ln for ln in err.splitlines() if "s] " in ln], err
    code, _, err_loud = cli("up", "--profile", "d5", "--dry-run")
    assert code == 0 and "s] " in err_loud


def test_progress_on_a_terminal_is_a_live_display_and_lines_without_one():
    import io
    import time as _time

    from sparkctl.deploy.progress import Reporter, close_live

    class Tty(io.StringIO):
        def isatty(self):
            return True
    plain = io.StringIO()
    r = Reporter(plain)
    r.stage("boot", "rank 1 starting")
    r.event("KV cache allocated", node="spark-b")
    lines = plain.getvalue().splitlines()
    assert len(lines) == 2 and all(ln.startswith("[") and "s] boot" in ln for ln in lines)
    assert "\x1b" not in plain.getvalue()

    tty = Tty()
    r = Reporter(tty)
    r.stage("boot", "rank 1 starting")
    r.event("KV cache allocated", node="spark-b")
    _time.sleep(0.6)               # the display redraws on its own while nothing happens (4 times a second)
    close_live()
    shown = tty.getvalue()
    assert "boot       [spark-b] KV cache allocated" in shown          # the lines still scroll above it
    assert "s in stage" in shown and "s total" in shown and "\x1b[" in shown   # the live line: stage + elapsed


def test_image_plan_on_the_embedded_cluster_marks_the_base_digest_unresolved(cli, state_dir, local_cluster):
    import json
    code, out, err = cli("image", "plan", "--profile", "d5", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["resolved"] is False and "engine.inputs.base_digest" in doc["unresolved"]
    assert doc["engine"]["tag"] is None and doc["engine"]["inputs"]["base_digest"] is None
    assert doc["engine"]["inputs"]["series"] == "gb10-0.5.23"
    assert len(doc["launch"]["inputs"]["launch_spec_sha256"]) == 64
    assert "local process, not in Docker" in doc["reason"]
    from sparkctl.cli.outputs import ImagePlanOutput
    assert set(doc) == set(ImagePlanOutput.model_fields)


def test_schema_lists_and_exports_every_json_output(cli):
    import json

    from sparkctl.cli.outputs import LIFECYCLE_OUTPUTS, OUTPUTS
    code, out, _ = cli("schema", "list")
    assert code == 0 and out.split() == ["profile", "inventory", *OUTPUTS, *LIFECYCLE_OUTPUTS]
    for name in [*OUTPUTS, *LIFECYCLE_OUTPUTS]:
        code, out, _ = cli("schema", name)
        assert code == 0 and json.loads(out)["type"] in ("object", "array"), name
    code, _, err = cli("schema", "nope")
    assert code == 2 and "image-plan" in err


def test_fabric_address_on_loopback_is_the_inventorys_not_127_0_0_1():
    from sparkctl.prepare.plays import fabric_address_held
    assert fabric_address_held("127.0.0.2", ("127.0.0.1/8",)) is True
    assert fabric_address_held("10.0.0.2", ("10.0.0.2/24",)) is True
    assert fabric_address_held("10.0.1.2", ("10.0.0.1/24",)) is False
    assert fabric_address_held(None, ("10.0.0.1/24",)) is None


def _shape(doc):
    """The key structure of a JSON document (values dropped), to compare outcomes."""
    if isinstance(doc, dict):
        return {k: _shape(v) for k, v in doc.items()}
    return None


def test_image_plan_has_the_same_keys_resolved_or_not():
    """The plan with a known base (what a docker node answers) and without one (the embedded cluster): same keys,
    both valid ImagePlanOutput documents."""
    from sparkctl.cli.outputs import ImagePlanOutput
    from sparkctl.config.inventory import load_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.images.plan import BaseImage, plan_images, unresolved_plan

    prof, inv = load_profile("d5"), load_inventory(Path(SPARKS))
    base = BaseImage("lmsysorg/sglang:v0.5.23", "sha256:" + "1" * 64, "lmsysorg/sglang@sha256:" + "2" * 64)
    resolved = plan_images(prof, inv, base).to_json()
    unresolved = unresolved_plan(prof, inv, "no docker")
    assert _shape(resolved) == _shape(unresolved)
    for doc in (resolved, unresolved):
        ImagePlanOutput.model_validate(doc)
    assert resolved["resolved"] and resolved["engine"]["tag"].startswith("sparkctl/sglang-gb10:0.5.23-gb10-0.5.23-")
    same = {k: v for k, v in resolved["engine"]["inputs"].items() if k != "base_digest"}
    assert same == {k: v for k, v in unresolved["engine"]["inputs"].items() if k != "base_digest"}
    assert resolved["launch"]["inputs"]["launch_spec_sha256"] == unresolved["launch"]["inputs"]["launch_spec_sha256"]


# --json commands whose output model lives with their owners and has no entry of its own (deploy/'s results).
JSON_ELSEWHERE = {"repair", "preflight"}


def test_every_json_output_of_these_commands_has_a_schema():
    """A command's --json output has a model `sparkctl schema NAME` prints: one of cli/outputs.py's, or its
    owner's (the lifecycle's results, the card, the tune journal) named in LIFECYCLE_OUTPUTS."""
    from sparkctl.cli.outputs import LIFECYCLE_OUTPUTS, OUTPUTS
    for name, cmd in _commands():
        opts = {o for p in cmd.params for o in p.opts}
        if "--json" in opts and name not in JSON_ELSEWHERE:
            key = name.replace(" ", "-")
            assert key in OUTPUTS or key in LIFECYCLE_OUTPUTS, f"{name} --json has no output model"
