"""Benchmark (not a test): the cost of reading `/metrics` through prometheus_client's parser
(sparkctl.sglang.serverinfo.parse_prometheus_samples) against the hand-written regex it replaced (kept here, and
only here, as the baseline), on the real SGLang 0.5.23 TP=2 capture; both must give the same samples.

Run:  .venv/bin/python benchmarks/bench_prometheus_parse.py [--runs 200] [--smoke]
--smoke: 5 runs (CI's smoke run: the code path, not the figures).
"""
from __future__ import annotations

import argparse
import functools
import re
import sys
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sparkctl.sglang.serverinfo import parse_prometheus_samples  # noqa: E402

CAPTURE = REPO / "tests/fixtures/real-engine/0.5.23/tp2/metrics.http"
_LINE = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\d+)?\s*$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def regex_baseline(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or not (m := _LINE.match(line)):
            continue
        try:
            out.append((m.group("name"), dict(_LABEL.findall(m.group("labels") or "")), float(m.group("value"))))
        except ValueError:
            continue
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--smoke", action="store_true", help="one short round of the same code path (CI's smoke run)")
    args = ap.parse_args()
    runs = 5 if args.smoke else args.runs
    text = CAPTURE.read_text().split("\n\n", 1)[-1]          # the body, after the HTTP headers
    lib = [(s.name, s.labels, s.value) for s in parse_prometheus_samples(text)]
    base = regex_baseline(text)
    print(f"{CAPTURE.relative_to(REPO)}: {len(text.splitlines())} lines, {len(lib)} samples; "
          f"same samples as the regex: {repr(lib) == repr(base)}")
    for name, fn in (("regex baseline", regex_baseline), ("prometheus_client", parse_prometheus_samples)):
        per = timeit.timeit(functools.partial(fn, text), number=runs) / runs
        print(f"{name:18s} {per * 1e3:7.2f} ms per parse (mean of {runs})")


if __name__ == "__main__":
    main()
