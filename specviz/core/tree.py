"""Tree drafts: several candidates per position, verified in one target forward.

A tree draft is a list of tokens and, for each, the index of its parent draft token
(-1: it follows the pending token, the root). The target runs the root and every node in
one forward; each node attends to the cached context and to its own ancestors only, at
the position its depth gives it (Medusa, Cai et al. 2024; SpecInfer, Miao et al. 2024).
Greedy acceptance walks down from the root, following the child whose token is the
target's argmax, so the output is the chain plain greedy decoding would produce.

Pure functions on small tensors and lists; engine/verify_step.py runs the forward and moves the
cache's rows.
"""
from __future__ import annotations

import heapq
from typing import Sequence

import torch


def check_parents(parents: Sequence[int]) -> None:
    """Parents must point backwards (topological order), so one pass builds the tree."""
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"tree node {i} has parent {parent}: parents must come before their children")


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node; children of the root have depth 1."""
    out: list[int] = []
    for parent in parents:
        out.append(1 if parent < 0 else out[parent] + 1)
    return out


def tree_mask(parents: Sequence[int], device=None) -> torch.Tensor:
    """(m+1, m+1) bool: row r may attend to column c when c is r itself or an ancestor.

    Row/column 0 is the root (the pending token), node i is row i+1.
    """
    m = len(parents)
    mask = torch.zeros(m + 1, m + 1, dtype=torch.bool)
    mask[:, 0] = True
    for i, parent in enumerate(parents):
        row = i + 1
        if parent >= 0:
            mask[row] = mask[parent + 1]
        mask[row, row] = True
    return mask.to(device) if device is not None else mask


def greedy_walk(tokens: Sequence[int], parents: Sequence[int], argmax: Sequence[int]) -> tuple[list[int], int]:
    """Follow the target's argmax from the root: (accepted node indices, the target's token).

    argmax[r] is the target's choice at row r (row 0 the root, row i+1 node i). The token
    returned is the argmax after the last accepted node: a correction when that node has
    children that all missed, a bonus when it is a leaf.
    """
    children: dict[int, dict[int, int]] = {}
    for i, (tok, parent) in enumerate(zip(tokens, parents)):
        children.setdefault(parent, {}).setdefault(tok, i)  # first (best-ranked) node wins a duplicate
    path: list[int] = []
    node = -1
    while True:
        want = argmax[node + 1]
        nxt = children.get(node, {}).get(want)
        if nxt is None:
            return path, want
        path.append(nxt)
        node = nxt


def best_first(candidates: Sequence[Sequence[tuple[int, float]]], budget: int,
               min_confidence: float = 0.0) -> tuple[list[int], list[int]]:
    """Build a tree of at most `budget` nodes from per-depth candidate lists.

    candidates[d] holds (token, probability) guesses for depth d+1, assumed independent of
    each other (Medusa heads). Nodes are added in order of the product of probabilities
    along their path, so the tree spends its budget where acceptance is most likely; after
    the first node, none whose path probability is below `min_confidence`.
    Returns (tokens, parents) in topological order.
    """
    tokens: list[int] = []
    parents: list[int] = []
    if budget < 1 or not candidates or not candidates[0]:
        return tokens, parents
    # heap entries: (-path probability, tie-break, depth, candidate rank, parent node)
    heap = [(-candidates[0][0][1], 0, 0, 0, -1)]
    tie = 1
    while heap and len(tokens) < budget:
        neg, _, depth, rank, parent = heapq.heappop(heap)
        if tokens and -neg < min_confidence:
            break  # every path left is less likely still
        node = len(tokens)
        tokens.append(candidates[depth][rank][0])
        parents.append(parent)
        prob = -neg
        # the next sibling (same parent, next-ranked candidate) and the first child
        if rank + 1 < len(candidates[depth]):
            parent_prob = prob / max(candidates[depth][rank][1], 1e-30)
            heapq.heappush(heap, (-parent_prob * candidates[depth][rank + 1][1], tie, depth, rank + 1, parent))
            tie += 1
        if depth + 1 < len(candidates) and candidates[depth + 1]:
            heapq.heappush(heap, (-prob * candidates[depth + 1][0][1], tie, depth + 1, 0, node))
            tie += 1
    return tokens, parents
