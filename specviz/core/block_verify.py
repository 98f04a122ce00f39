"""Block verification of a chain draft (Sun et al., "Block Verification Accelerates Speculative
Decoding", ICLR 2025, arXiv 2403.10444, Algorithm 2), as pure tensor functions.

Token-wise verification (core/verify.py) judges each draft token alone and stops at the first
refusal. Block verification judges the block: a later token the target likes more than the
drafter did can make up for an earlier one it liked less. With p the target's rows and q the
drafter's (as in core/verify.py), and the draft d_1..d_k:

    weights   w_0 = 1,  w_i = min(1, w_{i-1} p_i(d_i) / q_i(d_i))       (p_i, q_i: row i - 1)
    residual  r_i(x) = max(w_i p(x | d_1..d_i) - q(x | d_1..d_i), 0),    for i < k
    stop at i h_i = |r_i| / (|r_i| + 1 - w_i)  for i < k,   h_k = w_k
    keep      tau = the largest i with u_i < h_i (0 if none): the backward pass, from the
              block's end towards its start, stops at the first position whose coin passes
    token     drawn from r_tau normalised when tau < k; from p after the whole block (the bonus)
              when tau = k.

With k = 1 this is token-wise verification. The emitted tokens follow p exactly, and the
expected number kept is the largest any rule that sees only these rows can reach, never below
token-wise (the paper's Theorems 1 and 2; tests/test_block_verify.py proves the law by
enumeration). A deterministic draft (prompt lookup) has q one-hot, as in core/verify.py.

Same inputs as verify_sampled, one uniform per draft token: the same draws replay a step under
either rule. Nothing here synchronises with the device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class BlockSample:
    """One block verification, as device tensors (k draft tokens)."""

    accepted: torch.Tensor  # 0-dim long: tau, how many leading draft tokens are kept
    dist: torch.Tensor  # (V,) unnormalised: the target's own token is drawn from it
    weight: torch.Tensor  # (k + 1,) w_0 .. w_k
    residual_mass: torch.Tensor  # (k,) |r_0| .. |r_{k-1}|
    stop_prob: torch.Tensor  # (k,) h_1 .. h_k: the chance the backward pass stops at i, once it got there


def block_weights(p_d: torch.Tensor, q_d: torch.Tensor) -> torch.Tensor:
    """w_0 .. w_k from each draft token's p and q: w_i = min(1, w_{i-1} p_i / q_i).

    The clamped product in closed form: w_i = min over j <= i of the product of the ratios
    j+1..i, so with S the running sum of log ratios (S_0 = 0), log w_i = S_i - max_{j<=i} S_j.
    A zero p(d) makes every later weight 0, as the product does."""
    ratio = p_d / q_d
    s = torch.cat([ratio.new_zeros(1), torch.cumsum(torch.log(ratio), 0)])
    return torch.exp(s - torch.cummax(s, 0).values).clamp(max=1.0)


def verify_block(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, draws: torch.Tensor) -> BlockSample:
    """Block verification of one chain draft.

    p: (k+1, V) target probabilities; q: (k, V) drafter probabilities; draft: (k,) ids;
    draws: (k,) uniforms in [0, 1), u_i judging whether the backward pass stops at i."""
    k = draft.numel()
    idx = torch.arange(k, device=draft.device)
    w = block_weights(p[idx, draft], q[idx, draft])
    r = torch.clamp(w[:k, None] * p[:k] - q, min=0.0)  # r_i for i = 0 .. k-1
    mass = r.sum(-1)
    # h_i for i = 1 .. k-1 from r_i; 0 where r_i is empty (stopping there would leave nothing to draw)
    den = mass[1:] + (1 - w[1:k])
    h = torch.where(mass[1:] > 0, mass[1:] / den.clamp_min(torch.finfo(p.dtype).tiny), 0).clamp(max=1.0)
    h = torch.cat([h, w[k:]])[:k]
    passed = torch.where(draws < h, idx + 1, 0)
    tau = torch.cat([passed, passed.new_zeros(1)]).max()
    # Row i < k: r_i (p itself where r_i is empty: p == q up to rounding); row k: the bonus.
    rows = torch.cat([torch.where(mass[:, None] > 0, r, p[:k]), p[k:]])
    return BlockSample(tau, rows[tau], w, mass, h)


def token_wise_accepted(accept_prob, draws) -> int:
    """How many drafts token-wise verification keeps with these coins: up to the first u >= a."""
    return next((i for i, (a, u) in enumerate(zip(accept_prob, draws)) if not u < a), len(accept_prob))


def block_accepted(stop_prob, draws) -> int:
    """How many drafts block verification keeps with these coins: the last i with u_i < h_i."""
    return max((i + 1 for i, (h, u) in enumerate(zip(stop_prob, draws)) if u < h), default=0)


def token_wise_expected(accept_prob) -> float:
    """The drafts token-wise keeps on average over the coins, for this draft and these rows:
    draft i is kept when every coin up to it passes, so the mean is sum_i prod_{j <= i} a_j."""
    total, run = 0.0, 1.0
    for a in accept_prob:
        run *= a
        total += run
    return total


def block_expected(stop_prob) -> float:
    """The drafts block verification keeps on average over the coins, for this draft and these
    rows: it keeps at least i unless every backward coin from i on misses, so the mean is
    sum_i (1 - prod_{j >= i} (1 - h_j))."""
    total, miss = 0.0, 1.0
    for h in reversed(stop_prob):
        miss *= 1 - h
        total += 1 - miss
    return total
