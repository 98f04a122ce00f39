"""No exact rule keeps more from the engine's trees than the sibling walk: proven by enumeration.

EAGLE's and Medusa's trees are chosen (each node's likeliest tokens), not drawn, so they are
fixed before any coin falls. The tokens an exact step keeps begin its output, and its output is
the target's own text: so no exact rule, traversal verification and multi-path block
verification included, keeps a node more often than the target writes that node's branch,
p(x_1) p(x_2 | x_1) ... (its keep chance). The walk keeps every node exactly that often, every
node at once, so its mean accepted length is the ceiling (core/tree_sampling.py's
keep_chances). Checked here over every tree shape the engine can draft up to 4 nodes, by
enumerating every coin (test_tree_sampling.step_law), float64 to 1e-12. Rules that keep more than
the ceiling on chosen trees (SpecInfer's, recursive rejection sampling, block verification of a
chosen chain, which is what traversal verification does on a chain) emit another law.
"""
from __future__ import annotations

import itertools
import random

import pytest
import torch

from specviz.core.block_verify import verify_block
from specviz.core.tree_sampling import keep_chances
from test_tree_sampling import (V, assert_same_law, branch, grow, implemented, law_gap, recursive_rejection, rows_for,
                                specinfer, step_law, target, target_law)


def shapes(most: int = 4):
    """Every tree of 1 to `most` nodes whose parents come before their children (check_parents'
    order, the one every drafter emits): 1 + 2 + 6 + 24 shapes."""
    for m in range(1, most + 1):
        yield from itertools.product(*(range(-1, i) for i in range(m)))


def token_sets(parents, seed):
    """Siblings on distinct tokens, and tokens drawn from three (repeats among siblings possible)."""
    rank = {}
    distinct = []
    for parent in parents:
        rank[parent] = rank.get(parent, -1) + 1
        distinct.append(rank[parent])
    rng = random.Random(seed)
    return [distinct, [rng.randrange(3) for _ in parents]]


def written(cond, tokens, parents, node) -> float:
    """The target's probability that its text begins with the node's branch, from the target itself."""
    prefix, prob = (), 1.0
    for x in branch(tokens, parents, node):
        prob *= cond(prefix)[x].item()
        prefix += (x,)
    return prob


def node_p(tokens, parents, rows) -> list[float]:
    """What a step records as TreeDraft.p: each node's token at its parent's row."""
    return [rows[parent + 1][x].item() for x, parent in zip(tokens, parents)]


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_the_walk_keeps_each_node_as_often_as_the_target_writes_its_branch(m):
    """Every shape of m nodes, two token sets each: each node's keep chance, enumerated, is the
    target's probability of its branch (0 for a repeated sibling and below it), the bound every
    exact rule obeys, reached at every node at once."""
    cases = 0
    for n, parents in enumerate(p for p in shapes() if len(p) == m):
        for tokens, kind in zip(token_sets(parents, n), ["random", "top-k/top-p"][::1 if n % 2 else -1]):
            rows, cond = rows_for(kind, n, tokens, parents), target(kind, n)
            kept = {}
            law = step_law(implemented, tokens, parents, rows, kept=kept)
            assert_same_law(law, target_law(cond, tokens, parents), 1e-12)
            chance = keep_chances(tokens, parents, node_p(tokens, parents, rows))
            followed = []  # the first of equal siblings, under a node that is itself followed
            for i, (x, parent) in enumerate(zip(tokens, parents)):
                first = x not in [tokens[j] for j in range(i) if parents[j] == parent]
                followed.append(first and (parent < 0 or followed[parent]))
                want = written(cond, tokens, parents, i) if followed[i] else 0.0
                assert kept.get(i, 0.0) == pytest.approx(want, abs=1e-12), (parents, tokens, kind, i)
                assert chance[i] == pytest.approx(want, abs=1e-12), (parents, tokens, kind, i)
            cases += 1
    assert cases == 2 * {1: 1, 2: 2, 3: 6, 4: 24}[m]


