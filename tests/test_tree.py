"""Tree drafts: the tree attention mask computes what each branch alone computes, the
greedy walk follows the target, and the whole loop with tree drafts is plain greedy decoding."""
from __future__ import annotations

import random

import pytest
import torch

from conftest import tiny_llama
from specviz import GenerationConfig, Sampling, baseline_generate, collect, speculative_generate
from specviz.core.tree import best_first, depths, greedy_walk, tree_mask
from specviz.drafters.base import Draft, Drafter, empty_draft
from specviz.modeling.forward import forward, new_cache
from specviz.modeling.llama_fast import hidden_states

# node: 0   1   2   3   4   5
PARENTS = [-1, -1, 0, 0, 2, 1]


def test_mask_lets_each_node_see_itself_and_its_ancestors_only():
    mask = tree_mask(PARENTS)
    ancestors = {0: [0], 1: [0], 2: [0, 1], 3: [0, 1], 4: [0, 1, 3], 5: [0, 2]}  # rows; 0 = root
    for node, rows in ancestors.items():
        assert sorted(torch.nonzero(mask[node + 1]).view(-1).tolist()) == sorted(rows + [node + 1])
    assert depths(PARENTS) == [1, 1, 2, 2, 3, 2]


def test_tree_forward_equals_a_separate_forward_per_branch():
    model = tiny_llama()
    context = [4, 8, 15, 16, 23, 42, 7]
    root, tokens = 9, [11, 12, 13, 14, 15, 16]
    with torch.no_grad():
        cache = new_cache(model)
        forward(model, torch.tensor(context), cache)
        start = cache.length
        mask = torch.cat([torch.ones(7, start, dtype=torch.bool), tree_mask(PARENTS)], 1)
        positions = torch.tensor([0] + depths(PARENTS)) + start
        h = hidden_states(model, torch.tensor([root] + tokens), cache, mask=mask, positions=positions)
        for node in range(len(tokens)):
            branch, i = [], node
            while i >= 0:
                branch.insert(0, tokens[i])
                i = PARENTS[i]
            _, ref = forward(model, torch.tensor(context + [root] + branch), new_cache(model), hidden=True)
            torch.testing.assert_close(h[node + 1], ref[-1], rtol=1e-4, atol=1e-4)


def test_greedy_walk_follows_the_argmax_and_ends_with_correction_or_bonus():
    tokens = [11, 12, 13, 14, 15, 16]
    # rows: 0 the root, i+1 node i. Root picks 11 (node 0), node 0 picks 13 (node 2), node 2
    # picks 99 where its only child holds 15: a correction.
    assert greedy_walk(tokens, PARENTS, [11, 13, 0, 99, 0, 0, 0]) == ([0, 2], 99)
    # node 0 picks 14 (node 3, a leaf): its row gives the bonus token
    assert greedy_walk(tokens, PARENTS, [11, 14, 0, 0, 77, 0, 0]) == ([0, 3], 77)
    assert greedy_walk(tokens, PARENTS, [50, 0, 0, 0, 0, 0, 0]) == ([], 50)


def test_best_first_spends_the_budget_on_the_likeliest_paths():
    cands = [[(1, 0.6), (2, 0.3)], [(3, 0.9), (4, 0.05)], [(5, 0.5)]]
    tokens, parents = best_first(cands, 4)
    # 1 (0.6), 1-3 (0.54), 2 (0.3), 1-3-5 (0.27)
    assert tokens == [1, 3, 2, 5] and parents == [-1, 0, -1, 1]
    assert best_first(cands, 0) == ([], [])
    # a confidence threshold drops the paths below it; the likeliest is always drafted
    assert best_first(cands, 4, 0.28) == ([1, 3, 2], [-1, 0, -1])
    assert best_first(cands, 4, 0.95) == ([1], [-1])


