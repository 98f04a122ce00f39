"""Medusa heads and the EAGLE head: drafters that read the target's hidden states.

With random weights they draft badly, which is the point: whatever they propose, the
engine's output must be the target's (greedy token for token, sampled in distribution),
and their caches must survive every accept/reject pattern. A few training steps of each
recipe must lower its loss.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import tiny_llama
from specviz import GenerationConfig, Sampling, baseline_generate, collect, speculative_generate
from specviz.core.sampling import Processor
from specviz.core.tree import check_parents
from specviz.drafters.eagle import Eagle, EagleHead, eagle_config
from specviz.drafters.eagle import drafter_from as eagle_from
from specviz.drafters.medusa import Medusa, MedusaHeads, TargetHead
from specviz.drafters.medusa import drafter_from as medusa_from
from specviz.train.batches import sample_batch
from specviz.train.data import Corpus, Seq
from specviz.train.eagle import EagleRecipe
from specviz.train.medusa import MedusaRecipe
from test_sampling_distribution import N, PROMPT, SAMPLING, assert_matches, exact_joint

KINDS = ["medusa", "medusa-subset", "eagle", "eagle-subset", "eagle-deep"]


def make(kind: str, target, seed: int = 0, tree: int = 0):
    """A drafter of `kind` with random weights (the subset drops every third token; "-deep":
    an EAGLE head of two decoder layers); `tree` > 1: greedy tree drafts of that width where the engine allows them; a kind ending
    in "-bf16": the head and its LM-head rows in bf16, as drafter_from makes them on a CPU
    with native bf16 (packing.draft_dtype)."""
    if kind.endswith("-bf16"):
        d = make(kind.removesuffix("-bf16"), target, seed, tree)
        head = d.heads if isinstance(d, Medusa) else d.head
        lm = TargetHead(target, head.subset, torch.bfloat16)
        if isinstance(d, Medusa):
            return Medusa(target, head.to(torch.bfloat16), tree_width=tree, lm=lm)
        return Eagle(target, head.to(torch.bfloat16), tree_width=tree, lm=lm)
    torch.manual_seed(seed)
    vocab, hidden = target.lm_head.weight.shape
    subset = torch.tensor([t for t in range(vocab) if t % 3]) if kind.endswith("subset") else None
    if kind.startswith("medusa"):
        heads = MedusaHeads(hidden, 3, subset)
        for block in heads.blocks:
            torch.nn.init.normal_(block.weight, std=0.3)
        return Medusa(target, heads.requires_grad_(False), tree_width=tree)
    config = eagle_config(target, 0 if subset is None else subset.numel())
    head = EagleHead({**config, "layers": 2} if kind.endswith("deep") else config, subset)
    return Eagle(target, head.requires_grad_(False), tree_width=tree)


def hidden_of(model, ids) -> torch.Tensor:
    """The target's final hidden state after each token (the LM head's input)."""
    with torch.inference_mode():
        return model.model(torch.tensor([ids])).last_hidden_state[0]


def started(kind, target, ids, greedy=True):
    d = make(kind, target)
    processor = Processor(Sampling() if greedy else Sampling(temperature=1.0), target.config.vocab_size, ids, "cpu")
    d.begin(ids, processor, torch.Generator().manual_seed(0), torch.device("cpu"), hidden=hidden_of(target, ids)[:-1])
    return d


@pytest.fixture(scope="module")
def small_vocab():
    """Eight tokens: random drafts are often right, so accept paths get exercised too."""
    return tiny_llama(vocab=8, seed=5)


@pytest.mark.parametrize("kind", KINDS)
def test_drafts_have_the_promised_shapes(target, kind):
    ids = list(range(20, 40))
    with torch.inference_mode():
        draft = started(kind, target, ids).propose(ids, 5)
    n = 3 if kind.startswith("medusa") else 5  # Medusa drafts at most one token per head
    assert draft.tokens.shape == (n,) and draft.q.shape == (n, 96)
    assert torch.allclose(draft.q.sum(-1), torch.ones(n))
    assert torch.equal(draft.tokens, draft.q.argmax(-1))
    if kind.endswith("subset"):
        assert (draft.q[:, ::3] == 0).all() and (draft.tokens % 3 != 0).all()


def test_a_one_token_prompt_has_no_feature_to_draft_from(target):
    for kind in KINDS:
        with torch.inference_mode():
            assert started(kind, target, [7]).propose([7], 4).tokens.numel() == 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("keep", [0, 1, "all"])
def test_after_feedback_a_drafter_is_a_fresh_one(target, kind, keep):
    """Propose, keep some drafts, append the target's token: the next draft is what a
    drafter started on the whole new context would propose."""
    ids = list(range(30, 45))
    with torch.inference_mode():
        d = started(kind, target, ids)
        first = d.propose(ids, 4).tokens.tolist()
        n = len(first) if keep == "all" else keep
        context = ids + first[:n] + [5]
        h = hidden_of(target, context)
        d.feedback(n, hidden=h[len(ids) - 1:len(ids) + n])
        again = d.propose(context, 4)
        fresh = started(kind, target, context).propose(context, 4)
    assert torch.equal(again.tokens, fresh.tokens)
    assert torch.allclose(again.q, fresh.q, atol=1e-5)


@pytest.fixture(scope="module")
def baselines(target, small_vocab, prompts):
    """Each (model, prompt)'s greedy baseline, computed once."""
    out = []
    for model in (target, small_vocab):
        for prompt in prompts:
            prompt = [t % model.config.vocab_size for t in prompt]
            out.append((model, prompt, collect(baseline_generate(model, prompt, GenerationConfig(max_new_tokens=24)))[1]))
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k,dynamic,tree", [(1, False, 0), (3, False, 0), (5, False, 0), (2, True, 0),
                                            (1, False, 3), (4, False, 3), (7, False, 2), (3, True, 3)])
