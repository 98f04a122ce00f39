"""Sampled verification of a tree whose children were drawn from q: recursive rejection
sampling without replacement (Jeon et al. 2024, arXiv 2402.14160).

A drawn tree's children at a node are draws from the drafter's q there, without
replacement (Gumbel-top-n: `gumbel_order`), in the order they were drawn. The rule at a node:

    p' starts as the target's processed distribution there;
    child j was drawn from q_j, q with the earlier siblings' tokens removed and renormalised;
    accept child j with min(1, p'(x_j) / q_j(x_j));
    on a refusal p' <- max(p' - q_j, 0), renormalised, and try the next child;
    if every child is refused, the target's token is drawn from the final p' (a correction);
    if child j is accepted, descend into it and repeat; at a leaf the token is drawn from the
    target's row there (the bonus).

Why it is exact. Claim: from child j on, the node's output has law p'_j, whatever q the later
children are drawn from. After the last child it is the draw from p'. Child j: x is drawn from
q_j and kept with min(1, p'_j/q_j), so x is output this way with min(q_j(x), p'_j(x)); it is
refused with total mass Z = sum_x max(q_j - p'_j, 0) = sum_x max(p'_j - q_j, 0) (both sides sum
to one), and then, by the claim for j + 1, the output has law p'_{j+1} = max(p'_j - q_j, 0) / Z,
which does not depend on which x was refused. In all: min(q_j, p'_j) + max(p'_j - q_j, 0) = p'_j.
At j = 1 that is p: the node emits the target's token, and below the accepted child the same
holds with that child's rows. A refused x_j has p'_j(x_j) < q_j(x_j) (else it is kept for
sure), so p'_{j+1}(x_j) = 0 and the correction never repeats a refused child.

It needs the draws to be what the rule divides by: q_j is q without the earlier siblings,
renormalised (dividing by q itself is SpecInfer's with-replacement rule, which is exact only for
children drawn with replacement), and the number of children at a node may depend on anything
but those children's own tokens (the drafters decide it before drawing them). Children chosen
as the likeliest tokens are not draws: core/tree_sampling.py's sibling walk judges those.

Everything is computed for every row at once on the device, one pass per sibling rank, from
one uniform per node, as core/tree_sampling.py computes its walk.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .tree_sampling import TreeSample, per_node, shape_of, walk


def gumbel_order(q: torch.Tensor, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """(R, n) tokens drawn from each row of q (R, V) without replacement, in draw order:
    the n largest of log q + Gumbel noise (Gumbel-top-k; the first is a draw from q, the second
    a draw from q without the first, renormalised, and so on). A row with fewer than n tokens of
    positive q gives tokens of q = 0 past them: the caller takes no more than a row's support."""
    u = torch.rand(q.shape, generator=generator, device=q.device, dtype=torch.float64)
    tiny = torch.finfo(torch.float64).tiny
    noise = -torch.log(-torch.log(u.clamp(tiny, 1 - 1e-16)))
    return torch.topk(torch.log(q.double()) + noise, min(n, q.shape[-1]), dim=-1).indices


def residuals(tokens: torch.Tensor, parents: Sequence[int], p: torch.Tensor, q: torch.Tensor):
    """The rule's numbers for every node, as if its turn came: (shape, a, q_x, mass, final).

    a (R, K): min(1, p'(x_j) / q_j(x_j)); q_x: q_j(x_j); mass: the mass of max(p' - q_j, 0) (a
    refusal's chance given the turn; p' after it is that divided by this); final (R, V): p' once
    every child of the row was refused. q: (m, V), node i's row the q it was drawn from (its
    parent's; siblings share it)."""
    sh = shape_of(parents, p.device)
    valid, node = sh.valid, sh.node
    x = tokens[node]  # (R, K)
    qr = q[node[:, 0]]  # each row's q (its first child's row)
    pr = p[sh.rows]  # p', one per row
    removed = torch.zeros_like(qr)  # the earlier siblings' q, taken out of q_j
    a, q_x, mass = (torch.zeros(x.shape, dtype=p.dtype, device=p.device) for _ in range(3))
    for j in range(x.shape[1]):
        rest = qr - removed
        qj = rest / rest.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
        xj = x[:, j:j + 1]
        qx, px = qj.gather(1, xj)[:, 0], pr.gather(1, xj)[:, 0]
        a[:, j] = torch.where(qx > 0, px / qx.clamp_min(torch.finfo(p.dtype).tiny), 1.0).clamp(max=1.0)
        q_x[:, j] = qx
        r = (pr - qj).clamp_min(0)
        z = r.sum(-1)
        mass[:, j] = z
        on = valid[:, j]
        # An empty residual (p' = q_j: a refusal of probability 0) leaves p' as it was.
        pr = torch.where((on & (z > 0))[:, None], r / z.clamp_min(torch.finfo(p.dtype).tiny)[:, None], pr)
        removed = removed + torch.zeros_like(qr).scatter(1, xj, qr.gather(1, xj) * on[:, None])
    return sh, a, q_x, mass, pr


def keep_chances(parents: Sequence[int], accept: Sequence[float]) -> list[float]:
    """How often the rule keeps each node of this drawn tree, over its coins: the chance its parent
    is kept, times the chance every earlier sibling is refused, times its own min(1, p'/q_j)
    (`accept`, every node's, as sample_drawn_tree computes them). Their sum is the step's mean
    accepted length given the tree: the mean over the coins, without their noise."""
    chance: list[float] = []
    refused: dict[int, float] = {}
    for i, parent in enumerate(parents):
        above = 1.0 if parent < 0 else chance[parent]
        reach = refused.get(parent, 1.0)
        chance.append(above * reach * accept[i])
        refused[parent] = reach * (1 - accept[i])
    return chance


def sample_drawn_tree(tokens: torch.Tensor, parents: Sequence[int], p: torch.Tensor, q: torch.Tensor,
                      draws: torch.Tensor) -> TreeSample:
    """Recursive rejection sampling of a drawn tree, every node at once.

    tokens: (m,) ids, siblings in the order drawn; parents: as core/tree.py's; p: (m + 1, V)
    processed target probabilities (row 0 the root's, i + 1 node i's); q: (m, V) the q each node
    was drawn from; draws: (m,) uniforms, one per node. The TreeSample's accept_prob is each
    node's min(1, p'/q_j), its residual_mass the mass of max(p' - q_j, 0), and q_x each q_j(x_j)."""
    m, dev = len(parents), p.device
    if m == 0:
        nothing = torch.zeros(0, dtype=p.dtype, device=dev)
        return TreeSample(nothing.bool(), torch.zeros((), dtype=torch.long, device=dev), p[0], nothing.bool(),
                          nothing, nothing, nothing)
    sh, a, q_x, mass, final = residuals(tokens, parents, p, q)
    on_path, row, tried = walk(sh, draws[sh.node] < a)
    # The token's distribution: the final p' where every child was refused, p itself at a leaf.
    here = sh.row_of[row]
    dist = torch.where(here >= 0, final[here.clamp_min(0)], p[row])
    return TreeSample(on_path, row, dist, tried, per_node(sh, a), per_node(sh, mass), per_node(sh, q_x))
