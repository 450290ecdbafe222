"""`sparkctl tune`: the envelope search the seed card's author did by hand, as one journaled transaction.

Order (each step journaled in ``runs/<tune id>/tune.json`` before the next begins):

1. **begin**: under the cluster lock, ``tune.json`` at the ledger root records the run and the deployment that
   ran before it (``original``) with this controller (pid + start time). A tune found there whose controller is
   dead is settled by the next ``sparkctl tune`` (``tune --resume RUN`` continues it; any other tune restores its
   original first). Trial deployments are the lifecycle's compare transaction (command ``bench-compare``,
   deploy/compare.py): its marker records the original before the first trial changes anything, a trial is
   never a rollback target (so ``sparkctl rollback`` also returns to what ran before), ``status`` exits 8 while
   it is unfinished, and the restore (command ``bench-restore``) clears it.
2. **trials**: the baseline (the profile as it is) first, then every grid candidate (``--trials N``: the first N
   of them). Each trial is a full ``up`` through the lifecycle (preflight, boot, warm-up, gates; rollback on
   failure) and a bench subset whose card lands in the ledger: decode medians (``--runs``, default n=5),
   acceptance, and a G6 sample (sparkctl/tune/g6.py: greedy outputs of 2 G6 prompts compared token for token
   with the baseline trial's; a candidate that differs is infeasible, ``G6 failed``). A candidate that does not
   boot, dies of OOM,
   resolves less capacity than ``expect``, or fails a gate or its bench is recorded **infeasible** with its
   reason, and the search goes on. After the first trial the time of the whole tune is estimated; a trial that
   would not fit the ``--budget`` (with the confirmation still to come) is not started (``skipped: budget``).
3. **confirm**: the best feasible candidate against the baseline, interleaved A B A B (``confirm_rounds``
   rounds, each a fresh deploy and bench of each), the samples of each side pooled; it is promoted only when it
   beats the baseline beyond the noise band (``sparkctl.bench.diff.compare_summaries``), else nothing is.
4. **promote**: the winner's profile (``extends:`` the original, only the changed keys, a comment naming the run).
5. **restore**: the original deployment (``deploy.door.restore``: an ``up`` of its recorded profile, command
   ``bench-restore``), or ``down`` when nothing ran before; ``tune.json`` is removed.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sparkctl.bench.arms import BenchOptions
from sparkctl.bench.diff import compare_summaries
from sparkctl.bench.run import bench_deployment
from sparkctl.config.profile import Profile, load_profile
from sparkctl.deploy import door
from sparkctl.deploy.results import UpResult
from sparkctl.deploy.steps import ARM_COMMAND, CONFIRM, TRIAL, TUNE_BEGIN, TUNE_COMMAND, TUNE_RESTORE, boundary
from sparkctl.errors import BenchError, ConfigError, DeployError, PreflightError, SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.state.ledger import Ledger, now_iso
from sparkctl.state.runs import AcceptanceResult, ConcurrencyResult, DecodeResult, RunRecord, TTFTResult
from sparkctl.state.tunejournal import (
    Confirmation,
    Estimate,
    G6Sample,
    ObjectiveSummary,
    RestoreReport,
    TuneJournal,
    TuneJournalFile,
    TuneOptions,
    TuneTiming,
    TuneTrial,
    Winner,
    clear_marker,
    write_marker,
)
from sparkctl.tune import g6
from sparkctl.tune import space as sp
from sparkctl.tune.settle import restore, resume_target, settle
from sparkctl.userfiles import check_user_target, write_user_text

if TYPE_CHECKING:
    from sparkctl.bench.arms import BenchOptions
    from sparkctl.config.profile import Profile
    from sparkctl.deploy.commands import Deployer
    from sparkctl.deploy.results import UpResult

SCHEMA = "sparkctl.tune/1"
# the engine's fatal boot lines (sparkctl.sglang.logparse.EventKind values) that mean "does not fit in memory"
MEMORY_FAILURES = ("oom", "memory_budget")
OBJECTIVES = {"decode": ("decode", "higher"), "ttft": ("ttft", "lower"), "aggregate-c2": ("concurrency", "higher")}

Progress = Callable[[str], None]


def _boundary(step: str, when: str, index: int | None = None) -> None:
    """The lifecycle's step boundary (deploy/steps.py, `TUNE_STEPS`): ``SPARKCTL_CRASH_AT=tune:<step>:<when>[:SIG]``
    signals the controller there; ``trial@<i>`` is trial i, ``confirm@<k>`` the k-th A/B leg."""
    boundary(TUNE_COMMAND, step, when, index)


def _bench_opts(o: TuneOptions) -> BenchOptions:
    gates = {"decode": ("decode", "acceptance"), "ttft": ("decode", "ttft"),
             "aggregate-c2": ("decode", "concurrency")}[o.objective]
    return BenchOptions(gates=gates, runs=o.runs, max_tokens=o.max_tokens, warmup=o.warmup, acceptance_runs=1,
                        ttft_sizes=o.ttft_sizes, ttft_runs=max(2, min(o.runs, 3)), concurrency=(1, 2))


def objective_samples(card: RunRecord, objective: str) -> list[float]:
    """The samples the objective is judged on, from a card's (first) arm."""
    if not card.arms:
        return []
    res = card.arms[0].results
    if objective == "decode":
        code = res.decode.classes.get("code") if isinstance(res.decode, DecodeResult) else None
        return list(((code.decode_tok_s if code else None) or {}).get("samples") or [])
    if objective == "ttft":
        for e in res.ttft.sizes if isinstance(res.ttft, TTFTResult) else []:
            if (e.ttft_s or {}).get("samples"):
                return list((e.ttft_s or {})["samples"])
        return []
    for lv in res.concurrency.levels if isinstance(res.concurrency, ConcurrencyResult) else []:
        if lv.concurrency == 2 and lv.aggregate_tok_s is not None:
            return [float(lv.aggregate_tok_s)]
    return []


