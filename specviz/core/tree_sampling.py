"""Sampled verification of a tree whose children were chosen, not drawn.

EAGLE and Medusa expand a tree node with the drafter's likeliest tokens: nothing is drawn,
so there is no q to divide by. Each child is a deterministic guess (q one-hot on it, as
prompt lookup's draft is), and this is the one-hot case of SpecInfer's multi-step
speculative sampling (Miao et al. 2024; EAGLE's and SGLang's tree sampling):

    at a node, p' starts as the target's processed distribution there;
    try the children in order: accept child x when u < p'(x);
    on a rejection set p'(x) = 0, renormalise, and try the next child;
    if every child is rejected, the target's token is drawn from the final p' (a correction);
    if x is accepted, descend into x and repeat; at a leaf the token is drawn from the
    target's row there (the bonus).

Why it is exact: with L_j the mass of p its earlier siblings leave, child j is accepted with
probability L_j * p(x_j) / L_j = p(x_j) (the rejections before it telescope to L_j), and the
correction takes every token t that no child holds with probability L_end * p(t) / L_end =
p(t). So the token taken at each node has law p: the step is "draw t from p, descend while a
child holds t", which is why the children's order changes which coins are looked at but never
the law. A repeated sibling (the token of an earlier child) has p'(x) = 0 once that child was
rejected, so its mass never counts twice and only the first of equal siblings can be kept.

Why no other exact rule keeps more from such a tree (traversal verification, multi-path block
verification included): the kept nodes are a branch whose tokens begin the step's output, and an
exact step's output is the target's own text, so no exact rule keeps a node more often than the
target writes its branch, p(x_1) p(x_2 | x_1) ... along it. The walk keeps every node exactly that
often (`keep_chances`), so its mean accepted length is the most any exact rule reaches with these
nodes. Those rules gain where children are drawn from q (core/tree_drawn.py judges such trees);
here they were chosen.

Everything is computed for every node at once, on the device, from one uniform per node (a
node the walk never reaches has its p'(x) and coin computed all the same and ignored).
Nothing here synchronises with the host; `walk_order` reads the result once it is there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .tree import depths


@dataclass(frozen=True)
class TreeSample:
    """One sampled tree verification, as device tensors (m nodes; rows as in core/tree.py)."""

    on_path: torch.Tensor  # (m,) bool: the accepted nodes, a branch from the root
    row: torch.Tensor  # 0-dim long: where the walk stopped (0: the root, i + 1: node i)
    dist: torch.Tensor  # (V,) the final p' there, unnormalised: the token is drawn from it
    tried: torch.Tensor  # (m,) bool: nodes the walk judged (the path and the siblings rejected before each)
    accept_prob: torch.Tensor  # (m,) p'(x) of each node's token when its turn came (0 for a repeated sibling)
    residual_mass: torch.Tensor  # (m,) mass of p left once the node is rejected: p' after it is p with it
    #                              and its earlier siblings zeroed, divided by this (a drawn tree: the mass
    #                              of max(p' - q_j, 0), core/tree_drawn.py)
    q_x: torch.Tensor | None = None  # (m,) a drawn tree's q_j(x): the q it was judged against (None: chosen)


def sibling_table(parents: Sequence[int]) -> tuple[list[int], list[list[int]]]:
    """The rows that have children (0: the root, i + 1: node i) and each one's children in
    order, padded with -1 to the widest: the shape the siblings' sums are taken in."""
    kids: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        kids.setdefault(parent + 1, []).append(i)
    rows = sorted(kids)
    width = max((len(k) for k in kids.values()), default=0)
    return rows, [kids[r] + [-1] * (width - len(kids[r])) for r in rows]


@dataclass(frozen=True)
class Shape:
    """A tree's sibling table on the device (R rows with children, K the widest): what both sampled
    tree rules walk (this module's and core/tree_drawn.py's)."""

    m: int
    rows: torch.Tensor  # (R,) the rows with children (0: the root, i + 1: node i)
    kids: torch.Tensor  # (R, K) each row's children in order, -1 past its last
    valid: torch.Tensor  # (R, K) bool: kids >= 0
    node: torch.Tensor  # (R, K) kids with the padding at 0 (for indexing)
    up: torch.Tensor  # (m + 1,) each node's parent slot (slot m: the root)
    depth: torch.Tensor  # (m,)
    row_of: torch.Tensor  # (m + 1,) each row's index among `rows` (-1: a leaf's row)
    deepest: int


def shape_of(parents: Sequence[int], device) -> Shape:
    """The tree's shape in one host-to-device copy."""
    m = len(parents)
    rows, table = sibling_table(parents)
    R, K = len(rows), len(table[0])
    row_of = [-1] * (m + 1)
    for r, row in enumerate(rows):
        row_of[row] = r
    deep = depths(parents)
    shape = torch.tensor(rows + [i for kids in table for i in kids] + [m if q < 0 else q for q in parents] + [m]
                         + deep + row_of, dtype=torch.long, device=device)
    rows_t, kids, up, depth, row_of_t = shape.split([R, R * K, m + 1, m, m + 1])
    kids = kids.view(R, K)
    return Shape(m, rows_t, kids, kids >= 0, kids.clamp_min(0), up, depth, row_of_t, max(deep))


