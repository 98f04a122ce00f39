"""Block verification is exact, and keeps more than token-wise: proven by enumeration.

What is compared. One chain step drafts d_1..d_k from the drafter's conditionals q, keeps a
prefix of it, and emits the target's own token after it. To compare what steps of different
lengths emit, each outcome is continued by the target itself up to k + 1 tokens, which is what
the next steps do in law (they restart from the emitted context: test_verify.py's argument).
The step is exact when the law of those k + 1 tokens equals the target's joint law. Every draft
of length k over a 3-token vocabulary is enumerated with its probability; for each, every way
the coins can fall is a branch whose probability the rule's own numbers give (token-wise:
accepted with a_i, block: the backward pass stops at i with h_i), and the token drawn at the end
contributes its whole normalised distribution. float64, compared to 1e-12.

Rules known to be wrong, built from the same numbers, give another law on the same cases.
"""
from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
import torch

from specviz.core.block_verify import block_accepted, block_weights, token_wise_accepted, verify_block
from specviz.core.verify import verify_sampled

V = 3
ACCEPT, REJECT = 0.0, 1.0  # a coin u = 0 passes any positive probability, u = 1 none


class Model:
    """A context-dependent model over V tokens: each prefix gets its own random row (cached)."""

    def __init__(self, seed: int, zeros=0, one_hot=False, sharp=3.0):
        self.g = torch.Generator().manual_seed(seed)
        self.rows: dict[tuple, torch.Tensor] = {}
        self.zeros, self.one_hot, self.sharp = zeros, one_hot, sharp

    def __call__(self, prefix: tuple) -> torch.Tensor:
        if prefix not in self.rows:
            w = torch.rand(V, generator=self.g, dtype=torch.float64) ** self.sharp
            if self.one_hot:  # a deterministic drafter (prompt lookup): q is one-hot on its guess
                w = torch.nn.functional.one_hot(w.argmax(), V).double()
            elif self.zeros:  # some tokens impossible under this model
                w[torch.randperm(V, generator=self.g)[: self.zeros]] = 0
            self.rows[prefix] = w / w.sum()
        return self.rows[prefix]


def token_outcomes(p, q, d):
    """(probability, kept, token distribution) of each way token-wise verification can end."""
    k = d.numel()
    _, _, a = verify_sampled(p, q, d, torch.zeros(k, dtype=p.dtype))
    out, reach = [], 1.0
    for n in range(k + 1):
        stop = reach * (1 - a[n].item()) if n < k else reach
        if stop > 0:
            kept, dist, _ = verify_sampled(p, q, d, torch.tensor([ACCEPT] * n + [REJECT] * (k - n), dtype=p.dtype))
            assert kept.item() == n
            out.append((stop, n, dist))
        if n < k:
            reach *= a[n].item()
    return out


def block_stops(h):
    """P(tau = i) for i = 0..k from the stop probabilities: the backward pass from k stops at
    the first i whose coin passes; tau = 0 when none does."""
    k = len(h)
    return [torch.prod(1 - h[i:]).item() if i == 0 else (h[i - 1] * torch.prod(1 - h[i:])).item()
            for i in range(k + 1)]


def block_outcomes(p, q, d, dist_of=None, stops=None):
    k = d.numel()
    s = verify_block(p, q, d, torch.zeros(k, dtype=p.dtype))
    out = []
    for i, prob in enumerate(stops(s) if stops else block_stops(s.stop_prob)):
        if prob > 0:
            coins = [REJECT] * k
            if i:
                coins[i - 1] = ACCEPT
            r = verify_block(p, q, d, torch.tensor(coins, dtype=p.dtype))
            if not stops:
                assert r.accepted.item() == i
            out.append((prob, i, dist_of(s, i, p, q) if dist_of else r.dist))
    return out


