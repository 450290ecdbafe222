"""Pure parts of the emulator: knobs, tokenizer, generator, acceptance model, radix cache."""
from __future__ import annotations

import json
import statistics

import pytest

from sparkctl.sim import decoding as dec
from sparkctl.sim.config import KnobError, Knobs, load_knobs, version_tuple


def test_knobs_file_rank_override_and_env(tmp_path):
    cfg = tmp_path / "sim.json"
    cfg.write_text(json.dumps({"decode_tps": 20, "ranks": {"1": {"crash_after_s": 5}}}))
    env = {"SPARKCTL_SIM_CONFIG": str(cfg), "SPARKCTL_SIM_BOOT_S": "0.5"}
    k0, k1 = load_knobs(0, env), load_knobs(1, env)
    assert k0.decode_tps == 20.0 and k0.crash_after_s is None and k0.boot_s == 0.5
    assert k1.crash_after_s == 5.0
    assert load_knobs(0, {"SPARKCTL_SIM_DIVERGENCE": '{"abcd": 3}'}).divergence == {"abcd": 3}


def test_knobs_layers_cluster_then_file_then_env(tmp_path):
    """A deployment's SPARKCTL_SIM_CONFIG beats the cluster's knobs (SPARKCTL_SIM_CLUSTER, from the inventory);
    a per-knob variable beats both. Before this layer existed the inventory's knobs arrived as per-knob
    variables and silently beat every fault file (the flaky SIGINT test's boot_s: 30 never reached an engine)."""
    from sparkctl.nodes.runtime import sim_env

    cfg = tmp_path / "fault.json"
    cfg.write_text(json.dumps({"boot_s": 30, "ranks": {"1": {"decode_tps": 7}}}))
    env = {**sim_env({"boot_s": 0.4, "decode_tps": 4000, "peer_timeout_s": 2}), "SPARKCTL_SIM_CONFIG": str(cfg)}
    assert set(sim_env({"boot_s": 0.4})) == {"SPARKCTL_SIM_CLUSTER"} and sim_env({}) == {}
    k0, k1 = load_knobs(0, env), load_knobs(1, env)
    assert (k0.boot_s, k0.decode_tps, k0.peer_timeout_s) == (30.0, 4000.0, 2.0)
    assert (k1.boot_s, k1.decode_tps) == (30.0, 7.0)
    assert load_knobs(0, {**env, "SPARKCTL_SIM_BOOT_S": "1.5"}).boot_s == 1.5
    with pytest.raises(KnobError, match="SPARKCTL_SIM_CLUSTER: unknown knob 'boot'"):
        load_knobs(0, {"SPARKCTL_SIM_CLUSTER": '{"boot": 1}'})


def test_knobs_yaml(tmp_path):
    cfg = tmp_path / "sim.yaml"
    cfg.write_text("never_healthy: true\nreasoning_tokens: [1, 2]\n")
    k = load_knobs(0, {"SPARKCTL_SIM_CONFIG": str(cfg)})
    assert k.never_healthy is True and k.reasoning_tokens == (1, 2)


def test_unknown_knob():
    with pytest.raises(KnobError, match="did you mean 'peer_timeout_s'"):
        load_knobs(0, {"SPARKCTL_SIM_PEER_TIMEOUT": "3"})


def test_version_tuple():
    assert version_tuple("0.5.3.post3") == (0, 5, 3) and version_tuple("0.5.23") == (0, 5, 23)


def test_tokenizer():
    assert dec.count_tokens("Hi, you!") == 4
    assert dec.count_tokens(dec.render(["a", ",", "b", "."])) == 4


def test_plan_deterministic_and_split():
    k = Knobs()
    a = dec.make_plan("hello", thinking=True, knobs=k, spec_on=False, temperature=0)
    b = dec.make_plan("hello", thinking=True, knobs=k, spec_on=True, temperature=0)
    assert a.tokens(0, 300) == b.tokens(0, 300)
    assert a.token(a.reasoning_len - 1) == dec.THINK_CLOSE
    assert 24 + 1 <= a.reasoning_len <= 64 + 1


def test_divergence_by_key_prefix():
    k = Knobs(divergence={dec.prompt_key("hello")[:8]: 11})
    off = dec.make_plan("hello", thinking=False, knobs=k, spec_on=False, temperature=0)
    on = dec.make_plan("hello", thinking=False, knobs=k, spec_on=True, temperature=0)
    assert off.tokens(0, 11) == on.tokens(0, 11) and off.token(11) != on.token(11)


def test_acceptance_mean():
    k = Knobs()
    m = dec.AcceptanceModel("key", code=False, draft_tokens=8, knobs=k)
    draws = [m.next() for _ in range(5000)]
    assert abs(statistics.mean(draws) - 3.3) < 0.1 and min(draws) >= 1 and max(draws) <= 8


def test_code_classification():
    assert dec.is_code_prompt("Implement a threaded queue")
    assert not dec.is_code_prompt("Write a measurement essay")


def test_radix_cache():
    c = dec.RadixCache(100)
    assert c.match(["a", "b"]) == 0
    c.insert(["a", "b", "c", "d"])
    assert c.match(["a", "b", "c", "x"]) == 3
    assert c.match(["a", "b", "c", "d"]) == 3          # at least one token is always computed
    c.flush()
    assert c.match(["a", "b"]) == 0
