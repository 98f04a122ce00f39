"""The exactness audit (`python -m specviz audit`): its statistics on hand-made samples, its verdicts,
a served engine read over HTTP, and controls that must fail beside exact engines that must pass.

Fixed seeds throughout: every p-value here is the same on every run.
"""
from __future__ import annotations

import random

import pytest
from scipy.stats import ncx2

from specviz.audit.stats import chi_square, compare, detectable_tv, joint, noncentral_survival

OUTCOMES = ("a", "b", "c", "d", "e", "f")
P = (0.3, 0.25, 0.2, 0.12, 0.08, 0.05)


def sample(weights, n, seed, length=2):
    """n completions of `length` tokens, each token drawn independently from `weights`."""
    r = random.Random(seed)
    return [tuple(r.choices(OUTCOMES, weights)[0] for _ in range(length)) for _ in range(n)]


def shifted(tv: float):
    """P with `tv` of mass moved from its two likeliest outcomes to its two rarest."""
    q = list(P)
    q[0] -= tv / 2
    q[1] -= tv / 2
    q[-1] += tv / 2
    q[-2] += tv / 2
    return q


def test_one_distribution_twice_passes_and_a_shift_of_0_1_fails_at_500_draws():
    same = compare(sample(P, 500, 1), sample(P, 500, 2), depth=2)
    assert not same.different and same.p > 0.05
    moved = compare(sample(shifted(0.1), 500, 1), sample(P, 500, 2), depth=2)
    assert moved.different and moved.p < 1e-3
    assert moved.tv > moved.tv_floor and moved.tv_low > same.tv_low
    # each position is tested too, and the verdict's p pays for the three looks
    assert [t.what for t in moved.tests] == ["first 2 tokens together", "token 1", "token 2"]
    assert moved.p == pytest.approx(min(1, 3 * min(t.p for t in moved.tests)))


def test_rare_outcomes_are_pooled_so_a_long_tail_is_testable():
    a = Counter_of([("x",)] * 50 + [(f"rare{i}",) for i in range(40)])
    b = Counter_of([("x",)] * 50 + [(f"other{i}",) for i in range(40)])
    stat, dof, p = chi_square(a, b)
    assert dof == 1 and p > 0.5  # "x" against everything else pooled


def Counter_of(samples):
    return joint(samples, 1)


def test_the_power_bound_matches_scipys_noncentral_chi_square():
    for x, dof, nc in ((11.3, 4, 6.0), (30.0, 17, 25.0), (2.0, 1, 0.5)):
        assert noncentral_survival(x, dof, nc) == pytest.approx(ncx2.sf(x, dof, nc), abs=1e-6)


def test_a_difference_of_the_stated_size_is_caught_at_least_as_often_as_promised():
    """The least favourable shift of the stated TV (moving mass in proportion to P, between two
    halves of equal mass) is caught at the stated 80% or more; a quarter of it mostly is not."""
    n = 300
    half = (0.3, 0.2)  # the first and third outcomes hold half the mass
    tv = detectable_tv(n, n, dof=len(P) - 1, alpha=0.01)
    assert 0.1 < tv < 0.2

    def caught(size, trials=60):
        q = [p * (1 + 2 * size) if p in half and i in (0, 2) else p * (1 - 2 * size) for i, p in enumerate(P)]
        hits = 0
        for t in range(trials):
            a, b = joint(sample(q, n, 1000 + t, 1), 1), joint(sample(P, n, 5000 + t, 1), 1)
            hits += chi_square(a, b)[2] < 0.01
        return hits / trials

    assert caught(tv) >= 0.75
    assert caught(tv / 4) < 0.3