def block_on_a_chosen_chain(tokens, parents, rows, coin, q):
    """Block verification of a chain whose tokens are the drafter's top-1, not draws from its q:
    traversal verification on a chain. Its backward coins h, then the residual where it stopped."""
    k = len(tokens)
    d = torch.tensor(tokens)
    h = verify_block(rows, q[:k], d, torch.ones(k, dtype=rows.dtype)).stop_prob
    tau = next((i + 1 for i in reversed(range(k)) if coin(h[i].item())), 0)
    draws = torch.ones(k, dtype=rows.dtype)
    if tau:
        draws[tau - 1] = 0.0
    return list(range(tau)), verify_block(rows, q[:k], d, draws).dist


def _rng(*key: int) -> torch.Generator:
    return torch.Generator().manual_seed(hash(key) % 2**31)  # ints only: str hashes change between processes


def model(seed: int, salt: int):
    """A context-dependent distribution over V tokens (float64), the same in every process."""
    def cond(prefix):
        w = torch.rand(V, generator=_rng(seed, salt, *prefix), dtype=torch.float64) ** 3
        return w / w.sum()
    return cond


def grown(seed: int, width: int, depth: int):
    """A tree grown as EAGLE grows one (each node's `width` likeliest tokens under the drafter's q),
    with the drafter's and the target's rows (row 0 the root's, i + 1 node i's)."""
    q_of, p_of = model(seed, 1), model(seed, 2)
    tokens, parents = grow(q_of, width, depth)
    rows = [branch(tokens, parents, i) for i in range(-1, len(parents))]
    return tokens, parents, torch.stack([q_of(r) for r in rows]), torch.stack([p_of(r) for r in rows]), p_of


@pytest.mark.parametrize("rule, width", [(specinfer, 2), (recursive_rejection, 2), (block_on_a_chosen_chain, 1)],
                         ids=["specinfer", "recursive rejection", "block on a chosen chain"])
def test_rules_that_keep_more_than_the_ceiling_are_not_exact(rule, width):
    """On trees grown as EAGLE grows them (top-`width` of a drafter's q), these rules keep more than
    the walk somewhere, and wherever they do their law is not the target's."""
    gains = []
    for seed in range(6):
        tokens, parents, q, rows, cond = grown(seed, width, 2 if width > 1 else 3)
        ceiling = sum(keep_chances(tokens, parents, node_p(tokens, parents, rows)))
        kept = {}
        law = step_law(rule, tokens, parents, rows, q, kept=kept)
        gains.append(sum(kept.values()) - ceiling)
        if gains[-1] > 1e-9:
            assert law_gap(law, target_law(cond, tokens, parents)) > 1e-6
    assert max(gains) > 1e-2, gains


def test_the_inspector_shows_a_tree_step_against_its_ceiling():
    """docs/exactness.md's worked tree (test_render.walked_step: "the" 0.5, "a" 0.3, "an" 0.1 at
    the root, "<b>" 0.4 under "an"): the keep chances written out, their sum, and the walk's order."""
    from test_render import spec_trace, walked_step

    from specviz.render.inspect import step_html

    html = step_html(spec_trace(walked_step()), 0)
    assert "the sibling walk keeps 0.94 of these 4 candidates (1 this step)" in html
    assert "<td data-label=\"keep chance: p along its branch\">0.100 × 0.400 = 0.040</td>" in html
    assert ("children of the text so far: “the” refused, then “a” refused, then “an” kept</li>"
            "<li>children of “an”: “&lt;b&gt;” refused") in html
    assert step_html(spec_trace(walked_step(greedy=True)), 0).count("sv-ceiling") == 0  # greedy: no coins to average
    from specviz.ui.blocks.stepping import phases

    said = dict(phases(*walked_step()))["accept/reject"]
    assert said.endswith("the walk keeps 0.94 of the 4, the most any exact rule keeps from this tree")