class OracleTree(Drafter):
    """Knows the greedy answer; hides it at a random place in a random tree, sometimes not at all."""

    def __init__(self, answer, prompt_len, seed=0):
        self.answer, self.prompt_len, self.rng = answer, prompt_len, random.Random(seed)
        self.paths = []

    def begin(self, prompt_ids, processor, generator, device, hidden=None, trees=False):
        self.device, self.trees = device, trees

    def propose(self, ids, k, min_confidence=0.0):
        assert self.trees, "proposing a tree where the engine did not allow one"
        done = len(ids) - self.prompt_len
        truth = self.answer[done: done + self.rng.randint(0, 4)]  # what greedy decoding says next
        tokens, parents = [], []
        parent = -1
        for t in truth:
            for _ in range(self.rng.randint(0, 2)):  # wrong siblings before the right one
                tokens.append((t + self.rng.randint(1, 50)) % 96); parents.append(parent)
            tokens.append(t); parents.append(parent)
            parent = len(tokens) - 1
        for _ in range(self.rng.randint(0, 3)):  # junk branches anywhere
            parents.append(self.rng.randint(-1, len(tokens) - 1)); tokens.append(self.rng.randint(0, 95))
        if not tokens:
            tokens, parents = [self.rng.randint(0, 95)], [-1]
        return Draft(torch.tensor(tokens, device=self.device), None, tuple(parents))

    def feedback(self, accepted, hidden=None, path=None):
        self.paths.append(path)


class BudgetLog(OracleTree):
    """An oracle tree drafter that records the budget and threshold each step was given."""

    tree_width = 2

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.asked = []

    def propose(self, ids, k, min_confidence=0.0):
        self.asked.append((k, min_confidence))
        return super().propose(ids, k, min_confidence)


@pytest.mark.parametrize("confidence", [0.0, 0.3])
def test_a_confidence_sized_tree_gets_the_largest_budget_and_the_threshold(target, prompts, confidence, fake_clock):
    """With dynamic k and a draft-confidence threshold a tree drafter is offered 4k nodes and
    keeps the ones it is sure enough of; without one, dynamic k sizes its budget."""
    cfg = GenerationConfig(max_new_tokens=30, k=2, dynamic_k=True, draft_confidence=confidence)
    prompt = prompts[0]
    _, base = collect(baseline_generate(target, prompt, cfg))
    drafter = BudgetLog(list(base.token_ids), len(prompt))
    _, end = collect(speculative_generate(target, drafter, prompt, cfg))
    assert end.token_ids == base.token_ids
    budgets = [k for k, _ in drafter.asked[:-2]]  # (the last steps are capped by the tokens left)
    assert {c for _, c in drafter.asked} == {confidence}
    if confidence:
        assert set(budgets) == {8}
    else:
        assert budgets[0] == 2 and set(budgets) != {8}, "dynamic k starts at k and sizes each step"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_loop_with_tree_drafts_is_greedy_decoding(target, prompts, seed):
    cfg = GenerationConfig(max_new_tokens=40, k=4)
    for prompt in prompts:
        _, base = collect(baseline_generate(target, prompt, cfg))
        drafter = OracleTree(list(base.token_ids), len(prompt), seed)
        steps, end = collect(speculative_generate(target, drafter, prompt, cfg))
        assert end.token_ids == base.token_ids
        assert end.stats.tokens == 40 and sum(len(s.emitted) for s in steps) == 40
        assert max(s.accepted for s in steps) >= 2  # trees did get branches accepted
        trees = [s for s in steps if s.tree is not None]
        assert len(trees) >= len(steps) - 1  # only a last step with no room drafts nothing
        for s in trees:
            assert len(s.tree.path) == s.accepted
            assert [s.tree.tokens[i] for i in s.tree.path] == list(s.draft[: s.accepted])


class Listener(Drafter):
    """Records whether `begin` allowed trees; drafts nothing."""

    def begin(self, prompt_ids, processor, generator, device, hidden=None, trees=False):
        self.device, self.trees = device, trees

    def propose(self, ids, k, min_confidence=0.0):
        return empty_draft(self.device)


