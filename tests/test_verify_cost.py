"""The verify-cost curve: what it measures, how it is read between sizes, and that it is measured once."""
from __future__ import annotations

import pytest
from conftest import tiny_llama

from specviz.engine import verify_cost
from specviz.engine.verify_cost import SIZES, VerifyCurve
from specviz.modeling.models import weight_bytes


def hand_curve(**kw) -> VerifyCurve:
    # v = 1, 1.1, 1.3, 1.7 at 1, 2, 4, 8 tokens
    return VerifyCurve(sizes=(1, 2, 4, 8), seconds=(0.1, 0.11, 0.13, 0.17), weight_bytes=400_000_000, **kw)


def test_the_curve_is_read_relative_to_one_token_and_between_measured_sizes():
    c = hand_curve()
    assert c.relative == pytest.approx((1.0, 1.1, 1.3, 1.7))
    assert c.cost(1) == c.cost(0.5) == 1.0
    assert c.cost(4) == pytest.approx(1.3)
    assert c.cost(5) == pytest.approx(1.4)  # a quarter of the way from 4 to 8
    assert c.cost(3.2) == pytest.approx(1.1 + 0.2 * 1.2 / 2)  # a mean draft length + 1
    assert c.cost(12) == pytest.approx(2.1)  # beyond 8: the last segment's slope, 0.1 per token
    assert c.bandwidth == pytest.approx(4e9)  # 400 MB read in 0.1 s
    d = c.to_dict()
    assert d["sizes"] == [1, 2, 4, 8] and d["relative"] == pytest.approx([1.0, 1.1, 1.3, 1.7])
    assert d["weight_bytes"] == 400_000_000 and d["seconds"][0] == 0.1


def test_a_tiny_model_gets_every_size_timed_on_a_fixed_context():
    model = tiny_llama(seed=5)
    seen = {}

    def costs(m, prompt, sizes, repeats):  # stands in for the clock: no timing is asserted
        seen.update(prompt=prompt, sizes=sizes, repeats=repeats)
        return {n: 0.001 * (1 + 0.1 * (n - 1)) for n in sizes}

    c = verify_cost.measure(model, costs=costs)
    assert c.sizes == SIZES == seen["sizes"] and len(seen["prompt"]) == verify_cost.CONTEXT
    assert c.relative[0] == 1.0 and c.weight_bytes == weight_bytes(model) > 0
    assert (c.device, c.dtype) == ("cpu", "float32")
    real = verify_cost.measure(model, sizes=(1, 2), repeats=1)  # the real clock, on two sizes
    assert real.sizes == (1, 2) and all(t > 0 for t in real.seconds)


def test_a_short_context_measures_only_the_sizes_that_fit():
    model = tiny_llama(seed=5, context=40)
    c = verify_cost.measure(model, costs=lambda m, prompt, sizes, r: {n: 1.0 for n in sizes})
    assert c.sizes == (1, 2, 4, 8, 16)  # 20 tokens of context + 32 would pass 40


def test_the_curve_is_measured_once_per_model():
    model, calls = tiny_llama(seed=6), []

    def fake(m):
        calls.append(m)
        return hand_curve()

    assert verify_cost.known(model) is None
    first = verify_cost.curve(model, measure=fake)
    assert verify_cost.curve(model, measure=fake) is first and verify_cost.known(model) is first
    assert len(calls) == 1
    verify_cost.curve(tiny_llama(seed=7), measure=fake)  # another model: its own measurement
    assert len(calls) == 2