def walk(shape: Shape, accept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(on_path, row, tried) from each child's verdict had its turn come (accept: (R, K) bool):
    at each row the first accepted child wins, and a node is on the path when it and every
    ancestor won; the walk stops at the deepest node on it (row 0: the root)."""
    m, dev, kids, valid = shape.m, shape.kids.device, shape.kids, shape.valid
    accept = accept & valid
    won_any = accept.any(1)
    first = accept.int().argmax(1)  # the first accepted child of each row (argmax: the first maximum)
    # Pointer jumping over the parents: log2(depth) steps; slot m is the root, always on the path.
    ok = torch.zeros(m + 1, dtype=torch.bool, device=dev)
    ok[torch.where(won_any, kids.gather(1, first[:, None])[:, 0], m)] = True
    ok[m] = True
    up = shape.up
    for _ in range(shape.deepest.bit_length()):
        ok = ok & ok[up]
        up = up[up]
    on_path = ok[:m]
    last = torch.where(on_path, shape.depth, 0).argmax()
    row = torch.where(on_path.any(), last + 1, 0)
    reached = torch.cat([torch.ones(1, dtype=torch.bool, device=dev), on_path])[shape.rows]
    col = torch.arange(kids.shape[1], device=dev)
    tried = valid & reached[:, None] & (~won_any[:, None] | (col[None, :] <= first[:, None]))
    return on_path, row, per_node(shape, tried)


def per_node(shape: Shape, t: torch.Tensor) -> torch.Tensor:
    """(R, K) values by child slot -> (m,) by node."""
    slot = torch.where(shape.valid, shape.kids, shape.m).view(-1)  # slot m: the padding, dropped
    return torch.zeros(shape.m + 1, dtype=t.dtype, device=t.device).scatter_(0, slot, t.reshape(-1))[:shape.m]


def sample_tree(tokens: torch.Tensor, parents: Sequence[int], p: torch.Tensor, draws: torch.Tensor) -> TreeSample:
    """The sibling walk for every node at once.

    tokens: (m,) ids; parents: as core/tree.py's; p: (m + 1, V) processed target
    probabilities (row 0 after the root, row i + 1 after node i, each with its own branch);
    draws: (m,) uniforms in [0, 1), one per node (its coin, used if the walk reaches it)."""
    m, dev = len(parents), p.device
    if m == 0:
        nothing = torch.zeros(0, dtype=p.dtype, device=dev)
        return TreeSample(nothing.bool(), torch.zeros((), dtype=torch.long, device=dev), p[0], nothing.bool(),
                          nothing, nothing)
    sh = shape_of(parents, dev)
    valid = sh.valid
    x = tokens[sh.node]  # (R, K) each child's token
    px = torch.where(valid, p[sh.rows[:, None], x], 0)  # its probability at its parent's row
    # A child repeating an earlier sibling's token: that sibling's rejection zeroed it already.
    key, order = torch.sort(torch.where(valid, x, -1), dim=1, stable=True)
    again = torch.cat([torch.zeros_like(key[:, :1], dtype=torch.bool), key[:, 1:] == key[:, :-1]], 1)
    repeat = torch.zeros_like(valid).scatter(1, order, again)
    w = torch.where(repeat, 0, px)
    # p'(x) = p(x) over the mass the earlier siblings' rejections leave.
    left = 1 - (torch.cumsum(w, 1) - w)
    a = (w / left.clamp_min(torch.finfo(p.dtype).tiny)).clamp(max=1.0)
    on_path, row, tried = walk(sh, draws[sh.node] < a)

    # The token's distribution: the stopping row with every child's token zeroed (they were all
    # rejected; none at a leaf). p itself if that leaves nothing (a rejection of probability ~0).
    here = sh.row_of[row]
    mine = valid[here.clamp_min(0)] & (here >= 0)
    held = torch.zeros(p.shape[-1], dtype=p.dtype, device=dev).index_add_(0, x[here.clamp_min(0)], mine.to(p.dtype))
    dist = torch.where(held > 0, 0, p[row])
    dist = torch.where(dist.sum() > 0, dist, p[row])
    return TreeSample(on_path, row, dist, tried, per_node(sh, a), per_node(sh, (left - w).clamp_min(0)))


def walk_order(parents: Sequence[int], on_path: Sequence[float], tried: Sequence[float]) -> tuple[list[int], list[int]]:
    """(path, walk) from host copies of a TreeSample's on_path and tried: the accepted nodes
    root to leaf, and every judged node in the order the walk judged it (depth by depth,
    siblings in order; each depth's last is its accepted one, if any)."""
    deep = depths(parents)
    path = sorted((i for i, v in enumerate(on_path) if v), key=lambda i: deep[i])
    walk = sorted((i for i, v in enumerate(tried) if v), key=lambda i: (deep[i], i))
    return path, walk


def keep_chances(tokens: Sequence[int], parents: Sequence[int], p: Sequence[float]) -> list[float]:
    """How often the sibling walk keeps each node, over its coins: the target's probability of the
    node's branch, the product of p(x) (TreeDraft.p: each node's token at its parent's row) from the
    root down; 0 for a node repeating an earlier sibling's token, and for everything below it. No
    exact rule keeps a node more often, so the sum is the most any exact rule keeps on average
    from this tree (the module docstring says why)."""
    chance: list[float] = []
    seen: dict[int, set[int]] = {}
    for x, parent, px in zip(tokens, parents, p):
        above = 1.0 if parent < 0 else chance[parent]
        repeat = x in seen.setdefault(parent, set())
        seen[parent].add(x)
        chance.append(0.0 if repeat else above * px)
    return chance
