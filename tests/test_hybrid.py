"""A model drafter paired with prompt lookup (drafters/hybrid.py): copy where the context
repeats, predict elsewhere, and stay exact either way."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import noisy_copy, tiny_llama
from specviz import GenerationConfig, Sampling, baseline_generate, collect, speculative_generate
from specviz.core.errors import SpecvizError
from specviz.drafters import DraftModel, LayerSkip, PromptLookup
from specviz.run.spec import make_drafter, parse
from specviz.drafters.hybrid import MODEL, Hybrid
from test_heads import make
from test_sampling_distribution import N, PROMPT, SAMPLING, assert_matches, exact_joint

# A pattern the prompt repeats, then a break: some steps can copy, some cannot.
REPEATS = [5, 6, 7, 8, 9, 10, 11, 12] * 3 + [40, 41, 5, 6]
MODELS = ["eagle", "eagle-tree", "medusa-tree", "draft model", "layer skip"]


def model_drafter(kind: str, target):
    if kind == "draft model":
        return DraftModel(noisy_copy(target, 0.2))
    if kind == "layer skip":
        return LayerSkip(target, [0])
    name, _, tree = kind.partition("-")
    return make(name, target, tree=3 if tree else 0)


class Recorder(Hybrid):
    """A hybrid that notes, per step, the context, who drafted and what."""

    def begin(self, *args, **kwargs):
        self.steps, self.asked = [], []
        super().begin(*args, **kwargs)

    def propose(self, ids, k, min_confidence=0.0):
        draft = super().propose(ids, k, min_confidence)
        self.steps.append((list(ids), self.copying, draft))
        self.asked.append(k)
        return draft


def recurs(ids: list[int], n: int) -> bool:
    """Did the context's last n tokens occur earlier in it?"""
    tail = ids[-n:]
    return any(ids[i:i + n] == tail for i in range(len(ids) - n))


@pytest.fixture(scope="module")
def baseline(target):
    return collect(baseline_generate(target, REPEATS, GenerationConfig(max_new_tokens=30)))[1]


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("k,dynamic", [(3, False), (4, True)])
def test_greedy_output_is_the_baseline_and_both_drafters_draft(target, baseline, kind, k, dynamic, fake_clock):
    hybrid = Recorder(model_drafter(kind, target))
    cfg = GenerationConfig(max_new_tokens=30, k=k, dynamic_k=dynamic)
    steps, end = collect(speculative_generate(target, hybrid, REPEATS, cfg))
    assert end.token_ids == baseline.token_ids
    copied = [c for _, c, _ in hybrid.steps]
    assert any(copied) and not all(copied)
    # It copies exactly when the context's last two tokens occurred before (prompt lookup's
    # n >= 2), and a copy is what followed their latest occurrence.
    for ids, copying, draft in hybrid.steps:
        assert copying == recurs(ids, 2)
        if copying:
            assert draft.parents is None
            n = 3 if recurs(ids, 3) else 2
            start = max(i for i in range(len(ids) - n) if ids[i:i + n] == ids[-n:]) + n
            assert draft.tokens.tolist() == ids[start:start + draft.tokens.numel()]


@pytest.mark.parametrize("kind", ["eagle-tree", "medusa-tree", "draft model"])
def test_the_model_drafts_what_it_would_on_its_own_at_the_same_context(target, kind):
    """Steps it did not draft still reach the model (feedback with the target's states), so at
    every step it does draft it proposes what a fresh copy started on that context would."""
    hybrid = Recorder(model_drafter(kind, target))
    cfg = GenerationConfig(max_new_tokens=30, k=3)
    collect(speculative_generate(target, hybrid, REPEATS, cfg))
    after_copies = [i for i, (_, c, _) in enumerate(hybrid.steps) if not c and i and hybrid.steps[i - 1][1]]
    assert after_copies  # the interesting case: the model drafts right after prompt lookup did

    class Never(PromptLookup):  # never matches: the model drafts the fresh run's first step
        def plan(self, ids):
            return None

    for (ids, copying, draft), k in zip(hybrid.steps, hybrid.asked):
        if copying:
            continue
        fresh = Recorder(model_drafter(kind, target), Never())
        collect(speculative_generate(target, fresh, ids, GenerationConfig(max_new_tokens=k + 1, k=k)))
        first = fresh.steps[0][2]
        assert torch.equal(first.tokens, draft.tokens) and first.parents == draft.parents, ids