def law(target, drafter, k, outcomes):
    """The law of the first k + 1 tokens when one step of the rule runs, then the target."""
    joint: dict[tuple, float] = {}

    def spread(prefix, mass):  # continue with the target to k + 1 tokens
        if len(prefix) == k + 1:
            joint[prefix] = joint.get(prefix, 0.0) + mass
            return
        row = target(prefix)
        for t in range(V):
            if row[t] > 0:
                spread(prefix + (t,), mass * row[t].item())

    for x in itertools.product(range(V), repeat=k):
        qs = [drafter(x[:i]) for i in range(k)]
        w = 1.0
        for i in range(k):
            w *= qs[i][x[i]].item()
        if w == 0:
            continue
        p = torch.stack([target(x[:i]) for i in range(k + 1)])
        q = torch.stack(qs)
        for prob, n, dist in outcomes(p, q, torch.tensor(x)):
            dist = dist / dist.sum()
            for t in range(V):
                if dist[t] > 0:
                    spread(x[:n] + (t,), w * prob * dist[t].item())
    return joint


def target_law(target, k):
    joint = {}
    for s in itertools.product(range(V), repeat=k + 1):
        w = 1.0
        for i in range(k + 1):
            w *= target(s[:i])[s[i]].item()
        if w > 0:
            joint[s] = w
    return joint


def gap(a, b):
    return max(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


CASES = [  # (target kwargs, drafter kwargs): drafters that miss the target's support, one-hot drafts, sharp rows
    (dict(), dict()),
    (dict(zeros=1), dict()),
    (dict(), dict(zeros=1)),
    (dict(), dict(one_hot=True)),
    (dict(sharp=0.5), dict(sharp=6.0)),
]


@pytest.mark.parametrize("case, k", [(c, k) for c in range(len(CASES)) for k in (1, 2, 3)] + [(0, 4)])
@pytest.mark.parametrize("rule", ["token", "block"])
def test_one_step_emits_the_targets_law(rule, case, k):
    for seed in range(2):
        target, drafter = Model(10 * seed + case, **CASES[case][0]), Model(100 + 10 * seed + case, **CASES[case][1])
        outcomes = token_outcomes if rule == "token" else block_outcomes
        assert gap(law(target, drafter, k, outcomes), target_law(target, k)) < 1e-12


WRONG = {
    # the bonus or residual drawn from the target's row itself: the mass the draft already took counts twice
    "residual is p": dict(dist_of=lambda s, i, p, q: p[i]),
    # token-wise's residual max(p - q, 0) without the weight w_i
    "unweighted residual": dict(dist_of=lambda s, i, p, q: torch.clamp(p[i] - q[i], min=0) if i < len(q) else p[i]),
    # stop where the weight's coin passes (h_i = w_i everywhere): forgets the residual's share
    "stop with w_i": dict(stops=lambda s: block_stops(s.weight[1:])),
}


@pytest.mark.parametrize("name", WRONG)
def test_known_wrong_variants_fail_the_same_proof(name):
    # k = 3: with k = 2 the unweighted residual happens to give the right law
    target, drafter = Model(3), Model(103)
    wrong = law(target, drafter, 3, lambda p, q, d: block_outcomes(p, q, d, **WRONG[name]))
    assert gap(wrong, target_law(target, 3)) > 1e-4  # the right rule is within 1e-12


def test_token_wise_without_its_residual_fails_too():
    target, drafter = Model(0), Model(100)
    skip = law(target, drafter, 2, lambda p, q, d: [(w, n, p[n]) for w, n, _ in token_outcomes(p, q, d)])
    assert gap(skip, target_law(target, 2)) > 1e-3


def expected_kept(target, drafter, k, outcomes):
    total = 0.0
    for x in itertools.product(range(V), repeat=k):
        w = 1.0
        for i in range(k):
            w *= drafter(x[:i])[x[i]].item()
        if w:
            p = torch.stack([target(x[:i]) for i in range(k + 1)])
            q = torch.stack([drafter(x[:i]) for i in range(k)])
            total += w * sum(prob * n for prob, n, _ in outcomes(p, q, torch.tensor(x)))
    return total


def test_the_papers_motivating_example():
    """Two context-free models over {a, b}: the target 1/3, 2/3, the drafter 2/3, 1/3, k = 2.
    Token-wise keeps 10/9 tokens a step on average, block verification 11/9 (the paper's
    section 2; an ideal verifier that saw the joint law would keep 12/9)."""
    global V
    old, V = V, 2
    try:
        target = lambda prefix: torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)  # noqa: E731
        drafter = lambda prefix: torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)  # noqa: E731
        assert expected_kept(target, drafter, 2, token_outcomes) == pytest.approx(10 / 9, abs=1e-12)
        assert expected_kept(target, drafter, 2, block_outcomes) == pytest.approx(11 / 9, abs=1e-12)
        assert gap(law(target, drafter, 2, block_outcomes), target_law(target, 2)) < 1e-12
    finally:
        V = old
    # the ideal: keep the pair with min(p, q) of the joint law, summed: 12/9
    p, q = {"a": Fraction(1, 3), "b": Fraction(2, 3)}, {"a": Fraction(2, 3), "b": Fraction(1, 3)}
    pairs = [x + y for x in "ab" for y in "ab"]
    kept2 = sum(min(p[s[0]] * p[s[1]], q[s[0]] * q[s[1]]) for s in pairs)
    assert 2 * kept2 + 1 * (sum(min(p[x], q[x]) for x in "ab") - kept2) == Fraction(12, 9)


