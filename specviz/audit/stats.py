"""Are two samples of short completions drawn from one distribution? Pure functions.

An audit draws N completions of a few tokens with speculation and N without, one per seed.
Exact speculative sampling promises both come from the same distribution, so:

- `chi_square` on the joint of the first `depth` tokens (core/exactness.py: rare outcomes pooled
  until every bin expects 5 draws), and on each position's own tokens; the verdict takes the
  smallest p-value times the number of tests (Bonferroni), so looking several ways is not a
  second chance to fail by luck;
- the total variation between the two samples over the test's bins, with a seeded bootstrap
  interval (tv_interval) whose upper end never falls below the estimate; being a plug-in estimate it sits above 0 even for one sampler drawn twice, so its
  floor is stated beside it: the median TV of two samples of these sizes from one distribution
  (the two pooled), what "no difference" looks like at this N;
- power: the smallest total variation the joint test catches with 80% probability at this
  sample size. For any difference d between the two distributions over the test's bins,
  sum(d^2 / p) >= (sum |d|)^2 = 4 TV^2 (Cauchy-Schwarz), so the test's non-centrality is at
  least 4 n TV^2 with n = na nb / (na + nb) whatever the difference's shape: a shift of that TV
  is caught at least that often. A shift hidden inside the pooled rare outcomes is invisible.

Against the target (`exact_tests`): each token of the draws that began with the likeliest ones is
tested for fit to the target's own p after them (`fit`).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch

from ..core.exactness import MIN_EXPECTED, chi_square, pooled, survival

ALPHA = 0.01  # the verdict's level, over all the tests together
POWER = 0.8  # the probability at which the smallest detectable difference is stated
# Fewer draws each way than this are too few to judge, here and in the app's check: with 5 expected
# draws a bin, 20 allow a few bins and some power, where 9 passed almost any two samplers.
MIN_DRAWS = 20


def joint(samples, depth: int) -> Counter:
    """How often each run of the first `depth` tokens came up (a shorter completion counts as itself)."""
    return Counter(tuple(s[:depth]) for s in samples)


def position(samples, i: int) -> Counter:
    """How often each token came up at position i, among completions that reached it."""
    return Counter(s[i] for s in samples if len(s) > i)


def total_variation(a: Counter, b: Counter) -> float:
    """Half the L1 distance between the two samples' frequencies over the test's pooled bins."""
    na, nb = sum(a.values()), sum(b.values())
    if not na or not nb:
        return 0.0
    return 0.5 * sum(abs(x / na - y / nb) for _, x, y in pooled(a, b))


def _redrawn_tvs(a: Counter, b: Counter, null: bool, rounds: int, seed: int) -> list[float]:
    """Sorted TVs of `rounds` pairs of samples the sizes of a and b, over the test's bins, drawn
    from each sample's own frequencies (null=False) or both from the two pooled (null=True)."""
    bins = pooled(a, b)
    na, nb = sum(a.values()), sum(b.values())
    g = torch.Generator().manual_seed(seed)
    counts = torch.tensor([[x, y] for _, x, y in bins], dtype=torch.float64)
    wa, wb = (counts.sum(1), counts.sum(1)) if null else (counts[:, 0], counts[:, 1])
    tvs = []
    for _ in range(rounds):
        ra = torch.bincount(torch.multinomial(wa, na, True, generator=g), minlength=len(bins)) / na
        rb = torch.bincount(torch.multinomial(wb, nb, True, generator=g), minlength=len(bins)) / nb
        tvs.append(0.5 * float((ra - rb).abs().sum()))
    return sorted(tvs)


def tv_interval(a: Counter, b: Counter, level: float = 0.95, rounds: int = 1000,
                seed: int = 0) -> tuple[float, float]:
    """A bootstrap interval for `total_variation`: both samples redrawn from their own frequencies
    over the bins the test used, with a seeded generator (the same answer every time).

    The lower end is the basic (reversed percentile) one, clipped at 0: the plug-in estimate sits
    above the truth and its redraws sit above it again by about as much, so the plain percentiles
    would never reach 0. The upper end is the plain percentile (or the reversed one, if higher),
    where that bias errs on the safe side: reversed alone, it fell below the estimate itself near
    0 (to 0.000-0.000 when the redraws all sat above an estimate of 0.003), claiming a precision
    no sample of this size has."""
    if not a or not b or len(pooled(a, b)) < 2:
        return 0.0, 0.0
    tv, tvs = total_variation(a, b), _redrawn_tvs(a, b, False, rounds, seed)
    lo, hi = tvs[int((1 - level) / 2 * (rounds - 1))], tvs[int((1 + level) / 2 * (rounds - 1))]
    return max(0.0, 2 * tv - hi), max(hi, 2 * tv - lo)


