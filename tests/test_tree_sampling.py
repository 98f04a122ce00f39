"""Sampled tree verification is exact: the law of what one step emits, by enumeration.

What to compare. A tree step emits a variable number of tokens: the accepted branch
x_1..x_n, then the target's own token t (a correction where every child of the last node
was rejected, a bonus at a leaf). The tree is built from the context alone, before anything
is drawn, so it is a stopping rule on the target's own sequence y_1, y_2, ...: go down while
y_i is the token of a child of the node reached so far, stop at the first y_i no child
holds (at a leaf, the first y_i at all). The step is exact when, for every sequence s it can
emit, P(step emits s) = P_target(y_1..y_L = s) with L = len(s): the product of the target's
conditionals along s. Those s are exactly the stopping rule's outcomes (a prefix-free set
whose target probabilities sum to one), so the comparison is of two laws over one set, and a
rule that ever emits a sequence outside it (a rejected child's token, say) fails it.

Why that is enough for the whole run: the next step starts from the emitted context with a
new tree and fresh coins, which is the target's own process restarted where the stopping
rule stopped; so the output's first N tokens have the target's joint law, the argument that
makes a chain step exact (test_verify.py) applied at each stopping time. The chi-square test
at the end checks the whole loop on a tiny model.

How the step's law is computed: without coins. Every coin the walk looks at is a Bernoulli
branch (kept with its p'(x), rejected otherwise), every branch is followed to its end, and
the token drawn there contributes its whole distribution. Rules known to be wrong, written
below with the same coin interface, give another law on the same cases.
"""
from __future__ import annotations

from dataclasses import replace

import json
import re
import random
import zlib
from collections import Counter, defaultdict

import pytest
import torch

from conftest import tiny_llama
from specviz import GenerationConfig, Sampling, collect, speculative_generate
from specviz.core.sampling import Processor
from specviz.core.tree_sampling import sample_tree, walk_order

V = 6
ANY = float("inf")  # GenerationConfig.sampled_trees_up_to: sampled trees at any temperature, the rule under test
CONTEXT = [1, 4, 1]  # what the repetition penalty sees before the tree


# ------------------------------------------------------------------ targets and trees

def branch(tokens, parents, node) -> tuple[int, ...]:
    """The tokens from the root down to `node` (inclusive; () for the root, -1)."""
    out = []
    while node >= 0:
        out.insert(0, tokens[node])
        node = parents[node]
    return tuple(out)


def _gen(*key) -> torch.Generator:
    # crc32 of the key's text, not hash(): Python salts str hashes per process ("logits" is in every
    # key), so the fixtures and the gaps the tests check would change from run to run
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def raw_logits(seed, prefix) -> torch.Tensor:
    return torch.randn(V, generator=_gen(seed, "logits", *prefix), dtype=torch.float64) * 2


def target(kind: str, seed: int):
    """cond(prefix): the target's processed distribution after CONTEXT + prefix (float64)."""
    settings = {"top-k/top-p": Sampling(temperature=0.8, top_k=4, top_p=0.85),
                "penalty": Sampling(temperature=1.1, top_p=0.95, repetition_penalty=1.8)}

    def cond(prefix):
        g = _gen(seed, kind, *prefix)
        if kind in settings:
            s = settings[kind]
            p = Processor(s, V, CONTEXT + list(prefix), "cpu").probs(raw_logits(seed, prefix).float()[None])[0]
        elif kind == "one-hot":
            p = torch.zeros(V)
            p[int(torch.randint(V, (1,), generator=g))] = 1
        elif kind == "near-one-hot":
            p = torch.full((V,), 1e-6 / (V - 1))
            p[int(torch.randint(V, (1,), generator=g))] = 1 - 1e-6
        elif kind == "disjoint":  # never any mass on 0, 1 or 2: the tokens the fixed trees draft first
            p = torch.rand(V, generator=g)
            p[:3] = 0
        else:  # "random": uneven, and token 5 never
            p = torch.rand(V, generator=g, dtype=torch.float64) ** 3
            p[5] = 0
        p = p.double()
        return p / p.sum()

    return cond


