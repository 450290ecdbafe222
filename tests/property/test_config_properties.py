"""Generated cases over the profile and inventory schemas: every mutated document either renders an argv that
SGLang's parser (the dialect's schema, rebuilt as argparse) accepts, or exits 2 naming the file, the key and a
fix; never exit 70, never a traceback. The real SGLang parser judges a bounded sample of the accepted ones in
tests/contract/test_property_contract.py."""
from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import NoReturn

from hypothesis import event, given

from testrig.mutations import (
    SPARKS,
    check_refusal,
    ci_settings,
    mutated_inventory,
    mutated_profile,
    render_json,
    run_cli,
    write_yaml,
)


def _dialect_accepts(argv: list[str], version: str) -> None:
    from sparkctl.sglang.dialect import load_dialect
    parser = load_dialect(version).argparser()

    def fail(message: str) -> NoReturn:
        raise AssertionError(f"{version} parser: {message}: {argv}")
    parser.error = fail  # type: ignore[method-assign]  # the dialect's parser fails the test instead of exiting
    parser.parse_args(argv[3:])


def _check(code: int, out: str, err: str, path: Path, keys: list[str]) -> None:
    event(f"exit {code}")
    assert code in (0, 2), f"exit {code} for mutated {keys}:\n{err}"
    if code == 2:
        named = check_refusal(err, path)
        head = err.splitlines()[0]
        if named == str(path) and not re.match(r"^sparkctl: [^:]+:\d+:\d+: ", head):
            # a key error in the mutated file names a key of a section that was mutated
            sections = {k.split(".")[0] for k in keys}
            assert any(f": {s}" in head for s in sections) or "extends" in head, f"{keys}: {head}"
        return
    doc = render_json(out)
    assert doc["ranks"], out
    for rank in doc["ranks"]:
        _dialect_accepts(rank["argv"], doc["sglang_version"])
        for value in rank["env"].values():
            assert isinstance(value, str) and "\n" not in value and "\0" not in value


@ci_settings(max_examples=250)
@given(mutated_profile())
def test_mutated_profiles_render_or_exit_2_naming_file_and_key(case):
    doc, key = case
    with tempfile.TemporaryDirectory() as tmp:
        path = write_yaml(Path(tmp) / "mutant.yml", doc)
        code, out, err = run_cli("render", "--profile", str(path), "--inventory", str(SPARKS), "--json")
        _check(code, out, err, path, key)


@ci_settings(max_examples=200)
@given(mutated_inventory())
def test_mutated_inventories_render_or_exit_2_naming_file_and_key(case):
    doc, key = case
    with tempfile.TemporaryDirectory() as tmp:
        path = write_yaml(Path(tmp) / "inventory.yml", doc)
        code, out, err = run_cli("render", "--profile", "d5", "--inventory", str(path), "--json")
        assert code in (0, 2), f"exit {code} for mutated {key}:\n{err}"
        event(f"exit {code}")
        if code == 2:
            named = check_refusal(err, path)
            assert named == str(path), err
        else:
            for rank in render_json(out)["ranks"]:
                _dialect_accepts(rank["argv"], "0.5.23")