def tv_floor(a: Counter, b: Counter, rounds: int = 1000, seed: int = 0) -> float:
    """The median `total_variation` between two samples of these sizes from one distribution (the
    two samples pooled): the plug-in estimate's value when nothing differs, at this sample size."""
    if not a or not b or len(pooled(a, b)) < 2:
        return 0.0
    return _redrawn_tvs(a, b, True, rounds, seed)[rounds // 2]


def noncentral_survival(x: float, dof: int, nc: float) -> float:
    """P(X >= x) for X ~ non-central chi-square(dof, nc): a Poisson(nc / 2) mixture of central ones."""
    half = nc / 2
    if half == 0:
        return survival(x, dof)
    top = int(half + 12 * math.sqrt(half) + 40)
    total = 0.0
    for j in range(top):
        weight = math.exp(-half + j * math.log(half) - math.lgamma(j + 1))
        total += weight * survival(x, dof + 2 * j)
    return min(1.0, total)


def critical_value(dof: int, alpha: float) -> float:
    """The chi-square(dof) statistic whose tail is alpha (bisection on the survival function)."""
    lo, hi = 0.0, float(dof)
    while survival(hi, dof) > alpha:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if survival(mid, dof) > alpha else (lo, mid)
    return hi


def detectable_tv(na: int, nb: int, dof: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest total variation (over the test's bins) that a chi-square on `dof` degrees of
    freedom at level alpha catches with probability `power`, with na and nb draws (module doc)."""
    if not na or not nb or dof < 1:
        return 1.0
    c = critical_value(dof, alpha)
    lo, hi = 0.0, 1.0
    while noncentral_survival(c, dof, hi) < power:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if noncentral_survival(c, dof, mid) < power else (lo, mid)
    n = na * nb / (na + nb)
    return min(1.0, math.sqrt(hi / (4 * n)))


@dataclass(frozen=True)
class Test:
    what: str  # "first 3 tokens together", "token 2"
    statistic: float
    dof: int
    p: float

    def to_dict(self) -> dict:
        return {"what": self.what, "chi_square": self.statistic, "dof": self.dof, "p": self.p}


@dataclass(frozen=True)
class Comparison:
    """Two samples compared: the tests, the verdict's p, the TV and what the test could see."""
    draws: tuple[int, int]  # completions each way (speculative, plain)
    depth: int
    tests: tuple[Test, ...]  # the joint first, then each position
    p: float  # the smallest p times the number of tests run (Bonferroni), at most 1
    tv: float
    tv_low: float
    tv_high: float
    tv_floor: float  # the TV two samples of one distribution show at these sizes (tv_floor())
    detectable: float  # the smallest TV the joint test catches with probability POWER at ALPHA / tests
    alpha: float = ALPHA

    @property
    def different(self) -> bool:
        return self.p < self.alpha

    def to_dict(self) -> dict:
        return {"draws": list(self.draws), "depth": self.depth, "tests": [t.to_dict() for t in self.tests],
                "p": self.p, "alpha": self.alpha, "tv": self.tv, "tv_interval": [self.tv_low, self.tv_high],
                "tv_floor": self.tv_floor,
                "detectable_tv": self.detectable, "power": POWER}


def compare(spec, base, depth: int = 3, alpha: float = ALPHA) -> Comparison:
    """Test the two samples (sequences of tokens, one per completion) for one distribution."""
    a, b = joint(spec, depth), joint(base, depth)
    tests = [Test(f"first {depth} tokens together", *chi_square(a, b))]
    for i in range(depth):
        tests.append(Test(f"token {i + 1}", *chi_square(position(spec, i), position(base, i))))
    run = [t for t in tests if t.dof]  # a test with one bin tests nothing
    p = min(1.0, len(run) * min(t.p for t in run)) if run else 1.0
    lo, hi = tv_interval(a, b)
    detectable = detectable_tv(len(spec), len(base), tests[0].dof, alpha / max(1, len(run)))
    return Comparison((len(spec), len(base)), depth, tuple(tests), p, total_variation(a, b), lo, hi,
                      tv_floor(a, b), detectable, alpha)


def fit(counts: Counter, p: torch.Tensor, min_expected: float = MIN_EXPECTED) -> tuple[float, int, float]:
    """(statistic, dof, p-value) of the chi-square test that `counts` came from p: a cell per token expecting
    min_expected draws, one for the rest (into the least of those if it expects fewer; one cell: p = 1)."""
    n = sum(counts.values())
    expected = p.double().cpu() * n
    big = torch.argsort(expected, descending=True)[:int((expected >= min_expected).sum())].tolist()
    observed, wanted = [counts.get(t, 0) for t in big], expected[big].tolist()
    rest = n - sum(observed), n - sum(wanted)
    if rest[1] < min_expected and len(big) > 1:
        observed[-1], wanted[-1] = observed[-1] + rest[0], wanted[-1] + rest[1]
    else:
        observed, wanted = observed + [rest[0]], wanted + [rest[1]]
    if len(observed) < 2:
        return 0.0, 0, 1.0
    stat = sum((o - w) ** 2 / max(w, 1e-12) for o, w in zip(observed, wanted))  # a rest of ~0 drawn: p ~ 0
    return stat, len(observed) - 1, survival(stat, len(observed) - 1)


def exact_tests(samples, p_after, depth: int, show=str) -> list[tuple[Test, int]]:
    """Token i of the samples that began with the likeliest i tokens, tested against p_after(those tokens),
    the distribution it should follow, for i < depth: (the test, how many samples it counted) each."""
    tests, prefix = [], ()
    for i in range(depth):
        p = p_after(prefix)
        counts = Counter(s[i] for s in samples if len(s) > i and tuple(s[:i]) == prefix)
        given = f" given '{show(prefix)}'" if prefix else ""
        tests.append((Test(f"token {i + 1}{given}", *fit(counts, p)), sum(counts.values())))
        prefix += (int(torch.argmax(p)),)
    return tests
