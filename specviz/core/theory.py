"""The expected-speedup maths of speculative decoding (Leviathan et al. 2023), in one place.

With acceptance rate alpha per draft token (independent), a step that drafts k tokens
yields E = (1 - alpha^(k+1)) / (1 - alpha) tokens. If a draft token costs c target decode
steps and verifying k + 1 tokens costs v target decode steps (v = 1 in the paper, where
verification is assumed free of its length), the predicted speedup is E / (c k + v).
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
