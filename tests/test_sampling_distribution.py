"""Speculative sampling has the target's distribution: the whole loop, statistically.

A tiny 4-token model; the exact joint distribution of the first three tokens is computed
by enumerating all 64 continuations through the target; runs with fixed seeds are then
checked against it with a chi-square test (a fixed threshold, fixed seeds: deterministic).
"""
from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from conftest import noisy_copy, tiny_llama
from specviz import DraftModel, GenerationConfig, PromptLookup, Sampling, baseline_generate, collect
from specviz import speculative_generate
from specviz.core.sampling import Processor

# N seeded runs per chi-square check. Its controls fail at this N with room: the old discarding
# confidence stop (test_draft_confidence.py) gets p = 4e-6 against the 1e-3 threshold (6e-5 at 600,
# 0.004 at 500: not caught), a wrong distribution here fails on a third of N.
V, N, PROMPT = 4, 700, [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
SAMPLING = Sampling(temperature=1.3, top_k=3, repetition_penalty=1.2)


@pytest.fixture(scope="module")
def small():
    model = tiny_llama(vocab=V, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.3)  # soften: every continuation has real mass
    return model


@pytest.fixture(scope="module")
def joint(small):
    return exact_joint(small, SAMPLING)


def exact_joint(model, sampling):
    joint = {}
    with torch.inference_mode():
        for seq in itertools.product(range(V), repeat=3):
            prob = 1.0
            for i in range(3):
                ctx = PROMPT + list(seq[:i])
                logits = model(torch.tensor([ctx])).logits[0, -1:]
                prob *= Processor(sampling, V, ctx, "cpu").probs(logits)[0, seq[i]].item()
            joint[seq] = prob
    return joint


def sample_joint(make_run, n: int = N):
    return Counter(tuple(collect(make_run(seed))[1].token_ids) for seed in range(n))


def assert_matches(counts, joint):
    cells = sorted(joint)
    observed = [counts.get(c, 0) for c in cells]
    expected = [joint[c] * sum(counts.values()) for c in cells]
    # Pool the rare cells so the chi-square approximation holds.
    rare = [i for i, e in enumerate(expected) if e < 5]
    obs = [o for i, o in enumerate(observed) if i not in rare] + [sum(observed[i] for i in rare)]
    exp = [e for i, e in enumerate(expected) if i not in rare] + [sum(expected[i] for i in rare)]
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    total = sum(obs)
    exp = [e * total / sum(exp) for e in exp]
    assert chisquare(obs, exp).pvalue > 1e-3


@pytest.mark.slow  # thousands of sampled runs for a chi-square test
@pytest.mark.parametrize("drafter", ["pld", "draft-model", "baseline"])
def test_first_three_tokens_follow_the_target(small, joint, drafter):
    assert abs(sum(joint.values()) - 1) < 1e-5
    other = noisy_copy(small, 0.5, seed=11)

    def run(seed):
        # token-wise: the block (the default) has its own chi-square in test_block_verify.py
        cfg = GenerationConfig(max_new_tokens=3, k=3, verification="token",
                               sampling=Sampling(**{**SAMPLING.__dict__, "seed": seed}))
        if drafter == "baseline":
            return baseline_generate(small, PROMPT, cfg)
        return speculative_generate(small, PromptLookup() if drafter == "pld" else DraftModel(other), PROMPT, cfg)

    assert_matches(sample_joint(run), joint)


@pytest.mark.slow
def test_the_check_can_tell_a_wrong_distribution(small, joint):
    """The same test rejects the drafter's own distribution: it has the power to fail, on a third
    of the draws the tests above take (its power only grows with more)."""
    other = noisy_copy(small, 0.5, seed=11)
    wrong = sample_joint(lambda seed: baseline_generate(
        other, PROMPT, GenerationConfig(max_new_tokens=3, sampling=Sampling(**{**SAMPLING.__dict__, "seed": seed}))),
        N // 3)
    with pytest.raises(AssertionError):
        assert_matches(wrong, joint)
