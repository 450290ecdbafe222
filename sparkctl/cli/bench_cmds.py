"""`sparkctl bench`: the measurement card from one command (library: sparkctl.bench.run)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import typer

from sparkctl.cli import bounds
from sparkctl.cli.options import PlainFlagsGroup, flag
from sparkctl.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

    from sparkctl.deploy.progress import Reporter
    from sparkctl.state.runs import RunRecord

INVENTORY_OPT = typer.Option(None, "--inventory", "-i", help="Ansible inventory file (default: see README).")


def _url(value: str | None, option: str) -> str | None:
    """An http(s) base URL with a host, else ConfigError (exit 2) before anything is sent."""
    from urllib.parse import urlsplit


    if value is None:
        return None
    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        _ = parts.port                   # ValueError for a port that is not a number
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(f"{value!r} is not a URL", where=option,
                          hint=f"give the server's base URL with http:// or https://, e.g. {option} "
                               f"http://spark-a:30000")
    return value


def _int_list(text: str, option: str) -> tuple[int, ...]:
    """``"4k,16k,64k"`` -> (4096, 16384, 65536); ``"1,2"`` -> (1, 2)."""

    out = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        mult = 1024 if part.endswith("k") else 1
        try:
            value = int(float(part.rstrip("k")) * mult)
        except (ValueError, OverflowError):   # "x", "nan", "inf", "1e400"
            raise ConfigError(f"not a number: {part!r}", where=option,
                              hint="a comma-separated list, e.g. 4k,16k") from None
        if not 0 < value <= 1 << 24:
            raise ConfigError(f"out of range: {part!r}", where=option, hint="each value from 1 to 16384k")
        out.append(value)
    return tuple(out)


class _Levels(TypedDict, total=False):
    concurrency: tuple[int, ...]
    router_concurrency: tuple[int, ...]


def _levels(text: str | None) -> _Levels:
    """``--concurrency`` given: the levels everywhere (a single pair and through a router); else the defaults."""
    if text is None:
        return {}
    levels = _int_list(text, "--concurrency")
    return {"concurrency": levels, "router_concurrency": levels}


def _api_key(env_name: str | None, endpoint: str | None, compare_endpoint: str | None) -> str | None:
    """The key for --endpoint/--compare-endpoint: only from the variable the user named, never a default one."""

    if env_name is None:
        return None
    if not (endpoint or compare_endpoint):
        raise ConfigError("--api-key-env names a key for --endpoint/--compare-endpoint, and neither is given",
                          where="--api-key-env", hint="a deployment's key comes from its profile's api.api_key_env")
    key = os.environ.get(env_name)
    if not key:
        raise ConfigError(f"the environment variable {env_name} is not set or empty", where="--api-key-env",
                          hint=f"export {env_name}=... (the key is sent only to the endpoints given by URL)")
    return key


# The bench's timeouts (sglang.bounds.Limits of every request, and the run's deadline).
_CONNECT_TIMEOUT = typer.Option(10.0, "--connect-timeout", parser=bounds.seconds(), metavar="SECONDS",
                                help="Seconds to connect.")
_READ_TIMEOUT = typer.Option(120.0, "--read-timeout", parser=bounds.seconds(), metavar="SECONDS",
                             help="Longest silence (s) while any byte is awaited; covers a "
                             "non-streamed 800-token answer at 14.7 tok/s.")
_IDLE_TIMEOUT = typer.Option(120.0, "--idle-timeout", parser=bounds.seconds(), metavar="SECONDS",
                             help="Longest a stream may go without a data event (s).")
_REQUEST_DEADLINE = typer.Option(600.0, "--request-deadline", parser=bounds.seconds(), metavar="SECONDS",
                                 help="Deadline of one whole request (s).")
_RUN_DEADLINE = typer.Option(14400.0, "--run-deadline", parser=bounds.seconds(), metavar="SECONDS",
                             help="Deadline of every request of the run (s); --compare "
                             "deployments keep their own boot timeouts.")


def register(app: typer.Typer) -> None:

    bench_app = typer.Typer(cls=PlainFlagsGroup, invoke_without_command=True,
                            help="The measurement card; `bench history` and `bench diff A B` compare cards.")
    app.add_typer(bench_app, name="bench")
    _register_cards(bench_app)
    bench_app.callback()(bench)


def bench(ctx: typer.Context,
          profile: str | None = typer.Option(None, "--profile", "-p", help="Measure this profile: deployed "
                                                "first through the lifecycle unless it already runs."),
          compare: str | None = typer.Option(None, "--compare", help="Second arm: deploy this profile (e.g. "
                                                "dflash-off), measure it, then restore the original."),
          endpoint: str | None = typer.Option(None, "--endpoint", help="Measure this OpenAI-compatible SGLang "
                                                 "endpoint instead of the deployment (config from /server_info)."),
          compare_endpoint: str | None = typer.Option(None, "--compare-endpoint",
                                                         help="Second arm: another running endpoint."),
          log: Path | None = typer.Option(None, "--log", help="Scheduler log of the (first) arm: a file the "
                                             "engine writes, or a captured log (alone: log-only analysis)."),
          compare_log: Path | None = typer.Option(None, "--compare-log", help="Scheduler log of the second arm."),
          runs: int = typer.Option(5, "--runs", min=1, max=10_000,
                                   help="Measured runs per prompt class (medians)."),
          max_tokens: int = typer.Option(800, "--max-tokens", min=2, max=1 << 20,
                                         help="max_tokens per decode request."),
          warmup: int = typer.Option(2, "--warmup", min=0, max=1000,
                                     help="Warm-up requests after the first (cold) one."),
          gates: str | None = typer.Option(None, "--gates", help="Comma list of cold,decode,acceptance,ttft,"
                                              "concurrency,g6 (default: all)."),
          ttft_sizes: str = typer.Option("4k,16k,64k", "--ttft-sizes", help="Prompt sizes in tokens for TTFT."),
          ttft_runs: int = typer.Option(3, "--ttft-runs", min=1, max=1000,
                                        help="Runs per TTFT size, each with its own unique prefix "
                                        "(median (min-max); one delayed run cannot set it)."),
          concurrency: str | None = typer.Option(None, "--concurrency", help="Concurrency levels (default "
                                                    "1,2; 1,2,4,8 through the router of a replicated deployment)."),
          g6_max_tokens: int | None = typer.Option(None, "--g6-max-tokens", min=1, max=1 << 20,
                                                      help="max_tokens per G6 prompt (default: --max-tokens)."),
          reference: Path | None = typer.Option(None, "--reference", help="Text file: one published reference "
                                                   "number per line (source, stack) for the card's slot."),
          api_key_env: str | None = typer.Option(None, "--api-key-env", help="Env var holding the API key "
                                                    "to send to --endpoint/--compare-endpoint (never stored); "
                                                    "without it no key is sent to them."),
          connect_timeout: float = _CONNECT_TIMEOUT,
          read_timeout: float = _READ_TIMEOUT,
          idle_timeout: float = _IDLE_TIMEOUT,
          request_deadline: float = _REQUEST_DEADLINE,
          run_deadline: float = _RUN_DEADLINE,
          log_only: bool = flag("--log-only", help="Analyse --log alone; send no request."),
          out: Path | None = typer.Option(None, "--out", help="Directory for report.md/report.json/"
                                             "decode.svg, written as given (default: the run's record in the "
                                             "ledger); a card already there is refused unless --force."),
          force: bool = flag("--force", help="Replace report.md/report.json/decode.svg already in --out."),
          inventory: str | None = INVENTORY_OPT,
          as_json: bool = flag("--json", help="The full result JSON on stdout (`sparkctl schema bench`).")) -> None:
    """The measurement card: cold start, decode ON/OFF, acceptance, TTFT, concurrency, G6 (not idempotent:
    it loads the server; --compare redeploys twice). `bench history` / `bench diff A B`: the cards so far."""
    if ctx.invoked_subcommand is not None:
        return
    from sparkctl.bench import run as bench_run
    from sparkctl.config.inventory import resolve_inventory
    from sparkctl.config.profile import load_profile
    from sparkctl.deploy.progress import Reporter
    from sparkctl.sglang.bounds import Limits

    endpoint = _url(endpoint, "--endpoint")
    compare_endpoint = _url(compare_endpoint, "--compare-endpoint")
    limits = Limits(connect_s=connect_timeout,
                    read_s=read_timeout,
                    idle_s=idle_timeout,
                    request_s=request_deadline)
    api_key = _api_key(api_key_env, endpoint, compare_endpoint)
    opts = bench_run.BenchOptions(
        gates=bench_run.parse_gates(gates), runs=runs, max_tokens=max_tokens, warmup=warmup,
        ttft_sizes=_int_list(ttft_sizes, "--ttft-sizes"), ttft_runs=ttft_runs, **_levels(concurrency),
        g6_max_tokens=g6_max_tokens, out_dir=out, overwrite=force, reference=_reference_lines(reference))
    reporter = Reporter()
    progress = _bench_progress(reporter)
    result = bench_run.bench(resolve_inventory(inventory), opts, reporter=reporter,
                             profile=load_profile(profile) if profile else None,
                             compare=load_profile(compare) if compare else None,
                             endpoint=endpoint, compare_endpoint=compare_endpoint, log=log, compare_log=compare_log,
                             log_only=log_only, api_key=api_key, progress=progress, limits=limits,
                             run_s=run_deadline)
    _show_card(result, as_json)


def _reference_lines(reference: Path | None) -> list[str]:
    """--reference's file: one published reference number per line, blank lines dropped."""
    if not reference:
        return []
    return [ln.strip() for ln in reference.read_text(encoding="utf-8").splitlines() if ln.strip()]