def test_greedy_speculative_equals_greedy_baseline(baselines, kind, k, dynamic, tree):
    cfg = GenerationConfig(max_new_tokens=24, k=k, dynamic_k=dynamic, draft_confidence=0.3 if dynamic else 0.0)
    accepted = rejected = drafted = 0
    for model, prompt, base in baselines:
        steps, end = collect(speculative_generate(model, make(kind, model, tree=tree), prompt, cfg))
        assert end.token_ids == base.token_ids
        assert all((s.tree is not None) == (tree > 1 and bool(s.draft)) for s in steps)
        accepted += end.stats.accepted
        drafted += end.stats.drafted
        rejected += sum(s.token_kind == "corrected" for s in steps)
    # Both paths ran. Dynamic k may rightly stop drafting for these random heads after a few
    # rejections (it follows measured timings), so there it must only have drafted.
    assert rejected and drafted and (accepted or dynamic)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_a_tree_budget_above_k_draws_a_branching_tree_and_stays_exact(baselines, kind):
    """With k = 4 a tree of k nodes was mostly a straight line; the app asks for 3k nodes."""
    cfg = GenerationConfig(max_new_tokens=24, k=4, tree_nodes_per_k=3)
    for model, prompt, base in baselines:
        steps, end = collect(speculative_generate(model, make(kind, model, tree=3), prompt, cfg))
        assert end.token_ids == base.token_ids
        first = next(s.tree for s in steps if s.draft)  # Medusa drafts from the second step on
        assert 4 < len(first.tokens) <= 12
        assert max(first.parents.count(p) for p in set(first.parents)) >= 2  # a node with two children


@pytest.mark.parametrize("kind", ["medusa", "eagle-subset", "eagle-deep"])
def test_a_tree_draft_is_a_valid_tree_and_leaves_the_cache_clean(target, kind):
    ids = list(range(30, 45))
    with torch.inference_mode():
        d = make(kind, target, tree=3)
        d.begin(ids, Processor(Sampling(), 96, ids, "cpu"), torch.Generator(), torch.device("cpu"),
                hidden=hidden_of(target, ids)[:-1], trees=True)
        draft = d.propose(ids, 6)
        parents = list(draft.parents)
        check_parents(parents)
        assert 1 < len(parents) <= 6 and draft.tokens.numel() == len(parents)
        # Keep the first branch root to leaf, then the target's token: the next proposal
        # is what a drafter started on that context proposes.
        path, node = [], -1
        while node in parents:
            node = parents.index(node)
            path.append(node)
        context = ids + [int(draft.tokens[n]) for n in path] + [5]
        h = hidden_of(target, context)
        d.feedback(len(path), hidden=h[len(ids) - 1:len(ids) + len(path)], path=path)
        d.tree_width = 0  # chains from here on: their q can be compared with a fresh drafter's
        again = d.propose(context, 3)
        fresh = started(kind, target, context).propose(context, 3)
    assert torch.equal(again.tokens, fresh.tokens) and torch.allclose(again.q, fresh.q, atol=1e-5)


