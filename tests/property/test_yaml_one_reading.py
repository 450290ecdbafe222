"""One YAML reading everywhere sparkctl reads a value a user wrote: the same scalar text is the same value whether
it sits in a profile file, in an inventory file or after `tune --vary KEY=`.

Before, `--vary x=yes,010` gave True and 8 (PyYAML's YAML 1.1) while the same text in a profile gave "yes" and 10
(the core-schema loader). Every entry point now goes through sparkctl.config.loader (`read_yaml` for files,
`read_value` for --vary), and what sparkctl writes back (`dump_yaml`: tune's winner profile) reads back the same.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from sparkctl.config.loader import dump_yaml, load_yaml, read_value, read_yaml
from sparkctl.errors import ConfigError
from sparkctl.tune.space import parse_vary
from testrig.mutations import ci_settings

# What YAML 1.1 and 1.2 read differently, and their neighbours: sexagesimal, octal, hex, booleans, dates, nulls.
TRICKY = ["yes", "no", "on", "off", "y", "n", "True", "FALSE", "010", "0o17", "0x1F", "0b101", "12:30", "1_000",
          "2024-01-01", "null", "Null", "~", "1e3", "1.5e-3", ".inf", "-.INF", ".nan", "+1", "-0", "0.88", "08",
          "flashinfer", "[1]", "[a, b]", "'010'", '"yes"', "!!str 010", "a b", "x #c", "@x", "%x", "`x", "&a 1"]
ALPHABET = "0123456789abcdefilnorstuxyABEFLNORSTUY.+-_:~!'\"[]{}#&*@ "


def _scalar_texts() -> st.SearchStrategy[str]:
    pieces = st.one_of(st.sampled_from(TRICKY), st.text(alphabet=ALPHABET, min_size=1, max_size=12))
    return st.lists(pieces, min_size=1, max_size=2).map("".join).map(str.strip).filter(
        lambda t: bool(t) and "," not in t)        # --vary splits on commas and strips each value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _from_file(tmp: Path, text: str, head: str) -> Any:
    """What the loader makes of `text` as the value of the innermost key of `head` (a YAML nesting)."""
    path = tmp / "doc.yml"
    path.write_text(head + text + "\n")
    return read_yaml(path)


@ci_settings(max_examples=300)
@given(text=_scalar_texts())
def test_a_value_reads_the_same_in_a_profile_in_an_inventory_and_after_vary(tmp_path_factory, text):
    tmp = tmp_path_factory.mktemp("yaml")
    try:
        profile = _from_file(tmp, text, "server:\n  x: ")["server"]["x"]
        inventory = _from_file(tmp, text, "all:\n  vars:\n    sparkctl_x: ")["all"]["vars"]["sparkctl_x"]
    except ConfigError:
        assume(False)                 # the file is refused as a whole: no value to compare
        return
    assume(not isinstance(profile, dict))   # "a: b" is a nested mapping in a file, not one value
    [(_, [vary])] = parse_vary([f"server.x={text}"])
    assert _same(profile, inventory) and _same(profile, vary), (text, profile, inventory, vary)


@ci_settings(max_examples=200)
@given(text=_scalar_texts())
def test_an_env_value_reads_the_same_in_a_profile_and_after_vary(tmp_path_factory, text):
    tmp = tmp_path_factory.mktemp("yaml")
    try:
        profile = _from_file(tmp, text, "env:\n  X: ")["env"]["X"]
    except ConfigError:
        assume(False)
        return
    assume(not isinstance(profile, dict))
    [(_, [vary])] = parse_vary([f"env.X={text}"])
    assert _same(profile, vary), (text, profile, vary)


@ci_settings(max_examples=200)
@given(value=st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(alphabet=ALPHABET, max_size=10),
              st.sampled_from(TRICKY), st.floats(allow_nan=False)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(alphabet="abcxyz_", min_size=1, max_size=5), inner, max_size=3)),
    max_leaves=8))
def test_what_sparkctl_writes_reads_back_as_written(value):
    doc = {"server": value}
    assert load_yaml(dump_yaml(doc), "dumped") == doc


def test_the_issue_example():
    """`tune --vary x=yes,010` and the same text in a profile: "yes" and 10 both ways."""
    assert parse_vary(["server.x=yes,010"]) == [("server.x", ["yes", 10])]
    assert load_yaml("server:\n  x: yes\n  y: 010\n", "profile") == {"server": {"x": "yes", "y": 10}}
    assert read_value("010", "env.X") == "010" and read_value("0x1F", "server.x") == 31


def test_no_other_yaml_reading_in_sparkctl():
    """Every `yaml.safe_load`/`yaml.load` in sparkctl/ is one of the engine's own readings (the emulator reads
    SGLang's --config as SGLang does; the log pipe reads the secrets file render wrote for the engine); anything
    sparkctl reads from a user goes through sparkctl/config/loader.py."""
    root = Path(__file__).resolve().parents[2] / "sparkctl"
    engine_side = {"sim/config.py", "sim/config_file.py", "nodes/logpipe.py"}
    found = {str(p.relative_to(root)) for p in root.rglob("*.py")
             if any(call in p.read_text() for call in ("yaml.safe_load(", "yaml.load(", "yaml.full_load("))}
    assert found <= engine_side, sorted(found - engine_side)
