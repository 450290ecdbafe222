"""CLI habits from issue 9: exit codes that scripts can rely on, flags that behave like flags, no deploy unasked."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPARKS = str(REPO / "sparkctl" / "data" / "inventory" / "sparks.example.yml")


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
