"""Drawn trees: a tree drafter's children drawn from its q without replacement, for sampled runs.

EAGLE and Medusa choose each node's likeliest tokens, which the sibling walk must judge as
one-hot guesses (a child is then kept only with p(x)). Drawn from q, a child is kept with
min(1, p'/q_j), 1 - TV(p, q) for the first, often far more at temperature 1 (core/tree_drawn.py).

The tree grows a depth at a time. Each depth has a quota of nodes (`quotas`: one per depth down
to half the budget, the rest as extra siblings from the top), shared among the previous depth's
likeliest nodes by the value of their j-th child, the node's path probability times the j-th
largest q there. That decides how many children each node gets before any is drawn; then they
are drawn (`gumbel_order`), and nothing drawn is ever cut. That is what keeps the rule exact:
the number of a node's children may depend on anything but those children's own tokens.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..core.tree_drawn import gumbel_order
from .base import Draft

# expand(level, tokens, parents) -> (len(level), vocab) logits after each node of `level` (-1: the root)
Expand = Callable[[list[int], list[int], list[int]], torch.Tensor]


def quotas(budget: int, depth: int, width: int) -> list[int]:
    """Nodes per depth for a tree of `budget` nodes at most `depth` deep: a spine half the budget
    deep, then the rest as extra siblings at the shallowest depths, `width` at most per depth."""
    deep = max(1, min(depth, (budget + 1) // 2))
    out, extra = [1] * deep, budget - deep
    for d in range(deep):
        more = min(extra, width - 1)
        out[d] += more
        extra -= more
    return out


def depth_of(parents: list[int], node: int) -> int:
    """A node's depth (children of the root: 1)."""
    d = 0
    while node >= 0:
        d, node = d + 1, parents[node]
    return d


def branch_probs(processor, logits: torch.Tensor, level: list[int], tokens: list[int], parents: list[int]):
    """The processed q after each node of `level`, each row with its own branch (the repetition
    penalty sees the context and that branch only, as the target's row there does)."""
    if not processor.penalise or not tokens:
        return processor.probs(logits)
    rows = logits.new_zeros(len(tokens) + 1, logits.shape[-1])
    where = torch.tensor([v + 1 for v in level], device=logits.device)
    rows[where] = logits.to(rows.dtype)
    t = torch.tensor(tokens, device=logits.device)
    return processor.probs(rows, t, parents=tuple(parents))[where]


def draw_tree(processor, generator, expand: Expand, budget: int, width: int, depth: int,
              min_confidence: float = 0.0) -> Draft:
    """A tree of up to `budget` nodes whose children are drawn from q without replacement, siblings
    in the order drawn; Draft.q holds, for each node, the q it was drawn from. With `min_confidence`
    a child is given only where its value (above) reaches it, the first node always."""
    tokens: list[int] = []
    parents: list[int] = []
    score: list[float] = []  # each node's path probability under q
    rows: list[torch.Tensor] = []
    plan, level = quotas(budget, depth, width), [-1]
    for d, quota in enumerate(plan):
        q = branch_probs(processor, expand(level, tokens, parents), level, tokens, parents)
        top = q.topk(min(width, q.shape[-1]), -1).values.tolist()
        base = [1.0 if v < 0 else score[v] for v in level]
        slots = sorted((-base[r] * v, r, j) for r in range(len(level)) for j, v in enumerate(top[r]) if v > 0)
        taken = [r for n, (value, r, _) in enumerate(slots[:quota]) if (not tokens and n == 0) or -value >= min_confidence]
        if not taken:
            break
        drawers = sorted(set(taken))
        counts = [taken.count(r) for r in drawers]
        order = gumbel_order(q[drawers], max(counts), generator)
        chance = q[drawers].gather(1, order).tolist()
        new = []
        for i, (r, n) in enumerate(zip(drawers, counts)):
            for j, t in enumerate(order[i, :n].tolist()):
                tokens.append(t)
                parents.append(level[r])
                score.append(base[r] * chance[i][j])
                rows.append(q[r])
                new.append(len(tokens) - 1)
        if d + 1 < len(plan):  # the next depth's quota goes to this depth's likeliest nodes
            level = sorted(new, key=lambda n: -score[n])[:plan[d + 1]]
    device = rows[0].device
    return Draft(torch.tensor(tokens, dtype=torch.long, device=device), torch.stack(rows), tuple(parents))
