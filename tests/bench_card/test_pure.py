"""Pure parts of the bench: G6 verdicts, statistics, prompt sets, gates, log-only analysis of real captures."""
from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from sparkctl.bench import losslessness as g6
from sparkctl.bench.logsource import FileLog, scheduler_summary
from sparkctl.bench.measure import overlap_max
from sparkctl.bench.prompts import (
    calibration_from_probes,
    decode_prompts,
    g6_prompts,
    long_prompt,
    words_for_tokens,
)
from sparkctl.bench.run import GATES, parse_gates
from sparkctl.bench.stats import ratio, summarize
from sparkctl.errors import ConfigError
from sparkctl.sglang.client import SGLangClient

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "sglang"


# --------------------------------------------------------------------------- G6 verdicts

def cap(reasoning: str = "", content: str = "", **kw) -> g6.Capture:
    return g6.Capture(reasoning=reasoning, content=content, **kw)


def test_identical_content():
    v = g6.compare("p", cap(content="The answer is 42."), cap(content="The answer is 42."))
    assert v.status == "identical"


def test_reasoning_only_is_comparable_not_void():
    # the seed's harness flaw: a model that spent its budget reasoning has content "" on both sides
    v = g6.compare("p", cap(reasoning="okay so the user wants", content=""),
                   cap(reasoning="okay so the user wants", content=""))
    assert v.status == "identical"
    v = g6.compare("p", cap(reasoning="okay so the user wants"), cap(reasoning="okay so the model wants"))
    assert v.status == "diverged" and v.index == 3 and v.channel == "reasoning"


def test_empty_on_both_sides_is_void():
    v = g6.compare("p", cap(), cap())
    assert v.status == "void" and "harness failure" in v.detail


def test_failed_request_is_void():
    v = g6.compare("p", cap(error="HTTP 500"), cap(content="x"))
    assert v.status == "void" and "HTTP 500" in v.detail


def test_divergence_index_exact_and_both_sides_shown():
    on = cap(content="## Step 1: Square each number and add")
    off = cap(content="## Step 1: Square each integer and add")
    v = g6.compare("p", on, off)
    assert (v.status, v.index, v.channel) == ("diverged", 5, "content")
    assert "[[number]]" in v.on_context and "[[integer]]" in v.off_context
    # the seed's formatting-token flip, at index 0
    v = g6.compare("p", cap(content="**Step 1: Square"), cap(content="## Step 1: Square"))
    assert v.index == 0
    # index counts reasoning first, then content
    v = g6.compare("p", cap(reasoning="a b c", content="x y"), cap(reasoning="a b c", content="x z"))
    assert (v.index, v.channel) == (4, "content")


def test_length_difference_and_one_empty_side():
    v = g6.compare("p", cap(content="a b c"), cap(content="a b c d e"))
    assert v.status == "diverged" and v.index == 3 and "ON ended at token 3" in v.detail
    v = g6.compare("p", cap(), cap(content="a"))
    assert v.status == "diverged" and v.index == 0 and "ON side captured nothing" in v.detail


def test_whitespace_only_difference_is_a_divergence():
    v = g6.compare("p", cap(content="a b\n\nc"), cap(content="a b\nc"))
    assert v.status == "diverged" and "whitespace only" in v.detail and v.index == 2


def test_server_tokens_used_when_both_sides_cover_the_completion():
    on = cap(content="ab", tokens=["a", "b"], completion_tokens=2, top2_gaps=[3.0, 0.01])
    off = cap(content="ac", tokens=["a", "c"], completion_tokens=2, top2_gaps=[3.0, 0.02])
    v = g6.compare("p", on, off)
    assert (v.status, v.index, v.tokenization) == ("diverged", 1, "server tokens")
    assert v.top2_gap_on == 0.01 and v.top2_gap_off == 0.02


def test_summary_never_says_lossless_unless_all_identical():
    same = g6.PromptVerdict("a", "identical")
    s = g6.summarize_verdicts([same] * 19 + [g6.PromptVerdict("b", "diverged", index=3)])
    assert s["summary"].startswith("19/20 identical") and "lossless" not in s["summary"].lower()
    s = g6.summarize_verdicts([same] * 19 + [g6.PromptVerdict("b", "void")])
    assert "VOID" in s["summary"] and "lossless" not in s["summary"].lower() and not s["all_identical"]
    s = g6.summarize_verdicts([same] * 20)
    assert s["all_identical"] and "20/20 identical" in s["summary"] and "lossless" in s["summary"]


@pytest.mark.parametrize("statuses", [["identical"] * 20, ["identical"] * 2 + ["diverged"] * 18,
                                      ["identical", "void"], ["diverged"], ["void"]])