@pytest.mark.parametrize("kind", ["eagle", "eagle-deep"])
def test_an_eagle_trees_greedy_branch_is_the_chain_draft(target, kind):
    """Each tree node reads its parent's predicted feature at its depth's position and attends
    to the context and its own ancestors only (in every layer): so the branch that takes the
    likeliest child at each depth, as far as the tree grew it, is the greedy chain's draft."""
    ids = list(range(30, 45))
    with torch.inference_mode():
        chain = started(kind, target, ids).propose(ids, 4).tokens.tolist()
        d = make(kind, target, tree=3)
        d.begin(ids, Processor(Sampling(), 96, ids, "cpu"), torch.Generator(), torch.device("cpu"),
                hidden=hidden_of(target, ids)[:-1], trees=True)
        draft = d.propose(ids, 12)
    parents, branch, node = list(draft.parents), [], -1
    while node in parents:  # children are listed likeliest first within a depth
        node = parents.index(node)
        branch.append(int(draft.tokens[node]))
    assert len(branch) >= 2 and branch == chain[:len(branch)]


class _Unpruned(Eagle):
    """The tree grown as before pruning: the `tree_width` likeliest nodes of every depth."""

    def _frontier(self, score, depth, d, budget, min_confidence=0.0):
        return sorted((n for n in range(len(score)) if depth[n] == d), key=lambda n: -score[n])[:self.tree_width]


@pytest.mark.parametrize("width,budget,confidence", [(2, 4, 0.0), (3, 4, 0.0), (3, 7, 0.0), (4, 9, 0.0),
                                                     (3, 9, 0.05), (3, 12, 0.2)])
def test_an_eagle_tree_skips_only_nodes_that_could_not_be_kept(target, width, budget, confidence):
    """Expanding only nodes among the budget - 1 likeliest (and, with a confidence threshold,
    only those that reach it) gives the same tree as expanding the tree_width likeliest of
    every depth, and feeds the head fewer rows overall."""
    rows = {"pruned": 0, "unpruned": 0}
    sizes = []
    for seed in range(6):
        ids = list(range(10 + seed, 30 + seed))
        got = {}
        for name, cls in (("pruned", Eagle), ("unpruned", _Unpruned)):
            torch.manual_seed(seed)
            head = EagleHead(eagle_config(target), None)
            for p in head.parameters():  # peaked enough that some branches are clearly unlikely
                p.data.mul_(3.0)
            d = cls(target, head.requires_grad_(False), tree_width=width)
            with torch.inference_mode():
                d.begin(ids, Processor(Sampling(), 96, ids, "cpu"), torch.Generator(), torch.device("cpu"),
                        hidden=hidden_of(target, ids)[:-1], trees=True)
                d._catch_up(ids)
                before = d.cache.length
                draft = d.propose(ids, budget, confidence)
                rows[name] += d.cache.length - before
            got[name] = (draft.tokens.tolist(), draft.parents)
        assert got["pruned"] == got["unpruned"]
        sizes.append(len(got["pruned"][0]))
    assert rows["pruned"] < rows["unpruned"]
    assert (min(sizes) < budget) == (confidence > 0), "the threshold, and only it, makes trees smaller than the budget"


def test_greedy_with_repetition_penalty_matches_too(target, prompts):
    cfg = GenerationConfig(max_new_tokens=25, k=3, sampling=Sampling(repetition_penalty=1.4))
    for prompt in prompts[1:]:
        _, base = collect(baseline_generate(target, prompt, cfg))
        for kind in KINDS:
            _, end = collect(speculative_generate(target, make(kind, target), prompt, cfg))
            assert end.token_ids == base.token_ids


@pytest.mark.slow  # thousands of sampled runs for a chi-square test
@pytest.mark.parametrize("kind", ["medusa-subset", "eagle-subset-bf16"])
def test_sampled_tokens_follow_the_target(kind):
    """Chi-square of the first three sampled tokens against the exact joint, with a head
    whose q is zero on one of the four tokens (the subset drops token 0 and 3). EAGLE's in
    bf16 only: its float32 sampled trees are checked in test_tree_sampling.py."""
    model = tiny_llama(vocab=4, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.3)
    joint = exact_joint(model, SAMPLING)
    counts, drafter = {}, make(kind, model)  # one drafter for every run: begin resets it
    for seed in range(N):
        cfg = GenerationConfig(max_new_tokens=3, k=3, sampling=Sampling(**{**SAMPLING.__dict__, "seed": seed}))
        _, end = collect(speculative_generate(model, drafter, PROMPT, cfg))
        counts[end.token_ids] = counts.get(end.token_ids, 0) + 1
    assert_matches(counts, joint)


