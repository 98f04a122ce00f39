"""The expected-speedup maths of speculative decoding (Leviathan et al. 2023), in one place.

With acceptance rate alpha per draft token (independent), a step that drafts k tokens
yields E = (1 - alpha^(k+1)) / (1 - alpha) tokens. If a draft token costs c target decode
steps and verifying k + 1 tokens costs v target decode steps (v = 1 in the paper, where
verification is assumed free of its length), the predicted speedup is E / (c k + v).

Trees and dynamic k break the formula's one k: a tree's step verifies all its nodes and keeps a
branch, and dynamic k drafts a different length each step. For them the same ratio is taken
step by step (`predicted_from_steps`): tokens per step from the measured depth each step's kept
path reached, over the measured drafting cost plus each step's own verify cost.
"""
from __future__ import annotations


def expected_tokens(alpha: float, k: float) -> float:
    """E[tokens per step]: 1 + alpha + ... + alpha^k."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: float, c: float, v: float = 1.0) -> float:
    """E[tokens per step] / (c k + v), in units of plain decoding's tokens per second."""
    return expected_tokens(alpha, k) / (c * k + v)


def predicted_from_steps(accepted: list[int], draft_cost: float, verify_costs: list[float]) -> float:
    """E[tokens per step] / E[cost per step] over measured steps: accepted[i] drafts kept at step i
    (1 + mean: the fraction of steps whose kept path reached each depth, summed, plus the target's
    own token), draft_cost the mean drafting cost of a step and verify_costs[i] the cost of step i's
    verify pass, both in target decode steps."""
    if not accepted:
        return 0.0
    tokens = 1.0 + sum(accepted) / len(accepted)
    return tokens / (draft_cost + sum(verify_costs) / len(verify_costs))