def _accept_len(card: RunRecord) -> float | None:
    """The first arm's accept length, as its engine reports it (`AcceptanceResult.accept_len`; None when not
    measured)."""
    acc = card.arms[0].results.acceptance if card.arms else None
    return acc.accept_len() if isinstance(acc, AcceptanceResult) else None


def classify_failure(exc: BaseException) -> str:
    """Why a candidate is infeasible, in one word or phrase, from the lifecycle's error: its type and the verify
    gates it names (``DeployError.failed_gates``) and the kind of the engine's fatal boot line
    (``DeployError.failure_kind``), never an engine's spelling of a number or an error (SGLang's max_total_num_tokens
    and vLLM's KV cache size both fail the gate called ``capacity``; SGLang's CUDA OOM and vLLM's refused memory
    budget are both ``oom``). A death by the host's OOM-killer (no line: the process is killed) is read from the
    exit the error names."""
    text = (exc.render() if isinstance(exc, SparkctlError) else str(exc)).lower()
    if isinstance(exc, PreflightError):
        return "preflight failed"
    if isinstance(exc, DeployError) and exc.failure_kind in MEMORY_FAILURES:
        return "oom"
    if "oom" in text or "out of memory" in text or "exit code: -9" in text:
        return "oom"
    if isinstance(exc, DeployError) and exc.failed_gates:
        # the capacity gate alone: the engine answered (settings passed) with less than `expect` asks
        return "capacity below expect" if exc.failed_gates == ("capacity",) else "gates failed"
    if isinstance(exc, BenchError):
        return "bench failed"
    return "no boot"