@pytest.mark.parametrize("seed", range(6))
def test_block_keeps_at_least_as_many_as_token_wise(seed):
    target, drafter = Model(seed, sharp=1.5), Model(50 + seed)
    token = expected_kept(target, drafter, 3, token_outcomes)
    block = expected_kept(target, drafter, 3, block_outcomes)
    assert block >= token - 1e-12
    if seed == 0:
        assert block > token + 1e-3  # and strictly more on a case where they differ


def test_one_token_block_is_token_wise():
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(2, 7, generator=g, dtype=torch.float64), -1)
    q = torch.softmax(torch.randn(1, 7, generator=g, dtype=torch.float64), -1)
    d = torch.tensor([2])
    for u in torch.rand(20, generator=g, dtype=torch.float64):
        n, dist, a = verify_sampled(p, q, d, u.view(1))
        s = verify_block(p, q, d, u.view(1))
        assert s.accepted.item() == n.item() and torch.allclose(s.dist, dist) and torch.allclose(s.stop_prob, a)


def test_the_same_coins_replay_either_rule():
    """The host helpers the inspector uses decide as the device functions do."""
    g = torch.Generator().manual_seed(7)
    for _ in range(50):
        k = int(torch.randint(1, 6, (1,), generator=g))
        p = torch.softmax(2 * torch.randn(k + 1, 9, generator=g, dtype=torch.float64), -1)
        q = torch.softmax(2 * torch.randn(k, 9, generator=g, dtype=torch.float64), -1)
        d = torch.multinomial(q, 1, generator=g)[:, 0]
        u = torch.rand(k, generator=g, dtype=torch.float64)
        n, _, a = verify_sampled(p, q, d, u)
        s = verify_block(p, q, d, u)
        assert token_wise_accepted(a.tolist(), u.tolist()) == n.item()
        assert block_accepted(s.stop_prob.tolist(), u.tolist()) == s.accepted.item()


def test_weights_are_the_clamped_running_product():
    ratios = [0.5, 3.0, 0.2, 10.0, 0.0, 4.0]
    w, want = block_weights(torch.tensor(ratios, dtype=torch.float64), torch.ones(6, dtype=torch.float64)), [1.0]
    for r in ratios:
        want.append(min(1.0, want[-1] * r))
    assert w.tolist() == pytest.approx(want, abs=1e-15)


def test_an_empty_draft_draws_from_the_target():
    p = torch.tensor([[0.2, 0.8]], dtype=torch.float64)
    s = verify_block(p, p.new_zeros(0, 2), torch.zeros(0, dtype=torch.long), p.new_zeros(0))
    assert s.accepted.item() == 0 and s.dist.tolist() == [0.2, 0.8] and s.stop_prob.numel() == 0
