"""Is speculative sampling exact? Compare token counts from two samplers with a chi-square test.

Speculative sampling promises tokens distributed exactly as plain sampling's. Drawing the
first token N times each way (seeds 0..N-1) gives two histograms; a chi-square test of
homogeneity says how surprising their difference would be if both came from one
distribution (a small p-value, say < 0.01, would point to a bug). Pure functions.
"""
from __future__ import annotations

from collections import Counter

import torch

OTHER = -1  # tokens too rare for the test, pooled into one bin
MIN_EXPECTED = 5  # the usual rule: a bin whose expected count is below this is pooled


def pooled(a: Counter, b: Counter, min_expected: float = MIN_EXPECTED) -> list[tuple[int, int, int]]:
    """(token, count in a, count in b) bins, rare tokens pooled into OTHER so every bin's
    expected count (under one shared distribution) reaches min_expected where possible."""
    na, nb = sum(a.values()), sum(b.values())
    n = na + nb
    bins, other = [], [0, 0]
    for t in sorted(set(a) | set(b), key=lambda t: -(a[t] + b[t])):
        total = a[t] + b[t]
        if n and min(na, nb) * total / n >= min_expected:
            bins.append((t, a[t], b[t]))
        else:
            other[0] += a[t]
            other[1] += b[t]
    if sum(other):
        bins.append((OTHER, *other))
    return bins


def chi_square(a: Counter, b: Counter) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of the test that `a` and `b` are counts from
    one distribution, over pooled bins (one bin: nothing to test, p = 1)."""
    bins = pooled(a, b)
    na, nb = sum(a.values()), sum(b.values())
    if len(bins) < 2 or not na or not nb:
        return 0.0, 0, 1.0
    n = na + nb
    stat = 0.0
    for _, x, y in bins:
        total = x + y
        for observed, size in ((x, na), (y, nb)):
            expected = size * total / n
            stat += (observed - expected) ** 2 / expected
    dof = len(bins) - 1
    return stat, dof, survival(stat, dof)


def survival(stat: float, dof: int) -> float:
    """P(X >= stat) for X ~ chi-square(dof): the regularised upper incomplete gamma Q(dof/2, stat/2)."""
    value = torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64))
    return float(value)