# --- training -------------------------------------------------------------------------

def corpus_of(target, n: int = 6, top_k: int = 4, seed: int = 9, tokens: int = 20) -> Corpus:
    """Self-distillation in miniature: the target's greedy answers, its states and top-K."""
    g = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    seqs = []
    for i in range(n):
        prompt = torch.randint(0, vocab, (6,), generator=g).tolist()
        _, end = collect(baseline_generate(target, prompt, GenerationConfig(max_new_tokens=tokens)))
        ids = prompt + list(end.token_ids)
        with torch.inference_mode():
            h = target.model(torch.tensor([ids])).last_hidden_state[0]
            top = torch.softmax(target.lm_head(h), -1).topk(top_k)
        seqs.append(Seq(torch.tensor(ids), len(prompt), h.half(), top.indices, top.values.half(), f"s{seed}p{i}"))
    return Corpus(seqs, {"vocab": vocab})


def fit(recipe, loaded, corpus: Corpus, steps: int, lr: float, batch: int | None = None):
    """A fresh module trained `steps` AdamW steps (on the whole corpus, or seeded batches):
    (module in eval mode, each step's loss, the last step's metrics)."""
    torch.manual_seed(0)
    module = recipe.build(loaded, corpus)
    opt = torch.optim.AdamW(module.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        seqs = corpus.sequences if batch is None else sample_batch(corpus, step, batch, 0, 64)
        loss, metrics = recipe.loss(module, loaded, seqs)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return module.eval(), losses, metrics


@pytest.mark.parametrize("recipe", [MedusaRecipe(heads=2, subset=48), EagleRecipe(subset=48), EagleRecipe(subset=0)],
                         ids=["medusa", "eagle-subset", "eagle-full"])
def test_a_few_training_steps_lower_the_loss_and_the_result_reloads(target, recipe):
    loaded = SimpleNamespace(model=target, eos_token_ids=(0,))
    corpus = corpus_of(target)
    module, losses, metrics = fit(recipe, loaded, corpus, 30, 3e-3)
    assert losses[-1] < 0.7 * losses[0] and all(isinstance(v, float) for v in metrics.values())
    # The config and weights are all a file needs: the rebuilt drafter drafts the same.
    rebuild = medusa_from if recipe.kind == "medusa" else eagle_from
    state = {k: v.detach().half() if v.is_floating_point() else v for k, v in module.state_dict().items()}
    again = rebuild(recipe.config(module), state, loaded)
    ids = corpus.sequences[0].ids.tolist()[:12]
    with torch.inference_mode():
        trained = started_with(recipe.drafter(module, loaded), target, ids).propose(ids, 3)
        reloaded = started_with(again, target, ids).propose(ids, 3)
    assert trained.tokens.numel() and torch.allclose(trained.q, reloaded.q, atol=2e-2)


def started_with(d, target, ids):
    d.begin(ids, Processor(Sampling(), 96, ids, "cpu"), torch.Generator(), torch.device("cpu"), hidden=hidden_of(target, ids)[:-1])
    return d


def test_unrolled_loss_at_depth_1_is_the_teacher_forced_loss(target):
    """Depth 1 is one teacher-forced pass: smooth-L1 to the next feature plus 0.5 x the
    cross-entropy to the target's top-K, averaged over positions; deeper unrolls add terms."""
    loaded = SimpleNamespace(model=target, eos_token_ids=(0,))
    seqs = corpus_of(target).sequences  # all of one length: no padding
    torch.manual_seed(0)
    one, four = EagleRecipe(subset=48, unroll=1, noise=0.0), EagleRecipe(subset=48, unroll=4, noise=0.0)
    head = one.build(loaded, Corpus(seqs))
    ids = torch.stack([s.ids for s in seqs])
    h, top_p = torch.stack([s.hidden for s in seqs]).float(), torch.stack([s.top_p for s in seqs]).float()
    top_ids = torch.stack([s.top_ids for s in seqs])
    with torch.no_grad():
        pred = head(h[:, :-1], target.model.embed_tokens(ids[:, 1:]))
        lm = TargetHead(target, head.subset)
        logq = torch.log_softmax(lm.logits(pred), -1)
        col = lm.positions(top_ids[:, 1:])
        ce = -(top_p[:, 1:] * logq.gather(-1, col.clamp(min=0)) * (col >= 0)).sum(-1).mean()
        expected = torch.nn.functional.smooth_l1_loss(pred, h[:, 1:]) + 0.5 * ce
        loss, metrics = one.loss(head, loaded, seqs)
        deeper, deep_metrics = four.loss(head, loaded, seqs)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert deep_metrics["ce1"] == pytest.approx(metrics["ce1"], rel=1e-5) and deeper > loss
    assert {"ce4", "top1_4"} <= deep_metrics.keys()


@pytest.mark.parametrize("kind", ["eagle", "eagle-subset", "eagle-deep", "medusa-subset"])
def test_teacher_forced_drafts_are_the_drafters_own(target, kind):
    """On the text its own drafts make, the recipe's one-pass depth-d prediction after context
    x_<n is the drafter's draft d: same positions, features, attention and subset."""
    loaded = SimpleNamespace(model=target, eos_token_ids=(0,))
    recipe = MedusaRecipe() if kind.startswith("medusa") else EagleRecipe(depth=2 if kind.endswith("deep") else 0)
    ids = list(range(30, 50))
    for n in (3, 9, 20):
        with torch.inference_mode():
            d = started(kind, target, ids[:n])
            draft = d.propose(ids[:n], 4).tokens.tolist()
            text = ids[:n] + draft[:-1]
            h = hidden_of(target, text)
            seq = Seq(torch.tensor(text), n, h, torch.zeros(len(text), 1, dtype=torch.long), torch.zeros(len(text), 1))
            module = d.heads if kind.startswith("medusa") else d.head
            forced = recipe.drafts(module, loaded, [seq], 4)[0]
        assert forced[n, :len(draft)].tolist() == draft


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
@pytest.mark.parametrize("native, switch, want", [(True, None, torch.bfloat16), (False, None, torch.float32),
                                                  (True, "0", torch.float32)])
def test_a_loaded_head_drafts_in_bf16_only_where_the_cpu_multiplies_bf16(target, baselines, kind, native, switch,
                                                                        want, monkeypatch):
    """A saved head beside an fp32 CPU target computes in bf16 where the CPU has native bf16
    (packing.draft_dtype; SPECVIZ_DRAFT_BF16=0 keeps fp32), LM-head rows included. Its drafts are
    the fp32 head's but for rounding, and the output is still the target's: the target verifies."""
    from specviz.modeling import packing

    monkeypatch.setattr(packing, "native_bf16", lambda: native)
    if switch is None:
        monkeypatch.delenv("SPECVIZ_DRAFT_BF16", raising=False)
    else:
        monkeypatch.setenv("SPECVIZ_DRAFT_BF16", switch)
    loaded = SimpleNamespace(model=target, eos_token_ids=(0,))
    recipe = MedusaRecipe(heads=2, subset=48) if kind == "medusa" else EagleRecipe(subset=48)
    corpus = corpus_of(target)
    module, _, _ = fit(recipe, loaded, corpus, 10, 3e-3)
    rebuild = medusa_from if kind == "medusa" else eagle_from
    state = {k: v.detach().half() if v.is_floating_point() else v for k, v in module.state_dict().items()}
    drafter = rebuild(recipe.config(module), state, loaded)
    lm = drafter.head if kind == "medusa" else drafter.lm
    head = drafter.heads if kind == "medusa" else drafter.head
    assert {p.dtype for p in head.parameters()} == {want} and lm.weight.dtype == want
    assert target.lm_head.weight.dtype == torch.float32  # the target itself is untouched

    ids = corpus.sequences[0].ids.tolist()[:12]
    with monkeypatch.context() as m:
        m.setenv("SPECVIZ_DRAFT_BF16", "0")
        fp32 = rebuild(recipe.config(module), state, loaded)
    with torch.inference_mode():
        mine = started_with(drafter, target, ids).propose(ids, 3)
        ref = started_with(fp32, target, ids).propose(ids, 3)
    assert mine.q.dtype == torch.float32 and torch.allclose(mine.q.sum(-1), torch.ones(len(mine.q)))
    assert torch.allclose(mine.q[0], ref.q[0], atol=2e-2)  # the same first distribution, but for rounding
    if want is torch.float32:
        assert torch.equal(mine.tokens, ref.tokens) and torch.equal(mine.q, ref.q)
    for tree in (0, 3):
        cfg = GenerationConfig(max_new_tokens=24, k=3)
        for model, prompt, base in baselines[:4]:  # the target's (vocabulary 96) prompts
            fresh = rebuild(recipe.config(module), state, loaded)
            fresh.tree_width = tree
            assert collect(speculative_generate(model, fresh, prompt, cfg))[1].token_ids == base.token_ids
