"""Leviathan et al.'s expected tokens per step and predicted speedup, against hand values."""
import pytest

from specviz.core.theory import expected_tokens, predicted_speedup


def test_expected_tokens_per_step():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.8, 4) == pytest.approx((1 - 0.8 ** 5) / 0.2)


def test_predicted_speedup():
    assert predicted_speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2)
    assert predicted_speedup(0.0, 4, 0.5) == pytest.approx(1 / 3)
    assert predicted_speedup(0.8, 4, 0.05, v=1.5) == pytest.approx(3.3616 / 1.7)
