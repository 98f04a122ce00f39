"""The acceptance rule of speculative sampling, as pure tensor functions.

Given k drafted tokens d, the drafter's distributions q (k rows) and the target's
distributions p (k + 1 rows: one per draft position plus the bonus position), keep
d_i while u_i < min(1, p_i(d_i) / q_i(d_i)); at the first rejection draw the target's
token from norm(max(p_i - q_i, 0)); if all k are kept, draw a bonus token from p_k.
The emitted tokens then follow p exactly (Leviathan et al. 2023, Chen et al. 2023).

A deterministic drafter (prompt lookup) has q = one-hot(d): accept with probability
p(d), and on rejection the residual is p with d removed.

Nothing here synchronises with the device: the number accepted stays a tensor.
"""
from __future__ import annotations

import torch


def one_hot_q(draft: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """q for a drafter that proposes tokens without a distribution."""
    q = torch.zeros(draft.numel(), vocab_size, device=draft.device)
    return q.scatter_(1, draft.view(-1, 1), 1.0)


def acceptance_probability(p_d: torch.Tensor, q_d: torch.Tensor) -> torch.Tensor:
    """min(1, p/q) per draft token. q_d > 0 always: the drafter sampled d from q."""
    return torch.clamp(p_d / q_d, max=1.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Unnormalised max(p - q, 0) per row; falls back to p where it is all zero.

    All-zero only happens when p == q up to rounding, where a rejection has probability
    ~0; sampling from p then is the right limit and avoids dividing by zero.
    """
    r = torch.clamp(p - q, min=0.0)
    empty = r.sum(dim=-1, keepdim=True) <= 0
    return torch.where(empty, p, r)


def accepted_length(accept: torch.Tensor) -> torch.Tensor:
    """Number of leading True values (0-dim long tensor)."""
    return torch.cumprod(accept.long(), dim=0).sum()


def verify_sampled(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, draws: torch.Tensor):
    """Rejection sampling over one draft.

    p: (k+1, V) target probabilities; q: (k, V) drafter probabilities; draft: (k,) ids;
    draws: (k,) uniforms in [0, 1). Returns (n, dist, a): n accepted (0-dim tensor), the
    (unnormalised) distribution the target's own token must be drawn from, and the
    acceptance probabilities a (k,).
    """
    k = draft.numel()
    idx = torch.arange(k, device=draft.device)
    a = acceptance_probability(p[idx, draft], q[idx, draft])
    n = accepted_length(draws < a)
    # Row i < k: resample after rejecting d_i; row k: the bonus. Pick row n without a sync.
    rows = torch.cat([residual(p[:k], q), p[k:]], dim=0)
    return n, rows[n], a


def verify_greedy(target_tokens: torch.Tensor, draft: torch.Tensor):
    """Greedy verification: keep drafts while they equal the target's argmax.

    target_tokens: (k+1,) argmax of each target row. Returns (n, token).
    """
    k = draft.numel()
    n = accepted_length(draft == target_tokens[:k])
    return n, target_tokens[n]