def rows_for(kind, seed, tokens, parents) -> torch.Tensor:
    """The p the verifier gets: row 0 the root's, row i + 1 node i's, each after its own branch;
    with a penalty, processed the engine's way (all rows at once, each with its own branch)."""
    if kind == "penalty":
        logits = torch.stack([raw_logits(seed, branch(tokens, parents, i)) for i in range(-1, len(parents))])
        s = Sampling(temperature=1.1, top_p=0.95, repetition_penalty=1.8)
        p = Processor(s, V, CONTEXT, "cpu").probs(logits.float(), torch.tensor(tokens), parents=tuple(parents))
        p = p.double()
        return p / p.sum(-1, keepdim=True)
    cond = target(kind, seed)
    return torch.stack([cond(branch(tokens, parents, i)) for i in range(-1, len(parents))])


TREES = {
    "three siblings": ([0, 1, 2], [-1, -1, -1]),
    "depth 2, two each": ([0, 1, 2, 3, 1, 0], [-1, -1, 0, 0, 1, 1]),
    # leaves at depths 1 (node 1), 2 (node 4) and 3 (node 5): bonus rows at every depth
    "uneven": ([1, 0, 3, 2, 1, 0], [-1, -1, -1, 0, 2, 3]),
    # siblings 0 and 1 are both token 2 (different subtrees); token 5 has no mass under "random"
    "repeats and zero mass": ([2, 2, 5, 1, 3, 4], [-1, -1, -1, 0, 1, 3]),
    "a chain": ([3, 1, 4], [-1, 0, 1]),
}


def random_tree(seed: int) -> tuple[list[int], list[int]]:
    """Depth 2-3, one to three children per node, tokens from the whole vocabulary."""
    rng = random.Random(seed)
    tokens, parents, level = [], [], [-1]
    for _ in range(rng.choice([2, 3])):
        nxt = []
        for parent in level:
            for _ in range(rng.randint(1 if parent < 0 else 0, 3)):
                tokens.append(rng.randrange(V))
                parents.append(parent)
                nxt.append(len(tokens) - 1)
        level = nxt
    return tokens, parents


def target_law(cond, tokens, parents) -> dict:
    """P_target(y_1..y_L = s) over the stopping rule's outcomes s (see the module docstring)."""
    out = {}

    def down(node, prefix, weight):
        held = {}
        for i, parent in enumerate(parents):
            if parent == node:
                held.setdefault(tokens[i], i)  # equal siblings: the first one is the branch followed
        p = cond(prefix)
        for t in range(V):
            if p[t] == 0:
                continue
            if t in held:
                down(held[t], prefix + (t,), weight * p[t].item())
            else:
                out[prefix + (t,)] = weight * p[t].item()

    down(-1, (), 1.0)
    return out


# ------------------------------------------------------------------ the step's law, coin by coin

class _Coin(Exception):
    def __init__(self, a):
        self.a = a


def step_law(rule, tokens, parents, rows, q=None, kept=None) -> dict:
    """The law of (accepted branch's tokens + the drawn token) under `rule`, every coin enumerated.

    rule(tokens, parents, rows, coin, q) -> (path, dist) asks coin(a) for a Bernoulli(a) each time
    it looks at a coin, in order; re-run with the decisions so far replayed, it asks the same.
    `kept`, a dict, receives each node's probability of being kept."""
    out = defaultdict(float)

    def explore(decided, weight):
        asked = []

        def coin(a):
            if len(asked) < len(decided):
                asked.append(a)
                return decided[len(asked) - 1]
            raise _Coin(min(max(float(a), 0.0), 1.0))

        try:
            path, dist = rule(tokens, parents, rows, coin, q)
        except _Coin as c:
            if c.a > 0:
                explore(decided + [True], weight * c.a)
            if c.a < 1:
                explore(decided + [False], weight * (1 - c.a))
            return
        d = dist / dist.sum()
        prefix = tuple(tokens[i] for i in path)
        for i in path if kept is not None else ():
            kept[i] = kept.get(i, 0.0) + weight
        for t in torch.nonzero(d).view(-1).tolist():
            out[prefix + (t,)] += weight * d[t].item()

    explore([], 1.0)
    return dict(out)


def implemented(tokens, parents, rows, coin, q=None):
    """specviz's rule behind the coin interface: sample_tree judges every node from its draw
    (u = 0 keeps a node with p'(x) > 0, u = 1 rejects any). Nodes not decided yet keep random
    draws (the coins of nodes the walk never reaches must change nothing), and the walk is
    re-run after each decision until every node it judges has been decided."""
    draws = torch.rand(len(parents), generator=torch.Generator().manual_seed(len(tokens)), dtype=torch.float64)
    decided = {}
    while True:
        s = sample_tree(torch.tensor(tokens), parents, rows, draws)
        path, walk = walk_order(parents, s.on_path.tolist(), s.tried.tolist())
        fresh = [i for i in walk if i not in decided]
        if not fresh:
            assert all(decided[i] == (i in path) for i in walk)
            return path, s.dist
        i = fresh[0]
        decided[i] = coin(s.accept_prob[i].item())
        draws[i] = 0.0 if decided[i] else 1.0