def new_journal(deployer: Deployer, opts: TuneOptions) -> TuneJournalFile:
    """Validate the search (every candidate a valid profile) and write its journal; nothing deployed yet."""
    if opts.objective not in OBJECTIVES:
        raise ConfigError(f"unknown objective {opts.objective!r}", where="--objective",
                          hint=f"one of {', '.join(OBJECTIVES)}")
    base = load_profile(opts.profile)
    if base.replicas > 1:        # before the journal, the lock or any trial (door.up would refuse the first one)
        raise ConfigError(f"--profile {base.name} has replicas: {base.replicas}: a tune deploys and measures each "
                          f"trial as one TP group, never replicas behind the router",
                          where=base.origin_of("replicas"),
                          hint=f"tune a profile of one replica (replicas: 1, server.tp_size {base.server.tp_size}) "
                               f"with an inventory of one replica's nodes, then set replicas: {base.replicas} in "
                               f"the tuned profile; `sparkctl bench --profile {base.name}` measures the replicas "
                               f"through the router")
    space = sp.parse_vary(opts.vary)
    base_vals = sp.baseline_values(base, space)
    cands = [c for c in sp.grid(space) if c != base_vals]
    if opts.trials is not None:
        cands = cands[:opts.trials]
    for k, c in enumerate(cands, 1):
        sp.candidate_profile(base, c, f"{base.name}-t{k}")     # fails now, before anything is deployed
    sp.refuse_inert_keys(base, space, deployer.inventory)
    trials = [TuneTrial.pending(0, {}, True)] + [TuneTrial.pending(k, c, False) for k, c in enumerate(cands, 1)]
    doc = TuneJournal(schema_=SCHEMA, run_id=Ledger.new_id(f"tune-{base.name}"), state="running", created=now_iso(),
                      profile=base.name, profile_data=base.model_dump(mode="json"), space=space,
                      baseline_values=base_vals, options=opts, trials=trials, original=None, estimate=None,
                      confirmation=None, winner=None, restore=None, timing=TuneTiming())
    return TuneJournalFile(deployer.ledger, doc)


def _deploy(deployer: Deployer, profile: Profile) -> UpResult:
    """A trial or A/B leg: an arm of the compare transaction through deploy's door (one `up` plan, journal and
    record, under the tune's lock)."""
    up = door.up(deployer, profile, door.UpRequest(command=ARM_COMMAND), confirm=door.proceed)
    assert isinstance(up, UpResult)          # an arm is one group (door.up refuses replicas in one)
    return up


def _measure(deployer: Deployer, opts: TuneOptions, progress: Progress) -> RunRecord:
    return bench_deployment(deployer, _bench_opts(opts), progress=lambda m: None)


def _candidate(j: TuneJournal, t: TuneTrial) -> Profile:
    base = Profile.model_validate(j.profile_data)
    return base if t.baseline else sp.candidate_profile(base, t.changes, f"{base.name}-t{t.index}")


def _run_trial(deployer: Deployer, j: TuneJournal, t: TuneTrial, progress: Progress) -> None:
    opts = j.options
    label = "baseline" if t.baseline else ", ".join(f"{k}={v}" for k, v in t.changes.items())
    progress(f"trial {t.index}: {label}")
    t0 = time.monotonic()
    try:
        up = _deploy(deployer, _candidate(j, t))
        t.deployment = up.deployment
        t.capacity = up.capacity.model_dump(mode="json") if up.capacity is not None else None
        card = _measure(deployer, opts, progress)
        g6_t0 = time.monotonic()
        outputs = g6.capture(deployer)
        g6_s = round(time.monotonic() - g6_t0, 3)
    except SparkctlError as exc:
        t.status, t.reason, t.error = "infeasible", classify_failure(exc), exc.message
        t.elapsed_s = round(time.monotonic() - t0, 3)
        progress(f"trial {t.index}: infeasible ({t.reason}): {exc.message.splitlines()[0]}")
        return
    samples = objective_samples(card, opts.objective)
    t.status, t.reason = ("feasible", None) if samples else ("infeasible", "objective not measured")
    t.card, t.objective = card.run_id, ObjectiveSummary.of(samples)
    t.elapsed_s, t.accept_len = round(time.monotonic() - t0, 3), _accept_len(card)
    sample = _g6_verdict(j, t, outputs)
    sample.elapsed_s = g6_s
    if t.reason == "G6 failed":
        progress(f"trial {t.index}: infeasible (G6 failed): {sample.detail}")
    if t.status == "feasible" and t.objective is not None:
        o = t.objective
        progress(f"trial {t.index}: {opts.objective} median {o.median:.3f} ({o.min:.3f}-{o.max:.3f}) in "
                 f"{t.elapsed_s:.1f} s")


