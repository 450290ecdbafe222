"""How a bench run holds together and how it fails: the state its arms share (bounds, the guard that stops every
client at once, the secrets kept out of its files, what it is doing now), the error the CLI reports when the
endpoint broke a bound or the protocol or a rank died (``BenchError``, exit 4), the list of measurements that
failed, and the last sweep that masks the run's secret values in everything written.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sparkctl.bench.target import Arm
from sparkctl.errors import BenchError, SparkctlError
from sparkctl.redaction import redact
from sparkctl.sglang.client import EndpointBoundError, EndpointProtocolError, Limits, RunGuard, SGLangAPIError
from sparkctl.state.runs import AcceptanceResult, ConcurrencyResult, GateFailure, RunRecord, TTFTResult
from sparkctl.untrusted import mask_url_credentials

if TYPE_CHECKING:
    from sparkctl.bench.ranks import RankWatch, RankWatches

__all__ = ["RunState", "bench_error", "failures", "scrubbed"]

Progress = Callable[[str], None]


class RunState:
    """What one run shares: its bounds, its guard (deadline + stop), the secrets to keep out of its files, and what
    it is doing now (for a rank death's message)."""

    def __init__(self, limits: Limits, run_s: float | None, progress: Progress) -> None:
        self.limits = limits
        self.guard = RunGuard(run_s)
        self.secrets: set[str] = set()
        self.doing = ""
        self._progress = progress
        self.watch: RankWatch | RankWatches | None = None   # the watch of the arm being measured (a deployment's)

    def progress(self, message: str) -> None:
        self.doing = message
        self._progress(message)
        if self.watch is not None:
            self.watch.poll()                 # between two steps: the ranks still alive?

    def make_arm(self, make: Callable[[], Arm]) -> Arm:
        """Build an arm; a failure to reach it or a broken bound/protocol on the way is a BenchError (exit 4)."""
        try:
            arm = make()
        except SGLangAPIError as exc:
            raise bench_error(exc) from exc
        except SparkctlError as exc:
            if type(exc) is not SparkctlError:      # ConfigError, LockHeldError ... keep their own exit codes
                raise
            ctx = exc.__context__
            raise BenchError(exc.message, where=exc.where, hint=exc.hint,
                             evidence=getattr(ctx, "evidence", None) or exc.evidence) from exc
        if arm.api_key:
            self.secrets.add(arm.api_key)
        arm.bind(self.limits, self.guard)
        return arm

    def stop_if_tripped(self) -> None:
        if self.guard.error is not None:
            raise bench_error(self.guard.error)


_FLAG_OF_BOUND = {"connect timeout": "--connect-timeout", "read timeout": "--read-timeout",
                  "idle timeout": "--idle-timeout", "request deadline": "--request-deadline",
                  "run deadline": "--run-deadline"}


def bench_error(err: BaseException) -> BenchError:
    """The run's fatal error as the CLI reports it (exit 4): what the endpoint did, which bound, what to do."""
    if isinstance(err, BenchError):
        return err
    if isinstance(err, EndpointBoundError):
        flag = next((f for b, f in _FLAG_OF_BOUND.items() if err.bound.startswith(b)), None)
        hint = (f"if the server is only slow, raise {flag} (now {err.bound.split()[-2]} s); if it hangs, check it"
                if flag else "an SGLang server never sends that much; check the URL and what answers there")
        return BenchError(f"stopped at a bound ({err.bound}): {err.url} {err.message}", where="bench",
                          hint=hint, evidence=err.evidence)
    if isinstance(err, EndpointProtocolError):
        return BenchError(f"the endpoint broke the protocol: {err.url} {err.message}", where="bench",
                          hint=err.hint, evidence=err.evidence)
    if isinstance(err, SparkctlError):
        return BenchError(err.message, where=err.where or "bench", hint=err.hint, evidence=err.evidence)
    return BenchError(f"{type(err).__name__}: {err}", where="bench")


def failures(result: RunRecord) -> list[str]:
    """Every measurement of the run that failed (a failed gate, TTFT size, concurrent request or G6 capture)."""
    out = []
    for a in result.arms:
        name = a.config["name"]
        res = a.results
        for gate in ("cold", "warmup", "decode", "acceptance", "ttft", "concurrency"):
            v = getattr(res, gate)
            if isinstance(v, GateFailure) and v.error:
                out.append(f"{name} {gate}: {v.error.splitlines()[0]}")
        if isinstance(res.acceptance, AcceptanceResult) and res.acceptance.generate and res.acceptance.generate.error:
            out.append(f"{name} acceptance generate: {res.acceptance.generate.error.splitlines()[0]}")
        if isinstance(res.ttft, TTFTResult):
            out += [f"{name} ttft ~{e.target_tokens}: {e.note}" for e in res.ttft.sizes if e.status == "failed"]
        if isinstance(res.concurrency, ConcurrencyResult):
            out += [f"{name} concurrency c{lv.concurrency}: {err}" for lv in res.concurrency.levels
                    for err in lv.errors or []]
    for p in (result.g6 or {}).get("prompts") or []:
        for side in ("on_output", "off_output"):
            if (p.get(side) or {}).get("error"):
                out.append(f"G6 {p['prompt_id']} ({side[:-7]}): {p[side]['error']}")
    return out


def scrubbed(value: object, secrets: set[str]) -> Any:
    """Every string in the record with the run's secret values (the API keys it used) and every URL's credentials
    (``http://user:***@host``) masked: a server that echoes a request header back in what it answers cannot put a
    key in the card, nor an ``--endpoint http://user:password@host`` its password."""
    if isinstance(value, str):
        return mask_url_credentials(redact(value, secrets))
    if isinstance(value, dict):
        return {k: scrubbed(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [scrubbed(v, secrets) for v in value]
    return value
