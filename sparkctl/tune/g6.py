"""The G6 sample of each tune trial: greedy outputs of a few fixed prompts, compared with the baseline trial's.

The card's G6 (sparkctl/bench/losslessness.py, ``sparkctl bench --compare <DFLASH-off profile>``) compares the
outputs of speculation ON against a DFLASH-off reference, token for token, at temperature 0. A tune does not
deploy a DFLASH-off reference per trial (a second boot for every candidate); its reference is the **baseline
trial**: the profile as it is, whose own losslessness the card establishes. Speculative decoding that is
lossless reproduces the target model's greedy output whatever its draft settings, so a candidate whose greedy
output differs from the baseline's on the same prompts is not lossless (or the baseline is not; the card's full
G6 says which). The sample is small on purpose: the first ``PROMPTS`` G6 prompts of the bench's prompt set,
``MAX_TOKENS`` tokens each, one stream at a time, through the same ``run_g6_arm`` and ``compare`` the bench uses
(server tokens when logprobs cover the completion, else whitespace tokens).

Verdicts per trial (``trial["g6"]``):

* the baseline: ``reference`` (its outputs are stored in the journal for the candidates, and for a resume);
  ``void`` when a request failed or nothing came back (the baseline is then infeasible: nothing to compare to);
* a candidate: ``identical`` (every prompt the same as the baseline's), else ``diverged`` or ``void``, and the
  trial is infeasible with reason ``G6 failed`` naming the first divergence.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from sparkctl.bench import losslessness
from sparkctl.bench.arms import arm_from_record
from sparkctl.bench.prompts import Prompt, g6_prompts
from sparkctl.errors import SparkctlError
from sparkctl.jsontypes import JSONObject
from sparkctl.state.tunejournal import G6Sample

if TYPE_CHECKING:
    from sparkctl.deploy.commands import Deployer

PROMPTS = 2        # the first N prompts of the bench's G6 set
MAX_TOKENS = 48    # tokens per prompt: enough to cover a divergence early in the answer, cheap per trial

__all__ = ["PROMPTS", "MAX_TOKENS", "capture", "judge_reference", "judge"]


def _prompts() -> list[Prompt]:
    return list(g6_prompts()[:PROMPTS])


def capture(deployer: Deployer) -> list[JSONObject]:
    """Greedy outputs of the sample prompts on the active deployment (one dict per prompt, journal-ready)."""
    record = deployer.ledger.active()
    if record is None:
        raise SparkctlError("no active deployment to capture G6 outputs from", where=str(deployer.ledger.root),
                            hint="the trial's deployment is gone: see `sparkctl status`")
    arm = arm_from_record(deployer, record)
    try:
        caps = losslessness.run_g6_arm(arm.client, _prompts(), max_tokens=MAX_TOKENS, model=arm.model)
    finally:
        arm.client.close()
    return [asdict(c) for c in caps]


def _caps(raw: list[JSONObject]) -> list[losslessness.Capture]:
    return [losslessness.Capture(**c) for c in raw]


def _base(verdicts: list[losslessness.PromptVerdict], reference: str) -> JSONObject:
    s = losslessness.summarize_verdicts(verdicts)
    return {"reference": reference, "prompts": [p.id for p in _prompts()], "max_tokens": MAX_TOKENS,
            "temperature": 0, "n": s["n"], "identical": s["identical"], "diverged": s["diverged"],
            "void": s["void"], "verdicts": [v.as_dict() for v in verdicts]}


def judge_reference(outputs: list[JSONObject]) -> G6Sample:
    """The baseline's own sample: ``reference`` when every prompt produced output, else ``void``."""
    caps = _caps(outputs)
    bad = [(p.id, c) for p, c in zip(_prompts(), caps) if c.error or c.empty]
    out = {"reference": "this trial (the baseline)", "prompts": [p.id for p in _prompts()], "max_tokens": MAX_TOKENS,
           "temperature": 0, "n": len(caps)}
    if bad or len(caps) != len(_prompts()):
        pid, c = bad[0] if bad else ("-", losslessness.Capture(error="fewer outputs than prompts"))
        out.update(verdict="void", detail=f"prompt {pid}: {c.error or 'nothing captured'}: harness failure, "
                                          "no reference for the candidates")
    else:
        out.update(verdict="reference", detail=f"{len(caps)} greedy outputs recorded as the reference")
    return G6Sample.model_validate(out)


def judge(reference: list[JSONObject], outputs: list[JSONObject]) -> G6Sample:
    """A candidate's sample against the baseline's: verdict ``identical`` only when every prompt is identical."""
    verdicts = [losslessness.compare(p.id, c, r) for p, c, r in zip(_prompts(), _caps(outputs), _caps(reference))]
    out = _base(verdicts, "baseline trial 0")
    if out["n"] and out["identical"] == out["n"]:
        out.update(verdict="identical", detail=f"{out['n']}/{out['n']} identical to the baseline's greedy output")
        return G6Sample.model_validate(out)
    first = next(v for v in verdicts if v.status != "identical") if verdicts else None
    out["verdict"] = "diverged" if out["diverged"] else "void"
    out["detail"] = (f"{out['identical']}/{out['n']} identical to the baseline; " +
                     (f"prompt {first.prompt_id}: {first.status}"
                      + (f" at token {first.index}" if first.index is not None else "")
                      + (f" ({first.detail})" if first.detail else "") if first else "no prompt compared"))
    return G6Sample.model_validate(out)
