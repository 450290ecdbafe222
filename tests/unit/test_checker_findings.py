"""What the type checker found in sparkctl/ when it was turned on (tests/unit/test_checkers.py), each pinned here."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import typer

from sparkctl.errors import SparkctlError


def test_tune_g6_capture_without_an_active_deployment_is_a_known_error(tmp_path):
    """mypy: `ledger.active()` may be None and `arm_from_record` needs a record. It was an AttributeError
    (an internal error with a traceback); it is a SparkctlError naming the ledger."""
    from sparkctl.tune import g6

    deployer = SimpleNamespace(ledger=SimpleNamespace(active=lambda: None, root=tmp_path))
    with pytest.raises(SparkctlError) as err:
        g6.capture(deployer)  # type: ignore[arg-type]
    assert "no active deployment" in err.value.message
    assert err.value.where == str(tmp_path)


def test_a_typer_exception_without_show_prints_its_message(monkeypatch, capsys):
    """mypy: `typer.TyperException` has no `show()` (only typer's click exceptions do): the CLI boundary
    printed usage errors with `exc.show()`, which would itself fail on a bare TyperException."""
    from sparkctl.cli import main

    def boom(**_kw: object) -> None:
        raise typer.TyperException("bad usage")

    monkeypatch.setattr(main, "app", boom)
    assert main._dispatch(["status"]) == 1
    assert "Error: bad usage" in capsys.readouterr().err


def test_a_click_usage_error_still_shows_usage(capsys):
    from sparkctl.cli import main

    assert main._dispatch(["status", "--no-such-option"]) == 2
    err = capsys.readouterr().err
    assert "Usage: sparkctl status" in err and "No such option: --no-such-option" in err
