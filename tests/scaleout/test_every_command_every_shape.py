"""Every command that takes a profile takes every shape of profile (one group of two, one group of four, replicas
of one rank and of two behind the router): it works, or refuses with a clear message of its own (exit 2), naming
no Python internals (a module path, a function, a traceback) -- generated over commands x shapes on a four-node
embedded cluster (the emulator; read-only commands and `up --dry-run`: nothing is started)."""
from __future__ import annotations

import re

import pytest

from testrig.embedded import write_embedded_inventory

SHAPES = {"tp2 on two of four": None, "tp4": "server:\n  tp_size: 4\n",
          "4 replicas of tp1": "replicas: 4\nserver:\n  tp_size: 1\n",
          "2 replicas of tp2": "replicas: 2\nserver:\n  tp_size: 2\n"}
COMMANDS = {
    "render": ["render"], "render --json": ["render", "--json"], "render --rank 1": ["render", "--rank", "1"],
    "preflight": ["preflight"], "preflight --json": ["preflight", "--json"],
    "up --dry-run": ["up", "--dry-run", "--yes"], "image plan": ["image", "plan"],
    "image plan --json": ["image", "plan", "--json"],
    "tune": ["tune", "--vary", "server.max_running_requests=2", "--runs", "1"],
}
NOT_RUN = {("tune", "tp4")}             # a real tune (it deploys): tests/tune covers one group
# what may refuse, and must say why in the user's terms
REFUSES = {("tune", "4 replicas of tp1"): "replicas", ("tune", "2 replicas of tp2"): "replicas",
           ("tune", "tp2 on two of four"): "node", ("render", "tp2 on two of four"): "node",
           ("render --json", "tp2 on two of four"): "node", ("render --rank 1", "tp2 on two of four"): "node",
           ("preflight", "tp2 on two of four"): "node", ("preflight --json", "tp2 on two of four"): "node",
           ("up --dry-run", "tp2 on two of four"): "node", ("image plan", "tp2 on two of four"): "node",
           ("image plan --json", "tp2 on two of four"): "node",
           **{(c, s): "not available for a profile with replicas" for c in ("render --json", "render --rank 1")
              for s in ("4 replicas of tp1", "2 replicas of tp2")}}
INTERNALS = re.compile(r"sparkctl\.[a-z_]+\.[a-z_]+|Traceback|internal error|\.py\b|\bdef\b|[a-z_]+\(\)")
CASES = [(c, s) for c in COMMANDS for s in SHAPES if (c, s) not in NOT_RUN]


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    inv = write_embedded_inventory(root / "inventory.yml", {"boot_s": 0.3}, nodes=4)
    profiles = root / "profiles"
    profiles.mkdir()
    for i, extra in enumerate(SHAPES.values()):
        (profiles / f"shape{i}.yml").write_text("extends: d5\n" + (extra or ""))
    return inv, profiles, root / "state"


@pytest.mark.parametrize("command,shape", CASES, ids=[f"{c}-{s}" for c, s in CASES])
def test_every_command_takes_every_shape(cli, monkeypatch, four, command, shape):
    inv, profiles, state = four
    monkeypatch.setenv("SPARKCTL_INVENTORY", str(inv))
    monkeypatch.setenv("SPARKCTL_PROFILES_DIR", str(profiles))
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(state))
    name = f"shape{list(SHAPES).index(shape)}"
    args = COMMANDS[command]
    code, out, err = cli(*args[:1], *([args[1]] if args[0] == "image" else []), "--profile", name,
                         *args[2 if args[0] == "image" else 1:])
    assert code in (0, 2), f"{command} {shape}: exit {code}\n{err[-3000:]}"
    assert not INTERNALS.search(err.replace(str(inv), "INV").replace(str(profiles), "PROF")), err[-3000:]
    if code == 2:
        want = REFUSES.get((command, shape), "never")
        assert want is not None and want != "never" and want in err, f"{command} {shape} refused:\n{err[-3000:]}"
    else:
        assert (command, shape) not in REFUSES or REFUSES[(command, shape)] is None, (command, shape, out[-500:])
        assert out.strip() or "preflight" in command, err[-2000:]
