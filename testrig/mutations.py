"""Hypothesis strategies: valid profiles and inventories, mutated the way a hostile or careless user would.

The mutation points are taken from the models themselves (every field of Profile and of Node/ClusterSettings, walked
from their pydantic schema), not from a list someone thought of; the values are the classes issue 16 names:
types swapped, numbers at and past their limits, paths with `..`, leading dashes, unicode and control
characters, booleans, YAML 1.1 look-alikes.

Each strategy yields (document, mutated key path); `run_render` writes it and runs `sparkctl render` in-process.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import re
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[1]
SPARKS = REPO / "inventory" / "sparks.example.yml"

# Deterministic for CI (no example database, derandomized), bounded, never a deadline on a loaded machine.
CI_SETTINGS: dict[str, Any] = dict(derandomize=True, database=None, deadline=None, print_blob=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def ci_settings(max_examples: int) -> settings:
    return settings(max_examples=max_examples, **CI_SETTINGS)


def _leaf_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path a user can write in this model (sub-models walked; a sub-model itself is a path too)."""
    import typing
    out = []
    for name, info in model.model_fields.items():
        path = prefix + (name,)
        out.append(path)
        for arg in (info.annotation, *typing.get_args(info.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out += _leaf_paths(arg, path)
    return out


def profile_paths() -> list[tuple[str, ...]]:
    from sparkctl.config.profile import Profile
    return [p for p in _leaf_paths(Profile) if p[0] not in ("name", "path", "extends")]


def node_paths() -> list[tuple[str, ...]]:
    from sparkctl.config.inventory import Node
    ansible = {"host": "ansible_host", "port": "ansible_port", "user": "ansible_user",
               "key_file": "ansible_ssh_private_key_file", "connection": "ansible_connection"}
    out: list[tuple[str, ...]] = []
    for p in _leaf_paths(Node):
        if p[0] == "name" or p == ("ssh",):
            continue
        if p[0] == "ssh":
            out.append((ansible[p[1]],))
        elif p[0] == "rank":
            out.append(("sparkctl_rank",))
        else:
            out.append(p)
    return out


def cluster_paths() -> list[tuple[str, ...]]:
    from sparkctl.config.inventory import ClusterSettings
    return [(f"sparkctl_{'cluster' if p[0] == 'name' else p[0]}",) for p in _leaf_paths(ClusterSettings)]


HOSTILE_TEXT = ["", " ", "..", "../etc", "/models/../etc", "/models/./x", "/models//x", "/models/x/", "models/x",
                "-oProxyCommand=id", "--api-key=x", "-", "/models/-x", "/models/x\ny", "a\nb: c", "x\x00y",
                "\x1b[31mred", "\u2028", "é", "ñ/models", "/models/" + "a" * 300, "true", "yes", "010", "0x1F",
                "12:30", "~", "null", "1e3", "nan", "inf", "eth0\n    evil0:", "en/p1", "a:b", "enp1s0f0np0abcdef",
                "Upper/Case:1", "lmsysorg/sglang:v0.5.23", "a@sha256:" + "0" * 64, "/models/GLM-5.3-Flash-NVFP4",
                "DFLASH", "EAGLE", "NEXTN", "bf16", "fp8_e4m3", "0.5.11", "0.5.3.post3", "flashinfer", "triton"]
EDGE_INTS = [0, 1, -1, 2, 8, 16, 64, 65, 1023, 1024, 65535, 65536, 2**31 - 1, 2**31, 2**63, -(2**63), 10**30]
EDGE_FLOATS = [0.0, -0.0, 0.5, 0.88, 1.0, 1.5, 1e-300, 1e308, float("inf"), float("-inf"), float("nan")]

_text = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=24)
scalars = st.one_of(
    st.booleans(), st.none(),
    st.sampled_from(EDGE_INTS), st.integers(min_value=-(2**40), max_value=2**40),
    st.sampled_from(EDGE_FLOATS), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(HOSTILE_TEXT), _text,
)
values = st.one_of(scalars, st.lists(scalars, max_size=3),
                   st.dictionaries(st.sampled_from(["x", "path", "1", "LD_PRELOAD"]), scalars, max_size=2))


def _set(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    cur = doc
    for part in path[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[part] = nxt
        cur = nxt
    cur[path[-1]] = value


VALID_TEXT = ["/models/GLM-5.3-Flash-NVFP4", "/models/other", "glm", "flashinfer", "triton", "tilelang", "bf16",
              "fp8_e4m3", "auto", "DFLASH", "NEXTN", "EAGLE", "linux/arm64", "lmsysorg/sglang:v0.5.23", "0.5.23",
              "INFO", "enp1s0f0np0", "eth0", "/home/spark/models", "spark-a.local", "spark"]


def _near(value: Any) -> st.SearchStrategy[Any]:
    """A plausible value of the same type: most of these render, so the accepted path is exercised too."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(max(1, value - 3), value + 3) | st.sampled_from([value * 2, max(1, value // 2)])
    if isinstance(value, float):
        return st.floats(0.05, 0.95)
    if isinstance(value, str):
        return st.sampled_from([value] + VALID_TEXT)
    return st.integers(1, 4096) | st.sampled_from(VALID_TEXT) | st.floats(0.05, 0.95)


def _swapped(value: Any) -> st.SearchStrategy[Any]:
    """The same value in another type: "8" for 8, [8], {"v": 8}, true for 1."""
    return st.sampled_from([str(value), [value], {"v": value}, value is not None, None])


ALL_KINDS = ("value", "value", "near", "near", "near", "swap", "env", "extra", "unknown")


@st.composite
def mutated_profile(draw: Any, kinds: tuple[str, ...] = ALL_KINDS) -> tuple[dict[str, Any], list[str]]:
    """A profile extending d5 (or base, or dflash-off) with one to three of its keys mutated (`kinds`: "near"
    alone gives mostly plausible documents, for the real parser's sample)."""
    from sparkctl.config.profile import load_profile
    parent = draw(st.sampled_from(["d5", "base", "dflash-off"]))
    doc: dict[str, Any] = {"extends": parent}
    loaded = load_profile(parent).model_dump()
    paths = profile_paths()
    mutated: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(kinds))
        path = draw(st.sampled_from(paths))
        if kind == "env":
            path = ("env", draw(st.one_of(st.sampled_from(["PYTHONPATH", "LD_PRELOAD", "PATH", "SGLANG_HOST_IP",
                                                           "HF_TOKEN_PATH", "NCCL_DEBUG", "GLOO_SOCKET_IFNAME",
                                                           "A B", "1X", "X\nY", "OK_NAME"]), _text)))
            value = draw(values)
        elif kind == "extra":
            path = ("server", "extra_args")
            value = draw(extra_args())
        elif kind == "unknown":
            path = path[:-1] + (draw(st.sampled_from(["mem_fraction_statc", "prot", "x", "Path"])),)
            value = draw(values)
        elif kind in ("swap", "near"):
            current: Any = loaded
            for part in path:
                current = current.get(part) if isinstance(current, dict) else None
            value = draw(_swapped(current) if kind == "swap" else _near(current))
        else:
            value = draw(values)
        _set(doc, path, value)
        mutated.append(".".join(map(str, path)))
    return doc, mutated


@st.composite
def extra_args(draw: Any) -> list[Any]:
    """Token lists built from the dialect's own flags (so some are accepted) and hostile tokens."""
    from sparkctl.sglang.dialect import load_dialect
    options = sorted(o for f in load_dialect("0.5.23").flags for o in f.options if o.startswith("--"))
    token = st.one_of(st.sampled_from(options), st.sampled_from(["--admin-api-key", "--api-key", "--port",
                                                                 "--max-totl-tokens", "--enable-cache-report"]),
                      st.sampled_from(HOSTILE_TEXT), st.integers(-5, 10**6).map(str), scalars)
    return draw(st.lists(token, max_size=5))


@st.composite
def mutated_inventory(draw: Any) -> tuple[dict[str, Any], list[str]]:
    """sparks.example.yml with one to three host or cluster variables mutated."""
    doc = yaml.safe_load(SPARKS.read_text())
    mutated: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        host = draw(st.sampled_from(["spark-a", "spark-b", None]))
        value = draw(values | st.sampled_from(VALID_TEXT) | st.integers(1, 65535))
        if host is None:
            path = ("all", "vars") + draw(st.sampled_from(cluster_paths()))
        else:
            path = ("all", "children", "sparks", "hosts", host) + draw(st.sampled_from(node_paths()))
        _set(doc, path, value)
        mutated.append(".".join(path))
    return doc, mutated


def write_yaml(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def run_cli(*args: str) -> tuple[int, str, str]:
    """`sparkctl ARGS` in-process: (exit code, stdout, stderr)."""
    from sparkctl.cli.main import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


_HEAD = re.compile(r"^sparkctl: (?P<file>/[^:]*?)(?::\d+:\d+)?: (?P<rest>.*)$")


def check_refusal(err: str, own_file: Path) -> str:
    """An exit-2 message: one head line naming a file (ours or a profile it extends) and a key, then a fix.
    Returns the file named."""
    assert "Traceback" not in err and "internal error" not in err, err
    head = err.splitlines()[0]
    m = _HEAD.match(head)
    assert m, f"no file named: {head!r}"
    assert m.group("file") == str(own_file) or m.group("file").startswith(str(REPO / "profiles")), head
    assert m.group("rest").strip(), head
    assert "\n  fix: " in err, err
    return m.group("file")


def render_json(out: str) -> dict[str, Any]:
    return json.loads(out)


def deep_copy(doc: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(doc)
