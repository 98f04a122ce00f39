"""core/metrics.py against hand values: alpha, tau, c, v(n), Leviathan et al.'s expected tokens per
step and predicted speedup, step by step and with the prompt's pass; the local and the served
records read alpha and tau from it alike."""
import pytest

from specviz.core.events import RunStats
from specviz.core.metrics import (acceptance_rate, cost_ratio, expected_tokens, mean_accepted_length,
                                  Prediction, predicted_speedup, verify_ratios, with_prefill)
from specviz.serving.records import SpecStats


def test_expected_tokens_per_step():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.8, 4) == pytest.approx((1 - 0.8 ** 5) / 0.2)


def test_predicted_speedup():
    assert predicted_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
    assert predicted_speedup(0.0, 4, 0.5) == pytest.approx(1 / 3)
    assert predicted_speedup(0.8, 4, 0.05, v=1.5) == pytest.approx(3.3616 / 1.7)


def test_the_rates_and_costs():
    assert acceptance_rate(3, 4) == 0.75 and acceptance_rate(0, 0) == 0.0
    assert mean_accepted_length(10, 4) == 2.5 and mean_accepted_length(0, 0) == 0.0
    assert cost_ratio(0.02, 4, 0.05) == pytest.approx(0.1)  # 5 ms a drafted token, 50 ms a target step
    assert cost_ratio(0.02, 0, 0.05) == 0.0
    assert verify_ratios({5: 0.075, 1: 0.05}) == pytest.approx({1: 1.0, 5: 1.5})


def test_the_prediction_step_by_step_and_with_the_prompts_pass():
    # kept 2, 0 and 1 drafts: 2 tokens a step, for 0.3 drafting and 1.5 verifying a step
    assert Prediction(1 + 3 / 3, 0.3, (1.5 + 1.0 + 2.0) / 3).decode == pytest.approx(2 / 1.8)
    assert Prediction(0.0, 0.0, 0.0).decode == 0.0
    # 3 tokens a step for 0.5 drafting and 1 verifying: 2x, 1.6x over 100 tokens after a 25-step prompt
    p = Prediction(3.0, 0.5, 1.0, tokens=100, prefill=25.0)
    assert p.decode == pytest.approx(2.0) and p.speedup == pytest.approx(125 / 75)
    # a verify step of 12 ms against 10 ms a token at v = 1: 2 ms unmodelled; 50 ms a token would take 3 s
    assert p.unmodelled(0.012, 0.010) == pytest.approx(0.002) and p.gap(4.0, 0.05) == pytest.approx(1.0)
    # 100 tokens at 2x after a prompt both runs read in 100 target steps: 200 steps against 150
    assert with_prefill(2.0, 100, 100.0) == pytest.approx(4 / 3)
    assert with_prefill(2.0, 100, 0.0) == pytest.approx(2.0)


def test_a_local_run_and_a_served_one_count_alpha_and_tau_alike():
    # 4 steps keeping 6 of 10 drafts: 10 tokens, 2.5 a step, whoever did the decoding
    local = RunStats(tokens=10, steps=4, target_calls=5, drafted=10, accepted=6, prefill_time=0.0, draft_time=0.0,
                     verify_time=0.0, elapsed=1.0, stop_reason="max_new_tokens")
    served = SpecStats(engine="vllm", drafted=10, accepted=6, steps=4)
    assert local.acceptance_rate == served.acceptance_rate == 0.6
    assert local.mean_accepted_length == served.mean_accepted_length == 2.5
    assert SpecStats(engine="vllm", drafted=10, accepted=6).mean_accepted_length is None  # no step count