def assert_same_law(got: dict, want: dict, tol=1e-9):
    assert abs(sum(want.values()) - 1) < 1e-9
    for s in set(got) | set(want):
        assert abs(got.get(s, 0.0) - want.get(s, 0.0)) < tol, (s, got.get(s, 0.0), want.get(s, 0.0))


def law_gap(got: dict, want: dict) -> float:
    return max(abs(got.get(s, 0.0) - want.get(s, 0.0)) for s in set(got) | set(want))


KINDS = ["random", "one-hot", "near-one-hot", "disjoint", "top-k/top-p", "penalty"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tree", list(TREES))
def test_one_tree_step_emits_the_targets_law(kind, tree):
    tokens, parents = TREES[tree]
    rows = rows_for(kind, 7, tokens, parents)
    assert_same_law(step_law(implemented, tokens, parents, rows), target_law(target(kind, 7), tokens, parents))


@pytest.mark.parametrize("seed", range(12))
def test_random_trees_emit_the_targets_law(seed):
    tokens, parents = random_tree(seed)
    kind = KINDS[seed % len(KINDS)]
    rows = rows_for(kind, seed, tokens, parents)
    assert_same_law(step_law(implemented, tokens, parents, rows), target_law(target(kind, seed), tokens, parents))


def test_the_walk_records_each_siblings_turn():
    """docs/exactness.md's example: p = (x 0.5, y 0.3, z 0.1, other 0.1), children x, y, z."""
    p = torch.tensor([[0.5, 0.3, 0.1, 0.1], [0.25] * 4, [0.25] * 4, [0.25] * 4], dtype=torch.float64)
    tokens, parents = torch.tensor([0, 1, 2]), (-1, -1, -1)
    s = sample_tree(tokens, parents, p, torch.tensor([0.62, 0.71, 0.35], dtype=torch.float64))
    assert torch.allclose(s.accept_prob, torch.tensor([0.5, 0.6, 0.5], dtype=torch.float64))
    assert torch.allclose(s.residual_mass, torch.tensor([0.5, 0.2, 0.1], dtype=torch.float64))
    assert walk_order(parents, s.on_path.tolist(), s.tried.tolist()) == ([2], [0, 1, 2])
    assert s.row.item() == 3 and torch.equal(s.dist, p[3])  # z kept, a leaf: the bonus from z's row
    # u = 0.55 for z as well: all three rejected, the correction is "other" for certain
    s = sample_tree(tokens, parents, p, torch.tensor([0.62, 0.71, 0.55], dtype=torch.float64))
    assert s.row.item() == 0 and s.on_path.sum() == 0
    assert torch.allclose(s.dist / s.dist.sum(), torch.tensor([0, 0, 0, 1.0], dtype=torch.float64))
    # y kept: z is never judged
    s = sample_tree(tokens, parents, p, torch.tensor([0.62, 0.3, 0.0], dtype=torch.float64))
    assert walk_order(parents, s.on_path.tolist(), s.tried.tolist()) == ([1], [0, 1])


def test_coins_off_the_walk_change_nothing():
    """A node whose own coin says "keep" but whose parent was rejected is not on the path."""
    p = torch.full((4, 3), 1 / 3, dtype=torch.float64)
    tokens, parents = torch.tensor([0, 1, 2]), (-1, 0, 1)
    s = sample_tree(tokens, parents, p, torch.tensor([0.9, 0.0, 0.0], dtype=torch.float64))
    assert s.on_path.sum() == 0 and s.row.item() == 0 and s.tried.tolist() == [True, False, False]
    s = sample_tree(tokens, parents, p, torch.tensor([0.0, 0.9, 0.0], dtype=torch.float64))
    assert s.on_path.tolist() == [True, False, False] and s.row.item() == 1


def test_a_repeated_sibling_is_never_kept_and_its_mass_counts_once():
    p = torch.tensor([[0.4, 0.6], [0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    s = sample_tree(torch.tensor([0, 0]), (-1, -1), p, torch.tensor([0.9, 0.0], dtype=torch.float64))
    assert s.accept_prob.tolist() == [0.4, 0.0] and s.on_path.sum() == 0
    assert torch.allclose(s.dist / s.dist.sum(), torch.tensor([0.0, 1.0], dtype=torch.float64))


def test_each_tree_row_is_processed_with_its_own_branch():
    """The penalty sees the context and the row's own branch only, as plain decoding would."""
    s = Sampling(temperature=0.9, top_k=5, repetition_penalty=1.7)
    tokens, parents = TREES["uneven"]
    logits = torch.randn(len(parents) + 1, V, generator=torch.Generator().manual_seed(3))
    together = Processor(s, V, CONTEXT, "cpu").probs(logits, torch.tensor(tokens), parents=tuple(parents))
    for r in range(len(parents) + 1):
        alone = Processor(s, V, CONTEXT + list(branch(tokens, parents, r - 1)), "cpu").probs(logits[r:r + 1])
        assert torch.allclose(together[r], alone[0])


# ------------------------------------------------------------------ rules that are not exact

def _kids(parents, node):
    return [i for i, parent in enumerate(parents) if parent == node]


def _without(p, toks):
    r = p.clone()
    for t in toks:
        r[t] = 0
    return r if r.sum() > 0 else p


def independent(tokens, parents, rows, coin, q=None):
    """Each sibling kept with p(x), as if it were a lone one-token draft (no renormalising)."""
    node, path = -1, []
    while True:
        p, kids = rows[node + 1], _kids(parents, node)
        for c in kids:
            if coin(p[tokens[c]]):
                path.append(c)
                node = c
                break
        else:
            return path, _without(p, [tokens[c] for c in kids])


def no_residual_update(tokens, parents, rows, coin, q=None):
    """p' never changes: each sibling kept with p(x), the token drawn from p itself."""
    node, path = -1, []
    while True:
        p = rows[node + 1]
        for c in _kids(parents, node):
            if coin(p[tokens[c]]):
                path.append(c)
                node = c
                break
        else:
            return path, p


def forgets_the_rejected(tokens, parents, rows, coin, q=None):
    """The right coins, but the correction drawn from p with the rejected children left in."""
    node, path = -1, []
    while True:
        p, left = rows[node + 1], 1.0
        for c in _kids(parents, node):
            x = tokens[c]
            if coin(p[x] / left):
                path.append(c)
                node = c
                break
            left -= p[x].item()
        else:
            return path, p


def counts_repeats_twice(tokens, parents, rows, coin, q=None):
    """Renormalising by subtracting each rejected sibling's p(x), repeats included."""
    node, path = -1, []
    while True:
        p, kids, left = rows[node + 1], _kids(parents, node), 1.0
        for c in kids:
            x = tokens[c]
            if coin(min(1.0, p[x].item() / max(left, 1e-300))):
                path.append(c)
                node = c
                break
            left -= p[x].item()
        else:
            return path, _without(p, [tokens[c] for c in kids])


def specinfer(tokens, parents, rows, coin, q, without_replacement=False):
    """SpecInfer's min(1, p'/q) with p' <- norm(max(p' - q, 0)) after each rejection, using the
    drafter's softmax q although the children are its top-k, not draws from q. With
    `without_replacement` each tried child is also removed from q (recursive rejection sampling)."""
    node, path = -1, []
    while True:
        p, qq = rows[node + 1].clone(), q[node + 1].clone()
        for c in _kids(parents, node):
            x = tokens[c]
            if coin(min(1.0, (p[x] / qq[x]).item()) if qq[x] > 0 else 1.0):
                path.append(c)
                node = c
                break
            r = torch.clamp(p - qq, min=0)
            p = r / r.sum() if r.sum() > 0 else p
            if without_replacement:
                qq[x] = 0
                qq = qq / qq.sum() if qq.sum() > 0 else qq
        else:
            return path, p


def recursive_rejection(tokens, parents, rows, coin, q):
    return specinfer(tokens, parents, rows, coin, q, without_replacement=True)


def grow(q_of, width, depth):
    """(tokens, parents) of a tree grown as EAGLE grows one: each node's `width` likeliest tokens
    under the drafter's q_of(branch), level by level."""
    tokens, parents, level = [], [], [-1]
    for _ in range(depth):
        nxt = []
        for node in level:
            for t in q_of(branch(tokens, parents, node)).topk(width).indices.tolist():
                tokens.append(t)
                parents.append(node)
                nxt.append(len(tokens) - 1)
        level = nxt
    return tokens, parents


def drafted_tree(seed, width=2, depth=2):
    """A tree as EAGLE grows one under a drafter's softmax q, and the q rows (row 0 the root's,
    i + 1 node i's)."""
    def q_of(prefix):
        return torch.softmax(torch.randn(V, generator=_gen(seed, "q", *prefix), dtype=torch.float64) * 1.5, -1)

    tokens, parents = grow(q_of, width, depth)
    q = torch.stack([q_of(branch(tokens, parents, i)) for i in range(-1, len(parents))])
    return tokens, parents, q


@pytest.mark.parametrize("rule", [independent, no_residual_update, forgets_the_rejected, specinfer,
                                  recursive_rejection, counts_repeats_twice], ids=lambda f: f.__name__)
def test_the_check_rejects_rules_that_are_not_exact(rule):
    """On the same cases the right rule passes, each wrong rule's law differs from the target's."""
    gaps = []
    for seed in range(3):
        cases = [drafted_tree(seed), (*TREES["repeats and zero mass"], None), (*TREES["three siblings"], None)]
        for tokens, parents, q in cases:
            if q is None:
                q = torch.full((len(parents) + 1, V), 1.0 / V, dtype=torch.float64)
            rows, cond = rows_for("random", seed, tokens, parents), target("random", seed)
            want = target_law(cond, tokens, parents)
            assert_same_law(step_law(implemented, tokens, parents, rows, q), want)
            gaps.append(law_gap(step_law(rule, tokens, parents, rows, q), want))
    assert max(gaps) > 1e-3


# ------------------------------------------------------------------ the whole loop

@pytest.fixture(scope="module")
def small():
    model = tiny_llama(vocab=4, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.3)  # soften: every continuation has real mass
    return model


def test_a_sampled_run_drafts_trees_and_records_each_walk(small):
    from test_heads import make

    cfg = GenerationConfig(max_new_tokens=24, k=4, sampled_trees_up_to=ANY,
                           sampling=Sampling(temperature=1.0, top_k=3, repetition_penalty=1.2, seed=1))
    steps, end = collect(speculative_generate(small, make("eagle", small, tree=3), [0, 1, 2, 3, 0, 1], cfg))
    assert end.stats.tokens == 24
    trees = [s for s in steps if s.tree is not None]
    assert len(trees) >= len(steps) - 1
    for s in trees:
        t = s.tree
        assert len(t.walk) == len(t.accept_prob) == len(t.draws) == len(t.residual_mass) >= 1
        assert set(t.path) <= set(t.walk) and [i for i in t.walk if i in t.path] == list(t.path)
        for i, a, u in zip(t.walk, t.accept_prob, t.draws):
            assert (u < a) == (i in t.path)  # kept exactly when its coin fell below p'(x)
        # the chain view: the path, then the last node's first child (judged first, rejected)
        shown = [*t.path, *[i for i, parent in enumerate(t.parents) if parent == (t.path or [-1])[-1]][:1]]
        assert s.draft == tuple(t.tokens[i] for i in shown) and s.accepted == len(t.path)
        assert s.draws == tuple(t.draws[t.walk.index(i)] for i in shown)
        assert s.accept_prob == tuple(t.accept_prob[t.walk.index(i)] for i in shown)
    assert any(len(s.tree.walk) > len(s.tree.path) + 1 for s in trees)  # siblings rejected along the way
    assert any(s.accepted >= 2 for s in trees)


def test_a_sampled_tree_step_survives_a_trace_file(small):
    from test_heads import make

    from specviz.render.trace import Labels, Trace
    from specviz.traces import trace_file

    cfg = GenerationConfig(max_new_tokens=8, k=3, sampled_trees_up_to=ANY, sampling=Sampling(temperature=1.0, seed=2))
    steps, end = collect(speculative_generate(small, make("medusa", small, tree=3), [0, 1, 2, 3, 0, 1], cfg))
    assert any(s.tree is not None and s.tree.walk for s in steps)
    trace = Trace("medusa", k=3)
    for s in steps:
        trace.add(s, Labels(draft=tuple(map(str, s.draft)), tree=tuple(map(str, s.tree.tokens)) if s.tree else ()))
    trace.add(end)
    text = trace_file.dumps(trace_file.Recording(trace_file.RunInfo("t", "medusa"), trace))
    assert trace_file.loads(text).spec.events == steps
    # replayed, the inspector shows each step's walk: a row per child judged, in order, and no ratio
    from specviz.render.inspect import step_html

    back = trace_file.loads(text).spec
    for i, s in enumerate(back.steps):
        shown = step_html(back, i)
        assert [int(n) for n in re.findall(r'data-node="(\d+)"', shown)] == list(s.tree.walk)
        assert "min(1, p/q)" not in shown and "p′(x) when tried" in shown
    # a trace written before walks were recorded still loads, its trees without one
    doc = json.loads(text)
    for e in doc["runs"][0]["events"]:
        for key in ("walk", "accept_prob", "draws", "residual_mass"):
            (e["tree"] or {}).pop(key, None)
    old = trace_file.loads(json.dumps(doc)).spec.events
    assert [e.tree.path for e in old if e.tree] == [s.tree.path for s in steps if s.tree]
    assert all(e.tree.walk == () for e in old if e.tree)
    # and a damaged walk is refused in one sentence
    tree = next(e["tree"] for e in json.loads(text)["runs"][0]["events"] if e["tree"])
    bad = text.replace(json.dumps(tree, separators=(",", ":")),
                       json.dumps({**tree, "draws": tree["draws"][1:]}, separators=(",", ":")), 1)
    with pytest.raises(trace_file.TraceFileError, match="sibling walk"):
        trace_file.loads(bad)


def exact_joint(model, sampling, prompt):
    """The target's exact joint law of the first three tokens after `prompt`."""
    import itertools

    joint = {}
    with torch.inference_mode():
        for seq in itertools.product(range(4), repeat=3):
            prob = 1.0
            for i in range(3):
                ctx = prompt + list(seq[:i])
                logits = model(torch.tensor([ctx])).logits[0, -1:]
                prob *= Processor(sampling, 4, ctx, "cpu").probs(logits)[0, seq[i]].item()
            joint[seq] = prob
    return joint


@pytest.mark.slow  # a few hundred sampled runs for a chi-square test
@pytest.mark.parametrize("kind", ["eagle", "medusa"])
@pytest.mark.parametrize("drafting", ["chosen", "drawn"])  # the sibling walk; recursive rejection (test_tree_drawn.py)
def test_sampled_tree_runs_follow_the_target(small, kind, drafting):
    from test_heads import make
    from test_sampling_distribution import assert_matches

    import test_sampling_distribution as sd

    prompt, sampling = sd.PROMPT, sd.SAMPLING  # temperature 1.3, top-k 3, repetition penalty 1.2
    joint = exact_joint(small, sampling, prompt)
    drafter = make(kind, small, tree=3)
    counts, siblings, runs = Counter(), 0, 300  # enough: without the residual update p < 1e-6
    for seed in range(runs):
        # Six tokens, so that the first step's tree may have five nodes (a step drafts no more
        # than the run can still emit); the first three are compared.
        cfg = GenerationConfig(max_new_tokens=6, k=3, sampled_trees_up_to=ANY, top=0, raw_top=0,
                               sampling=Sampling(**{**sampling.__dict__, "seed": seed}), tree_drafting=drafting)
        steps, end = collect(speculative_generate(small, drafter, prompt, cfg))
        counts[tuple(end.token_ids[:3])] += 1
        # a step whose walk judged a second sibling somewhere: the residual was used
        siblings += any(s.tree is not None and len(s.tree.walk) - len({s.tree.parents[i] for i in s.tree.walk}) > 0
                        for s in steps)
    assert siblings > runs // 3, "the trees were used and siblings judged after a rejection"
    assert_matches(counts, joint)


def test_trees_can_be_turned_off_for_a_run():
    """Above GenerationConfig.sampled_trees_up_to a tree drafter drafts chains (every entry point's policy)."""
    from conftest import tiny_llama
    from test_heads import make

    from specviz import GenerationConfig, Sampling, collect, speculative_generate

    target = tiny_llama(seed=0)
    cfg = GenerationConfig(max_new_tokens=12, k=3, sampled_trees_up_to=1.0, sampling=Sampling(temperature=1.0, seed=1))
    with_trees, _ = collect(speculative_generate(target, make("eagle", target, tree=3), list(range(20, 30)), cfg))
    chains, _ = collect(speculative_generate(target, make("eagle", target, tree=3), list(range(20, 30)),
                                             replace(cfg, sampled_trees_up_to=0.99)))
    assert any(e.tree is not None for e in with_trees) and all(e.tree is None for e in chains)