def _g6_verdict(j: TuneJournal, t: TuneTrial, outputs: list[JSONObject]) -> G6Sample:
    """The trial's G6 sample (sparkctl/tune/g6.py): the baseline's outputs are the reference (kept in the
    journal); a candidate that is not identical to them, or a void sample, makes the trial infeasible."""
    if t.baseline:
        t.g6_outputs = outputs
        t.g6 = g6.judge_reference(outputs)
    else:
        ref = j.trials[0].g6_outputs
        t.g6 = g6.judge(ref, outputs) if ref else G6Sample(verdict="not compared",
                                                           detail="the baseline trial recorded no G6 reference")
    if t.g6.verdict not in ("reference", "identical", "not compared") and t.status == "feasible":
        t.status, t.reason, t.error = "infeasible", "G6 failed", f"G6 sample: {t.g6.detail}"
    return t.g6


def _median(t: TuneTrial) -> float:
    assert t.objective is not None                  # a feasible trial's objective was measured
    return t.objective.median


def _best(j: TuneJournal) -> TuneTrial | None:
    higher = OBJECTIVES[j.options.objective][1] == "higher"
    ok = [t for t in j.trials if not t.baseline and t.status == "feasible"]
    if not ok:
        return None
    return (max if higher else min)(ok, key=_median)


def _confirm(deployer: Deployer, j: TuneJournalFile, winner: TuneTrial, progress: Progress) -> Confirmation:
    """A B A B: baseline and candidate alternated, each a fresh deploy + bench; samples pooled per side."""
    doc, opts = j.doc, j.doc.options
    if doc.confirmation is None:
        doc.confirmation = Confirmation(candidate=winner.index, order=[], baseline=[], winner=[])
    conf = doc.confirmation
    sides: list[tuple[Literal["baseline", "winner"], TuneTrial]] = \
        [("baseline", doc.trials[0]), ("winner", winner)] * opts.confirm_rounds
    for k, (side, t) in enumerate(sides):
        if k < len(conf.order):
            continue                                     # done before a resume
        progress(f"confirmation {k + 1}/{len(sides)}: {side}")
        _boundary(CONFIRM, "before", k + 1)
        try:
            _deploy(deployer, _candidate(doc, t))
            samples = objective_samples(_measure(deployer, opts, progress), opts.objective)
        except SparkctlError as exc:
            conf.verdict, conf.error = "failed", exc.message
            return conf
        conf.order.append(side)
        (conf.baseline if side == "baseline" else conf.winner).extend(samples)
        j.save()
        _boundary(CONFIRM, "after", k + 1)
    a, b = ObjectiveSummary.of(conf.baseline), ObjectiveSummary.of(conf.winner)
    if a is None or b is None:
        conf.verdict, conf.error = "failed", "the objective was not measured in the confirmation"
        return conf
    lower = OBJECTIVES[opts.objective][1] == "lower"
    conf.comparison = compare_summaries(a.model_dump(), b.model_dump(), lower_is_better=lower)
    conf.verdict = conf.comparison["verdict"]
    return conf


def _estimate(j: TuneJournal, elapsed_s: float) -> Estimate | None:
    t1 = next((t.elapsed_s for t in j.trials if t.elapsed_s is not None), None)
    if t1 is None:
        return None
    n = len(j.trials)
    total = elapsed_s + t1 * (n - 1) + t1 * 2 * j.options.confirm_rounds + t1     # trials, ABAB, restore
    return Estimate(after_trial_s=round(t1, 3), trials=n, total_s=round(total, 1),
                    formula="elapsed + first trial x (remaining trials + 2 x confirm rounds + 1 restore)")