def started(hybrid: Hybrid, target, ids):
    hybrid.begin(ids, None, None, "cpu", hidden=torch.zeros(len(ids) - 1, target.config.hidden_size))
    return hybrid


def test_plan_names_the_kind_of_each_draft(target):
    hybrid = started(Hybrid(model_drafter("eagle", target)), target, [1, 2, 3, 4])
    assert hybrid.plan([1, 2, 3, 4]) == MODEL and not hybrid.copying
    assert hybrid.plan([1, 2, 3, 4, 1, 2]) == 2 and hybrid.copying
    assert hybrid.plan([1, 2, 3, 4, 1, 2, 3]) == 3
    assert hybrid.plan([1, 2, 3, 4, 1, 2, 3, 2]) == MODEL  # a 1-gram match is the model's step
    strict = started(Hybrid(model_drafter("eagle", target), min_match=3), target, [1, 2, 3, 4])
    assert strict.plan([1, 2, 3, 4, 1, 2]) == MODEL


def test_copied_steps_draft_chains_and_the_model_keeps_its_trees(target):
    hybrid = started(Hybrid(model_drafter("eagle-tree", target)), target, [1, 2, 3, 4])
    hybrid.plan([1, 2, 3, 4])
    assert hybrid.tree_width == 3
    hybrid.plan([1, 2, 3, 4, 1, 2])
    assert hybrid.tree_width == 0


@pytest.mark.slow  # a thousand sampled runs for a chi-square test
def test_sampled_tokens_follow_the_target():
    """Chi-square of the first three sampled tokens against the exact joint. With four tokens
    the context's 2-grams recur all the time, so runs mix copied and drawn drafts."""
    model = tiny_llama(vocab=4, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.3)
    joint = exact_joint(model, SAMPLING)
    counts, hybrid = {}, Recorder(make("eagle-subset", model))
    kinds = set()
    for seed in range(N):
        cfg = GenerationConfig(max_new_tokens=3, k=3, sampling=Sampling(**{**SAMPLING.__dict__, "seed": seed}))
        _, end = collect(speculative_generate(model, hybrid, PROMPT, cfg))
        counts[end.token_ids] = counts.get(end.token_ids, 0) + 1
        kinds |= {c for _, c, _ in hybrid.steps}
    assert kinds == {True, False}
    assert_matches(counts, joint)


def test_specs_pair_a_model_drafter_with_prompt_lookup(target):
    loaded = SimpleNamespace(model=target, name="tiny")
    hybrid = make_drafter("layerskip:0+pld", loaded)
    assert isinstance(hybrid, Hybrid) and isinstance(hybrid.model, LayerSkip)
    # its steps say who drafted them as the menus and panels name it ("drafted by EAGLE", never "by eagle")
    assert hybrid.describe(0) == parse("layerskip:0").label == "layer skip (layers 0)"
    assert parse("eagle+pld").label == "EAGLE + prompt lookup"
    assert parse("some/draft-model+pld").needs_model and not parse("eagle+pld").needs_model
    for bad in ("pld+pld", "none+pld"):
        with pytest.raises(SpecvizError, match="pairs prompt lookup with a model drafter"):
            make_drafter(bad, loaded)


def test_each_step_says_who_drafted_it(target):
    """The step inspector and `replay --steps` show a hybrid step's source: the model's name
    or prompt lookup with the n-gram length that matched."""
    hybrid = Recorder(model_drafter("eagle", target))
    steps, _ = collect(speculative_generate(target, hybrid, REPEATS, GenerationConfig(max_new_tokens=30, k=3)))
    drafted = [s for s in steps if s.draft]
    assert len(drafted) == len(hybrid.steps)
    for s, (ids, copying, _) in zip(drafted, hybrid.steps):
        n = 3 if recurs(ids, 3) else 2
        assert s.source == (f"prompt lookup, {n}-gram match" if copying else "eagle")
    alone = collect(speculative_generate(target, model_drafter("eagle", target), REPEATS,
                                         GenerationConfig(max_new_tokens=8, k=3)))[0]
    assert {s.source for s in alone} == {""}