def test_between_engines_the_summary_compares_engines_never_losslessness(statuses):
    """`bench --compare` across engines: two engines' greedy outputs are expected to differ; the line never calls
    them lossless nor calls the first arm "ON is NOT bit-identical to OFF" (there is no ON and OFF)."""
    verdicts = [g6.PromptVerdict(str(i), st, index=0 if st == "diverged" else None) for i, st in enumerate(statuses)]
    s = g6.summarize_verdicts(verdicts, between_engines="vLLM 0.32.0 vs SGLang 0.5.23")
    line = s["summary"]
    assert "lossless" not in line.replace("not a losslessness verdict", "") and "ON is NOT" not in line, line
    assert "vLLM 0.32.0 vs SGLang 0.5.23" in line and s["between_engines"] == "vLLM 0.32.0 vs SGLang 0.5.23"
    assert line.startswith(f"{statuses.count('identical')}/{len(statuses)} identical")
    assert "between_engines" not in g6.summarize_verdicts(verdicts)        # one engine: the key is absent


def test_run_g6_arm_captures_reasoning_and_empty_responses():
    bodies = {"reasoning": {"content": None, "reasoning_content": "thinking hard"},
              "empty": {"content": "", "reasoning_content": None}}

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        which = "reasoning" if "Australia" in body["messages"][0]["content"] else "empty"
        return httpx.Response(200, json={"choices": [{"index": 0, "message": {"role": "assistant", **bodies[which]},
                                                      "finish_reason": "length"}],
                                         "usage": {"prompt_tokens": 5, "completion_tokens": 7}})

    prompts = [p for p in g6_prompts() if p.id in ("fact-capital", "fact-boiling")]
    with SGLangClient("http://fake", transport=httpx.MockTransport(handler)) as c:
        on = g6.run_g6_arm(c, prompts, max_tokens=7, model=None)
        off = g6.run_g6_arm(c, prompts, max_tokens=7, model=None)
    verdicts = {p.id: g6.compare(p.id, a, b) for p, a, b in zip(prompts, on, off)}
    assert verdicts["fact-capital"].status == "identical"     # reasoning captured: comparable
    assert verdicts["fact-boiling"].status == "void"          # nothing on either side


# --------------------------------------------------------------------------- stats, prompts, gates

def test_summary_median_min_max_and_noise():
    s = summarize([10.0, 10.1, 10.05, None])
    assert s is not None
    assert (s.n, s.median, s.min, s.max) == (3, 10.05, 10.0, 10.1) and not s.noisy
    spread = summarize([10.0, 10.5, 10.2])
    assert spread is not None and spread.noisy      # 4.9% spread
    assert summarize([]) is None and summarize([None]) is None
    assert ratio(27.6, 14.7) == pytest.approx(1.8776, abs=1e-4) and ratio(1.0, 0) is None


def test_prompt_sets():
    d = decode_prompts()
    assert list(d) == ["code", "prose"] and "queue" in d["code"].text and "measure" in d["prose"].text.lower()
    ps = g6_prompts()
    assert len(ps) >= 20 and len({p.id for p in ps}) == len(ps)
    assert {"math", "code", "fact", "format"} <= {p.kind for p in ps}


def test_long_prompts_deterministic_with_unique_prefixes():
    a, b = long_prompt(300, "run/4096/0"), long_prompt(300, "run/4096/1")
    assert a == long_prompt(300, "run/4096/0") and a != b
    assert a.split(".")[0] != b.split(".")[0]           # differs from the first sentence: nothing to share
    assert 290 <= len(a.split()) <= 320
    cal = calibration_from_probes(small_tokens=20, big_tokens=20 + 1000, big_words=800)
    assert cal.measured and cal.tokens_per_word == 1.25
    assert words_for_tokens(4096, cal) == round((4096 - 20) / 1.25)


def test_gates_parse_and_reject_typos():
    assert parse_gates(None) == GATES and parse_gates("all") == GATES
    assert parse_gates("g6, decode") == ("decode", "g6")
    with pytest.raises(ConfigError) as e:
        parse_gates("decode,concurency")
    assert "concurrency" in e.value.render()


def test_overlap():
    assert overlap_max([(0, 1), (1.5, 2)]) == 1
    assert overlap_max([(0, 1), (0.5, 2), (0.7, 0.8)]) == 3


# --------------------------------------------------------------------------- --log on real captures

def _printed_ranges(path: Path) -> tuple[tuple[float, float], tuple[float, float]]:
    """The accept len/rate ranges as printed, read with a regex independent of sparkctl's parser."""
    lens, rates = [], []
    for line in path.read_text().splitlines():
        m = re.search(r"Decode batch[.,] #running-req: (\d+),.*accept len: ([\d.]+), accept rate: ([\d.]+)", line)
        if m and int(m.group(1)) >= 1:
            lens.append(float(m.group(2)))
            rates.append(float(m.group(3)))
    return (min(lens), max(lens)), (min(rates), max(rates))


@pytest.mark.parametrize("name", ["decode-batch-old-period-form-eagle3-accept.txt",
                                  "spark-1node-dflash-startup-decode-shutdown.txt",
                                  "spark-3node-tp3-rank0-dspark-startup-serve.txt"])