def execute(deployer: Deployer, j: TuneJournalFile, progress: Progress) -> TuneJournal:
    """Run (or continue) the tune in `j` to its end: trials, confirmation, promotion, restore. Returns the
    journal (what ``runs/<id>/tune.json`` now holds)."""
    ledger, doc = deployer.ledger, j.doc
    started = time.monotonic() - (doc.timing.elapsed_before_s or 0.0)
    with ledger.lock("tune"):
        _boundary(TUNE_BEGIN, "before")
        if doc.original is None and not doc.began:
            active = ledger.active()
            doc.original, doc.began = (active.id if active else None), now_iso()
        write_marker(ledger, j.run_id, doc.original)
        j.save()
        ended = "failed"                 # how the trials and the decision ended: done, interrupted (a signal), failed
        try:
            _boundary(TUNE_BEGIN, "after")
            _trials(deployer, j, started, progress)
            _decide(deployer, j, started, progress)
            ended = "done"
        except KeyboardInterrupt:
            # Ctrl-C, SIGTERM, SIGHUP: what ran before is restored below and the journal stays resumable (its
            # unfinished trials pending); a second signal exits at once and the next `sparkctl tune` settles it
            ended = "interrupted"
            progress(f"interrupted: restoring what ran before the tune; `sparkctl tune --resume {j.run_id}` "
                     "continues it")
            raise
        finally:
            doc.timing.trials_sum_s = round(sum(t.elapsed_s or 0 for t in doc.trials), 3)
            _restore_and_close(deployer, j, ended, started, progress)
    return doc


def _restore_and_close(deployer: Deployer, j: TuneJournalFile, ended: str, started: float, progress: Progress) -> None:
    """Restore what ran before the tune and close its journal: "finished" only when the trials and the decision
    ran to their end and the restore worked; "interrupted" (resumable) after a signal, "failed" after an error,
    "restore failed" when the restore did not work. A signal during the restore leaves the journal interrupted
    and the marker in place: the next `sparkctl tune` (or `--resume`) settles it."""
    doc = j.doc
    restore_t0, restored = time.monotonic(), False
    try:
        _boundary(TUNE_RESTORE, "before")
        doc.restore = restore(deployer, doc.original, progress)
        restored = True
        _boundary(TUNE_RESTORE, "after")
    except KeyboardInterrupt:
        if not restored:                  # cut before the restore ended: the next tune settles it
            doc.state = "interrupted"
            doc.restore = RestoreReport.model_validate({"ok": False, "error": "interrupted during the restore"})
            j.save()
            raise
        _close(deployer, j, ended)        # the signal came once everything was done: closed as it ended
        raise
    finally:
        doc.timing.restore_s = round(time.monotonic() - restore_t0, 3)
        doc.timing.total_s = round(time.monotonic() - started, 3)
    _close(deployer, j, ended)


def _close(deployer: Deployer, j: TuneJournalFile, ended: str) -> None:
    ok = j.doc.restore is not None and j.doc.restore.ok
    j.doc.state = "restore failed" if not ok else "finished" if ended == "done" else ended
    j.save()
    if ok:
        clear_marker(deployer.ledger)


def _trials(deployer: Deployer, j: TuneJournalFile, started: float, progress: Progress) -> None:
    doc, opts = j.doc, j.doc.options
    for t in doc.trials:
        if t.status != "pending":
            continue                                            # finished before a resume: never redone
        elapsed = time.monotonic() - started
        if opts.budget_s is not None and doc.estimate is not None:
            need = doc.estimate.after_trial_s * (1 + 2 * opts.confirm_rounds + 1)
            if elapsed + need > opts.budget_s:      # this one and every one after it: one journal write for all
                for rest in doc.trials:
                    if rest.status == "pending":
                        rest.status, rest.reason = "skipped", "budget"
                j.save()
                break
        _boundary(TRIAL, "before", t.index)
        _run_trial(deployer, doc, t, progress)
        doc.timing.elapsed_before_s = round(time.monotonic() - started, 3)
        if doc.estimate is None:
            doc.estimate = e = _estimate(doc, time.monotonic() - started)
            if e is not None:
                progress(f"estimate after the first trial ({e.after_trial_s:.1f} s): {e.trials} trials + "
                         f"confirmation + restore = about {e.total_s:.0f} s"
                         + (f" (budget {opts.budget_s:.0f} s)" if opts.budget_s else ""))
        j.save()
        _boundary(TRIAL, "after", t.index)


