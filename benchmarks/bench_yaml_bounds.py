"""Benchmark (not a test): what a hostile profile costs sparkctl to refuse (issue 16, bounded parsing).

Each case runs `sparkctl render` in a fresh process (the CLI as a user runs it) and prints its exit code,
wall time and peak RSS (the child's ru_maxrss from wait4):
  - a ~1 kB YAML alias bomb (14 levels of 14 aliases: 14^14 = 1.1e16 leaves once expanded),
  - a document nested 10,000 levels deep ([[[[...),
  - an `extends:` chain of 1,200 files,
  - a 2 MB document,
  - the shipped d5 profile (the baseline: what any render costs),
then the loader alone on the bomb, in-process (time and tracemalloc peak).
Run:  .venv/bin/python benchmarks/bench_yaml_bounds.py [--repeat 3] [--smoke]
--smoke: one run per case (CI's smoke run: the code path, not the figures).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INVENTORY = REPO / "inventory" / "sparks.example.yml"


def alias_bomb(levels: int = 14) -> str:
    """`levels` anchors, each a list of `levels` aliases of the one before: levels^levels leaves expanded."""
    names = [f"l{i}" for i in range(levels)]
    lines = [f"{names[0]}: &{names[0]} [" + ",".join(['"lol"'] * levels) + "]"]
    for i in range(1, levels):
        lines.append(f"{names[i]}: &{names[i]} [" + ",".join([f"*{names[i - 1]}"] * levels) + "]")
    return "extends: d5\nx:\n" + "".join(f"  {line}\n" for line in lines)


def cases(tmp: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    out: list[tuple[str, list[str], dict[str, str]]] = []
    bomb = tmp / "bomb.yml"
    bomb.write_text(alias_bomb())
    out.append((f"alias bomb ({bomb.stat().st_size} bytes)", ["--profile", str(bomb)], {}))
    deep = tmp / "deep.yml"
    deep.write_text("extends: d5\nx: " + "[" * 10_000 + "]" * 10_000 + "\n")
    out.append((f"nesting 10,000 deep ({deep.stat().st_size} bytes)", ["--profile", str(deep)], {}))
    chain = tmp / "chain"
    chain.mkdir()
    (chain / "c0.yml").write_text("extends: d5\n")
    for i in range(1, 1200):
        (chain / f"c{i}.yml").write_text(f"extends: c{i - 1}\n")
    out.append(("extends chain of 1,200 files", ["--profile", "c1199"], {"SPARKCTL_PROFILES_DIR": str(chain)}))
    big = tmp / "big.yml"
    big.write_text("extends: d5\ndescription: x\n" + "# padding\n" * 210_000)
    out.append((f"document of {big.stat().st_size / 1e6:.1f} MB", ["--profile", str(big)], {}))
    out.append(("baseline: profiles/d5.yml", ["--profile", "d5"], {}))
    return out


def run_measured(args: list[str], env: dict[str, str]) -> tuple[int, float, float, str]:
    """Exit code, wall seconds, peak RSS in MB of the child, first stderr line."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "sparkctl.cli.main", "render", "--inventory", str(INVENTORY),
                             *args], cwd=REPO, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    err = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    return code, wall, usage.ru_maxrss / 1024, (err.splitlines() or [""])[0][:110]


def in_process(tmp: Path) -> str:
    """The loader alone (no interpreter start-up): time and peak Python allocation to refuse the bomb."""
    import tracemalloc
    sys.path.insert(0, str(REPO))
    from sparkctl.config.loader import read_yaml
    from sparkctl.errors import ConfigError
    path = tmp / "bomb-inproc.yml"
    path.write_text(alias_bomb())
    tracemalloc.start()
    start = time.perf_counter()
    try:
        read_yaml(path)
        refused = False
    except ConfigError:
        refused = True
    wall = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return (f"in-process read_yaml of the {path.stat().st_size}-byte bomb: {'refused' if refused else 'ACCEPTED'} "
            f"in {wall * 1000:.1f} ms, peak Python allocation {peak / 1e6:.2f} MB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (the best is printed)")
    parser.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    opts = parser.parse_args()
    if opts.smoke:
        opts.repeat = 1
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'case':<38} {'exit':>4} {'wall s':>7} {'peak MB':>8}  message")
        for name, args, env in cases(Path(tmp)):
            results = [run_measured(args, env) for _ in range(opts.repeat)]
            code, wall, rss, msg = min(results, key=lambda r: r[1])
            print(f"{name:<38} {code:>4} {wall:>7.2f} {max(r[2] for r in results):>8.1f}  {msg}")
        print(in_process(Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
