"""The acceptance rule, checked exactly by enumerating every outcome of a verify step.

A draft token x is proposed with probability q(x) and kept with probability a(x) =
min(1, p(x)/q(x)) (the uniform draw u < a(x)); otherwise the target's token comes from the
distribution verify_sampled returns. Summing over all of that must give back p exactly.
"""
from __future__ import annotations

import itertools

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from specviz.core.sampling import Processor, Sampling, top_p_filter
from specviz.core.verify import acceptance_probability, one_hot_q, residual, verify_greedy, verify_sampled

V = 6
ACCEPT, REJECT = 0.0, 1.0  # draws: u = 0 keeps any token with a > 0; u = 1 rejects every token


def rand_dist(g, v=V, zeros=()):
    w = torch.rand(v, generator=g, dtype=torch.float64) ** 3
    w[list(zeros)] = 0
    return w / w.sum()


def norm(w):
    return w / w.sum()


def emitted_first(p1, q, p2_given):
    """Distribution of the first emitted token of one k=1 step (plus the joint with the bonus)."""
    first = torch.zeros(V, dtype=torch.float64)
    joint = torch.zeros(V, V, dtype=torch.float64)
    for x in range(V):
        if q[x] == 0:
            continue
        p = torch.stack([p1, p2_given[x]])
        draft = torch.tensor([x])
        a = acceptance_probability(p1[x], q[x]).item()
        if a > 0:
            n, dist, _ = verify_sampled(p, q.view(1, -1), draft, torch.tensor([ACCEPT]))
            assert n.item() == 1
            first[x] += q[x] * a
            joint[x] += q[x] * a * norm(dist)  # the bonus token, drawn from p2(. | x)
        if a < 1:
            n, dist, _ = verify_sampled(p, q.view(1, -1), draft, torch.tensor([REJECT]))
            assert n.item() == 0
            r = norm(dist)
            first += q[x] * (1 - a) * r
            # After a correction t, the next step starts afresh from p2(. | t).
            joint += q[x] * (1 - a) * r.view(-1, 1) * p2_given
    return first, joint


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("q_kind", ["random", "one-hot", "misses-p", "p-masked"])
def test_one_step_emits_exactly_p(seed, q_kind):
    g = torch.Generator().manual_seed(seed)
    p1 = rand_dist(g, zeros=[0] if q_kind == "p-masked" else ())
    p2_given = torch.stack([rand_dist(g) for _ in range(V)])
    if q_kind == "random":
        q = rand_dist(g)
    elif q_kind == "one-hot":
        q = one_hot_q(torch.tensor([seed % V]), V)[0].double()
    elif q_kind == "misses-p":  # q is zero where p is not
        q = rand_dist(g, zeros=[1, 2, 3])
    else:
        q = rand_dist(g)
    first, joint = emitted_first(p1, q, p2_given)
    assert torch.allclose(first, p1, atol=1e-6)
    assert torch.allclose(joint, p1.view(-1, 1) * p2_given, atol=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_two_drafts_emit_p_for_the_first_two_tokens(seed):
    """k = 2: every accept/reject pattern, each row of verify_sampled used where it should be."""
    g = torch.Generator().manual_seed(100 + seed)
    p1 = rand_dist(g)
    p2 = torch.stack([rand_dist(g) for _ in range(V)])  # p2[t1]
    p3 = torch.stack([torch.stack([rand_dist(g) for _ in range(V)]) for _ in range(V)])  # p3[t1, t2]
    q1 = rand_dist(g)
    q2 = torch.stack([rand_dist(g, zeros=[seed % V]) for _ in range(V)])  # q2[x1]
    joint = torch.zeros(V, V, dtype=torch.float64)
    for x1, x2 in itertools.product(range(V), repeat=2):
        w = q1[x1] * q2[x1, x2]
        p = torch.stack([p1, p2[x1], p3[x1, x2]])
        q = torch.stack([q1, q2[x1]])
        d = torch.tensor([x1, x2])
        a1 = acceptance_probability(p1[x1], q1[x1]).item()
        a2 = acceptance_probability(p2[x1, x2], q2[x1, x2]).item()
        for (u1, u2), weight, want_n in [
            ((REJECT, REJECT), 1 - a1, 0),
            ((ACCEPT, REJECT), a1 * (1 - a2), 1),
            ((ACCEPT, ACCEPT), a1 * a2, 2),
        ]:
            if weight <= 0:
                continue
            n, dist, a = verify_sampled(p, q, d, torch.tensor([u1, u2], dtype=torch.float64))
            assert n.item() == want_n
            assert torch.allclose(a, torch.tensor([a1, a2], dtype=torch.float64))
            r = norm(dist)
            if want_n == 0:
                joint += w * weight * r.view(-1, 1) * p2
            elif want_n == 1:
                joint[x1] += w * weight * r
            else:
                assert torch.allclose(r, p3[x1, x2])  # the bonus comes from the last row
                joint[x1, x2] += w * weight
    assert torch.allclose(joint, p1.view(-1, 1) * p2, atol=1e-6)


def processed(logits, sampling):
    return Processor(sampling, logits.shape[-1], [], "cpu").probs(logits.view(1, -1))[0].double()


logit_lists = st.lists(
    st.one_of(st.floats(-8, 8), st.just(float("-inf"))), min_size=V, max_size=V
).filter(lambda xs: any(x != float("-inf") for x in xs))


@settings(max_examples=150, deadline=None)
@given(
    lp=logit_lists, lq=logit_lists,
    temperature=st.sampled_from([0.5, 1.0, 1.7]),
    top_k=st.integers(0, V), top_p=st.floats(0.05, 1.0),
    q_top_k=st.integers(0, V),
)
def test_exact_for_any_processed_p_and_q(lp, lq, temperature, top_k, top_p, q_top_k):
    """Masked logits, top-k/top-p truncation, q that misses p's support: still exactly p."""
    p1 = processed(torch.tensor(lp), Sampling(temperature=temperature, top_k=top_k, top_p=top_p))
    q = processed(torch.tensor(lq), Sampling(temperature=temperature, top_k=q_top_k))
    p2_given = torch.full((V, V), 1.0 / V, dtype=torch.float64)
    first, _ = emitted_first(p1, q, p2_given)
    assert torch.allclose(first, p1, atol=1e-6)


def test_residual_falls_back_to_p_when_p_equals_q():
    p = torch.tensor([[0.25, 0.75]])
    assert torch.equal(residual(p, p.clone()), p)


def test_greedy_keeps_drafts_while_they_are_the_argmax():
    target = torch.tensor([5, 7, 1, 4])
    assert [t.item() for t in verify_greedy(target, torch.tensor([5, 7, 2]))] == [2, 1]
    assert [t.item() for t in verify_greedy(target, torch.tensor([5, 7, 1]))] == [3, 4]  # bonus
    assert [t.item() for t in verify_greedy(target, torch.tensor([0, 7, 1]))] == [0, 5]
    assert [t.item() for t in verify_greedy(target[:1], torch.tensor([], dtype=torch.long))] == [0, 5]


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert torch.allclose(top_p_filter(probs, 0.8), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert torch.allclose(top_p_filter(probs, 0.81), torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    assert torch.allclose(top_p_filter(probs, 0.01), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))


def test_repetition_penalty_sees_each_rows_own_prefix():
    """Row r of a verify is penalised for the context plus the first r draft tokens only."""
    s = Sampling(temperature=1.0, repetition_penalty=2.0)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 8, generator=g)
    context, draft = [1], torch.tensor([2, 3])
    together = Processor(s, 8, context, "cpu").probs(logits, draft, start=0)
    for r in range(3):
        alone = Processor(s, 8, context + draft[:r].tolist(), "cpu").probs(logits[r:r + 1])
        assert torch.allclose(together[r], alone[0])
    # and a penalised positive logit is divided, a negative one multiplied
    one = Processor(Sampling(temperature=1.0, repetition_penalty=2.0), 2, [0, 1], "cpu")
    assert torch.allclose(one.probs(torch.tensor([[2.0, -1.0]])), torch.softmax(torch.tensor([[1.0, -2.0]]), -1))