def _decide(deployer: Deployer, j: TuneJournalFile, started: float, progress: Progress) -> None:
    doc, opts = j.doc, j.doc.options
    base_t = doc.trials[0]
    best = _best(doc)
    if base_t.status != "feasible":
        doc.winner = Winner(promoted=False, why=f"the baseline itself is infeasible ({base_t.reason}): nothing to "
                                                "confirm against")
        return
    if best is None:
        doc.winner = Winner(promoted=False, why="no feasible candidate")
        return
    need = (doc.estimate.after_trial_s if doc.estimate else 0) * 2 * opts.confirm_rounds
    if opts.budget_s is not None and doc.confirmation is None and time.monotonic() - started + need > opts.budget_s:
        doc.winner = Winner(promoted=False, candidate=best.index,
                            why="the budget leaves no time for the A B A B confirmation: nothing promoted")
        return
    t0 = time.monotonic()
    conf = _confirm(deployer, j, best, progress)
    doc.timing.confirm_s = round(time.monotonic() - t0 + (doc.timing.confirm_s or 0), 3)
    c = conf.comparison
    if conf.verdict != "better" or c is None:
        why = (f"trial {best.index} did not beat the baseline beyond the noise band in the A B A B "
               f"confirmation ({conf.verdict}"
               + (f": delta {c['delta']:+.3f}, band {c['band']:.3f}" if c else f": {conf.error}") + ")")
        doc.winner = Winner(promoted=False, candidate=best.index, why=why)
        progress(why + ": nothing promoted")
        return
    changed = {k: v for k, v in best.changes.items() if doc.baseline_values.get(k) != v}
    path = sp.winner_path(doc.profile, j.run_id)
    name = path.stem
    rounds = f"{opts.confirm_rounds} interleaved round{'s' if opts.confirm_rounds > 1 else ''}"
    note = (f"Confirmed over {rounds} (baseline, candidate) against {doc.profile}: {opts.objective} "
            f"{c['a']:.3f} -> {c['b']:.3f} ({c['delta_pct']:+.1f}%, noise band {c['band']:.3f}).")
    # The user's profiles directory: written as given (never chmod-ed); a file already there is replaced only with
    # --force or when this very run wrote it (a resumed tune promoting again).
    write_user_text(path, sp.winner_profile_text(doc.profile, changed, j.run_id, note),
                    overwrite=opts.overwrite or _written_by(path, j.run_id), option=sp.WINNER_WHERE,
                    create_parent=True)
    doc.winner = Winner(promoted=True, candidate=best.index, changes=changed, profile=name, path=str(path),
                        card=best.card, note=note)
    progress(f"winner: {', '.join(f'{k}={v}' for k, v in best.changes.items())} -> profile {name} ({path})")


def _written_by(path: Path, run_id: str) -> bool:
    """Was the profile at `path` written by tune run `run_id` (its first line names the run)?"""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.readline().startswith(f"# Written by `sparkctl tune` run {run_id} ")
    except OSError:
        return False


def tune(deployer: Deployer, opts: TuneOptions, progress: Progress) -> TuneJournal:
    settle(deployer, progress)
    j = new_journal(deployer, opts)              # written once the lock is held (execute)
    # Where the winner will go is refused now (a directory, not writable, a file there without --force), not
    # after hours of trials.
    check_user_target(sp.winner_path(j.doc.profile, j.run_id), overwrite=opts.overwrite,
                      option=sp.WINNER_WHERE, create_parent=True)
    n = len(j.doc.trials)
    progress(f"tune {j.run_id}: {n} trials (baseline + {n - 1} candidates)")
    return execute(deployer, j, progress)


def resume(deployer: Deployer, run_id: str, progress: Progress) -> TuneJournal:
    j = TuneJournalFile.load(deployer.ledger, run_id)
    if j.doc.state == "finished":
        raise ConfigError(f"tune {run_id} already finished", where=str(j.path), hint="start a new `sparkctl tune`")
    marker = settle(deployer, progress, resuming=run_id)
    resume_target(deployer.ledger, j.doc, marker, progress)
    done = sum(1 for t in j.doc.trials if t.status != "pending")
    progress(f"resuming tune {run_id}: {done} of {len(j.doc.trials)} trials already done (not redone)")
    j.doc.state = "running"
    return execute(deployer, j, progress)


__all__ = ["tune", "resume", "objective_samples", "classify_failure"]