@pytest.mark.parametrize("sampling", [
    Sampling(),
    Sampling(temperature=0.85),  # the sibling walk (core/tree_sampling.py), up to the policy's temperature
    Sampling(repetition_penalty=1.3),  # each row penalised for its own branch
    Sampling(temperature=0.7, top_k=5, top_p=0.9, repetition_penalty=1.3),
])
def test_trees_are_allowed_greedy_or_sampled(target, sampling):
    drafter = Listener()
    collect(speculative_generate(target, drafter, [1, 2, 3, 4, 5], GenerationConfig(max_new_tokens=2, sampling=sampling)))
    assert drafter.trees == GenerationConfig.tree_drafting  # how a sampled tree's children are found: trees allowed


def test_sampled_runs_above_the_policys_temperature_draft_chains(target):
    drafter = Listener()
    cfg = GenerationConfig(max_new_tokens=2, sampling=Sampling(temperature=1.0))
    collect(speculative_generate(target, drafter, [1, 2, 3, 4, 5], cfg))
    assert drafter.trees is False and cfg.sampled_trees_up_to == 0.85


def test_trees_need_a_position_indexed_cache():
    from transformers import DynamicCache

    from specviz.engine.verify_step import trees_verifiable

    assert trees_verifiable(new_cache(tiny_llama())) and not trees_verifiable(DynamicCache())


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_tree_drafts_with_a_repetition_penalty_are_greedy_decoding(target, prompts, seed):
    cfg = GenerationConfig(max_new_tokens=30, k=4, sampling=Sampling(repetition_penalty=1.5))
    for prompt in prompts[1:]:
        _, base = collect(baseline_generate(target, prompt, cfg))
        steps, end = collect(speculative_generate(target, OracleTree(list(base.token_ids), len(prompt), seed),
                                                  prompt, cfg))
        assert end.token_ids == base.token_ids
        assert max(s.accepted for s in steps) >= 2 and all(s.tree is not None for s in steps[:-1])


def test_inspector_draws_the_tree_with_the_winning_branch_and_escapes_text():
    from specviz.core.events import StepEvent, TreeDraft
    from specviz.render.inspect import step_html
    from specviz.render.trace import Labels, Trace

    tree = TreeDraft(tokens=(11, 12, 13, 14, 15, 16), parents=tuple(PARENTS), path=(0, 2), p=(0.5,) * 6)
    event = StepEvent(step=0, position=0, draft=(11, 13, 15), q=None, p=(0.5, 0.5, 0.5), accept_prob=(1.0, 1.0, 0.0),
                      draws=None, accepted=2, token=99, token_p=0.4, token_kind="corrected", emitted=(11, 13, 99), top=(),
                      draft_time=0.0, verify_time=0.0, elapsed=0.0, greedy=True, tree=tree)
    trace = Trace("medusa")
    names = ("<b>", "b", "c", "d", "e", "f")
    trace.add(event, Labels(draft=("<b>", "c", "e"), token="z", tree=names))
    html = step_html(trace, 0)
    assert "<b>" not in html and "&lt;b&gt;" in html
    assert html.count('class="sv-tree-won"') == 2  # nodes 0 and 2
    assert html.count('class="sv-tree-missed"') == 1  # node 4, the child of node 2 that missed
    assert 'data-nodes="6"' in html


@pytest.mark.parametrize("subset", [False, True])
def test_medusa_proposes_trees_within_budget_and_stays_exact(target, prompts, subset):
    from test_heads import make

    cfg = GenerationConfig(max_new_tokens=30, k=6, tree_nodes_per_k=1)
    for prompt in prompts:
        _, base = collect(baseline_generate(target, prompt, cfg))
        steps, end = collect(speculative_generate(target, make("medusa-subset" if subset else "medusa", target, tree=3),
                                                  prompt, cfg))
        assert end.token_ids == base.token_ids
        trees = [s.tree for s in steps if s.tree is not None]
        assert trees and all(1 < len(t.tokens) <= 6 for t in trees[:-1])
        assert any(len(set(t.parents)) > 1 and t.parents.count(-1) > 1 for t in trees)  # branching