def test_log_only_on_real_captures(name, cli, state_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("SPARKCTL_INVENTORY", raising=False)
    path = CAPTURES / name
    exp_len, exp_rate = _printed_ranges(path)
    code, out, err = cli("bench", "--log", str(path), "--out", str(tmp_path), "--json")
    assert code == 0, err
    res = json.loads(out)
    lo = res["log_only"]
    assert tuple(lo["accept_len"]) == exp_len and tuple(lo["accept_rate"]) == exp_rate
    assert lo["source"].startswith("scheduler decode-batch log")
    card = (tmp_path / "report.md").read_text()
    assert f"accept len {exp_len[0]:.2f}–{exp_len[1]:.2f}" in card
    assert f"accept rate {exp_rate[0]:.2f}–{exp_rate[1]:.2f}" in card
    assert "gauge" in card and "EMULATED" not in card and res["emulated"] is False


def test_log_only_period_dialect_via_library():
    sch = scheduler_summary(FileLog(CAPTURES / "decode-batch-old-period-form-eagle3-accept.txt").whole())
    assert sch["decode"]["dialects"] == ["period"] and sch["decode"]["max_running_req"] == 1


# --------------------------------------------------------------------------- redaction by field

def _capture_json(name: str) -> dict:
    text = (Path(__file__).resolve().parents[1] / "fixtures" / "captures" / "sglang-api" / name).read_text()
    return json.loads(text.split("\n", 3)[3].strip())


@pytest.mark.parametrize("name", ["get_server_info-0.5.3.post3.txt", "server_info-dev-2026-04.txt"])
def test_only_secret_fields_of_real_server_info_are_secret(name):
    from sparkctl.bench.target import is_secret_field

    info = _capture_json(name)
    secret = {k for k in info if is_secret_field(k)}
    assert secret <= {"api_key", "admin_api_key", "ssl_keyfile_password"} and "api_key" in secret
    for kept in ("max_total_tokens", "max_total_num_tokens", "speculative_num_draft_tokens", "max_prefill_tokens",
                 "bucket_time_to_first_token", "tokenizer_path", "kt_max_deferred_experts_per_token"):
        assert not is_secret_field(kept), kept


def test_card_keeps_capacity_and_speculative_settings_and_hides_secrets():
    from sparkctl.bench.target import describe_server, redact_argv

    info = {**_capture_json("server_info-dev-2026-04.txt"), "max_total_tokens": 131072, "max_total_num_tokens": 64832,
            "speculative_num_draft_tokens": 8, "speculative_algorithm": "DFLASH", "api_key": "sk-live-123",
            "launch_command": "python3 -m sglang.launch_server --api-key sk-live-123 --max-total-tokens 131072 "
                              "--speculative-num-draft-tokens 8 --admin-api-key=adm1 --hf-token hf_abcdefghijkl "
                              "--ssl-keyfile-password pw --my-secret s3 --foo-token t0 --bar-password p1 "
                              "--model-path /models/sk-notakey1234 --kt-max-deferred-experts-per-token 2"}
    d = describe_server(info)
    assert (d["max_total_tokens"], d["max_total_num_tokens"], d["speculative_num_draft_tokens"]) == (131072, 64832, 8)
    assert d["resolved"]["max_total_num_tokens"] == 64832
    cmd = d["launch_command"]
    for secret in ("sk-live-123", "adm1", "hf_abcdefghijkl", " pw ", "s3", "t0", "p1"):
        assert secret not in cmd, secret
    for kept in ("--max-total-tokens 131072", "--speculative-num-draft-tokens 8", "/models/sk-notakey1234",
                 "--kt-max-deferred-experts-per-token 2", "--admin-api-key=***", "--api-key ***"):
        assert kept in cmd, kept
    assert redact_argv(["--max-running-requests", "1", "--api-key=k"]) == ["--max-running-requests", "1",
                                                                          "--api-key=***"]


@pytest.mark.parametrize("runs,why", [
    ([{"completion_tokens": None, "usage_missing": True}], "no usage.completion_tokens"),
    ([{"completion_tokens": 1, "decode_s": None}], "fewer than 2 tokens"),
    # 8 tokens of a fast emulator under load: all in one read, no time between the first and the last
    ([{"completion_tokens": 8, "decode_s": 0.0}, {"completion_tokens": 8, "decode_s": 0.0}], "arrived in one read"),
])
def test_a_class_not_measured_says_why_from_its_runs(runs, why):
    from sparkctl.bench.measure import not_measured
    from sparkctl.state.runs import RequestRun
    base = dict.fromkeys(("prompt_tokens", "reasoning_tokens", "cached_tokens", "finish_reason", "ttft_s", "decode_s",
                          "decode_tok_s", "e2e_tok_s"))
    recs = [RequestRun.model_validate({**base, "latency_s": 0.2, "usage_missing": False, **r}) for r in runs]
    assert why in not_measured(recs) and "not measured" in not_measured(recs)