def _bench_progress(reporter: Reporter) -> Callable[[str], None]:
    """The bench's progress lines as events of the reporter's "bench" stage."""
    reporter.stage("bench")

    def progress(message: str) -> None:
        reporter.stage_name = "bench"     # the lifecycle's stages (--compare) rename it meanwhile
        reporter.event(message)
    return progress


def _show_card(result: RunRecord, as_json: bool) -> None:
    """The card on stdout (markdown, or the run record as JSON: `sparkctl schema bench`), and where its files are
    on stderr."""
    files = result.files
    if as_json:
        from sparkctl.cli.outputs import print_json
        print_json(result.as_json())
    else:
        sys.stdout.write(Path(files["markdown"]).read_text(encoding="utf-8"))
    print(f"sparkctl: card {files.get('markdown')}, data {files.get('json')}"
          + ("  [EMULATED]" if result.emulated else ""), file=sys.stderr)

def _register_cards(bench_app: typer.Typer) -> None:
    bench_app.command("history")(history)
    bench_app.command("diff")(diff)


def history(profile: str | None = typer.Option(None, "--profile", "-p", help="Only cards with an arm of "
                                                  "this profile."),
            chart: Path | None = typer.Option(None, "--chart", help="SVG chart file to write, as given "
                                                 "(default: history.svg in the cluster's state directory); an "
                                                 "existing file is refused unless --force."),
            force: bool = flag("--force", help="Replace the --chart file if it exists."),
            inventory: str | None = INVENTORY_OPT,
            as_json: bool = flag("--json", help="The rows as JSON on stdout.")) -> None:
    """Every card of this cluster in time order: decode ON/OFF per class and what changed (changes nothing on
    the cluster; writes the SVG chart)."""
    from sparkctl.bench.history import history as build
    from sparkctl.bench.history import render_history
    from sparkctl.cli.outputs import HistoryOutput, emit
    from sparkctl.config.inventory import resolve_inventory
    from sparkctl.state.cards import CardIndex
    from sparkctl.state.ledger import Ledger

    ledger = Ledger.for_cluster(resolve_inventory(inventory).cluster.name)
    index = CardIndex(ledger)
    import re
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", profile) if profile else None     # a file name, never a path
    if chart is not None:
        from sparkctl.userfiles import check_user_target
        check_user_target(chart, overwrite=force, option="--chart")    # refused before anything is read
    target = chart or (ledger.root / (f"history-{safe}.svg" if safe else "history.svg"))
    h = build(index, profile=profile, chart=target if ledger.root.exists() or chart else None,
              user_chart=chart is not None, overwrite=force)
    if as_json:
        emit(HistoryOutput, h)
    else:
        sys.stdout.write(render_history(h))


def diff(a: str = typer.Argument(..., help="Run id (or unique prefix, or report.json path) of card A."),
         b: str = typer.Argument(..., help="Card B, compared against A."),
         inventory: str | None = INVENTORY_OPT,
         as_json: bool = flag("--json", help="The diff as JSON on stdout.")) -> None:
    """Per metric the delta of B against A, the noise band and a verdict; what changed (read-only)."""
    from sparkctl.bench.diff import diff_cards, render_diff
    from sparkctl.cli.outputs import DiffOutput, emit
    from sparkctl.config.inventory import resolve_inventory
    from sparkctl.state.cards import CardIndex
    from sparkctl.state.ledger import Ledger

    d = diff_cards(CardIndex(Ledger.for_cluster(resolve_inventory(inventory).cluster.name)), a, b)
    if as_json:
        emit(DiffOutput, d)
    else:
        sys.stdout.write(render_diff(d))
