"""The block drafter (drafters/block.py): a whole block of drafts from one forward, exactly verified.

With random weights it drafts badly, which is the point: whatever it proposes, greedy output is the
target's token for token, and one sampled step emits the target's law exactly (every draft and every
coin enumerated, the block's own q and the verifier's own arithmetic), at block sizes 1, 2 and 16.
Its training recipe learns, resumes to the same weights, and drafts in the engine what it drafted
in training; a file for another target, a truncated file and a block longer than the file's are
refused in a sentence.
"""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_llama
from specviz import GenerationConfig, Sampling, baseline_generate, collect, speculative_generate
from specviz.core.errors import SpecvizError
from specviz.core.sampling import Processor
from specviz.drafters.block import BlockDrafter, BlockHead, block_config
from specviz.drafters.trained import load_drafter
from specviz.run.spec import check_length, make_drafter, parse
from specviz.train.block import BlockRecipe
from specviz.train.config import TrainConfig
from specviz.train.data import load_data
from specviz.train.loop import train
from test_block_verify import block_outcomes, gap, law, target_law, token_outcomes
from app_server import PROMPT, app_models  # noqa: F401  (app_models is a fixture: tiny target, tiny block file)
from test_heads import hidden_of
from test_train import data, tiny  # noqa: F401  (the tiny target folder and its self-distilled data)

TINY_BLOCK = BlockRecipe(subset=64, block=4, anchors=4)


def head_for(model, block: int = 16, seed: int = 0, subset: torch.Tensor | None = None) -> BlockHead:
    """A random block head; its mask and weights scaled so that drafts differ from position to position."""
    torch.manual_seed(seed)
    head = BlockHead(block_config(model, block, 2, 0 if subset is None else subset.numel()), subset)
    with torch.no_grad():
        head.mask.normal_(0, 1.0)
        for layer in head.layers:  # sharp attention, so that each position attends to its own mix
            for w in (layer.q.weight, layer.k.weight):
                w.mul_(6.0)
        head.norm.weight.mul_(4.0)  # and q far from uniform
    return head.requires_grad_(False)


def started(model, head, ids, tree=0, sampling=None):
    d = BlockDrafter(model, head, tree_width=tree)
    processor = Processor(sampling or Sampling(), model.config.vocab_size, ids, "cpu")
    d.begin(ids, processor, torch.Generator().manual_seed(0), torch.device("cpu"), hidden=hidden_of(model, ids)[:-1])
    return d


@pytest.fixture(scope="module")
def small_vocab():
    """Eight tokens: random drafts are often right, so accepted drafts and bonus tokens occur too."""
    return tiny_llama(vocab=8, seed=5)


def test_one_forward_gives_every_position_and_q_does_not_depend_on_k(target):
    ids = list(range(20, 40))
    with torch.inference_mode():
        d = started(target, head_for(target), ids)
        full, two = d.propose(ids, 16), d.propose(ids, 2)
    assert full.tokens.shape == (16,) and full.q.shape == (16, 96) and full.parallel
    assert torch.allclose(full.q.sum(-1), torch.ones(16)) and torch.equal(full.tokens, full.q.argmax(-1))
    assert torch.equal(two.q, full.q[:2]) and torch.equal(two.tokens, full.tokens[:2])
    assert not torch.allclose(full.q[0], full.q[1])  # each placeholder sits at its own place


def test_after_feedback_the_drafter_is_a_fresh_one(target):
    """Propose, keep some drafts, append the target's token: the next block is what a drafter begun on
    the whole new context drafts (the kept tokens' features joined the context, the block left nothing)."""
    ids, head = list(range(30, 45)), head_for(target)
    with torch.inference_mode():
        for keep in (0, 2, 4):
            d = started(target, head, ids)
            first = d.propose(ids, 4).tokens.tolist()
            context = ids + first[:keep] + [5]
            d.feedback(keep, hidden=hidden_of(target, context)[len(ids) - 1:len(ids) + keep])
            again, fresh = d.propose(context, 4), started(target, head, context).propose(context, 4)
            assert torch.equal(again.tokens, fresh.tokens) and torch.allclose(again.q, fresh.q, atol=1e-5)


@pytest.mark.parametrize("block, k", [(1, 1), (2, 2), (16, 16), (16, 2)])
@pytest.mark.parametrize("tree", [0, 3])
def test_greedy_output_is_the_baselines(target, small_vocab, prompts, block, k, tree):
    cfg = GenerationConfig(max_new_tokens=20, k=k)
    kept = 0
    for model in (target, small_vocab):
        head = head_for(model, block)
        for prompt in prompts[1:]:
            prompt = [t % model.config.vocab_size for t in prompt]
            _, base = collect(baseline_generate(model, prompt, cfg))
            steps, end = collect(speculative_generate(model, BlockDrafter(model, head, tree_width=tree), prompt, cfg))
            assert end.token_ids == base.token_ids
            assert all(s.parallel and len(s.draft) <= max(k, 2 * k if tree else k) for s in steps if s.draft)
            assert all(len(s.q_top) == len(s.draft) for s in steps)  # each position's candidates, trees too
            kept += end.stats.accepted
    assert kept  # accepted drafts (on the eight-token model) were exercised, not only rejections


V = 3  # test_block_verify's vocabulary: every draft and every coin of a step is enumerated


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("rule", ["token", "block"])
def test_one_sampled_step_emits_the_targets_law(rule, k):
    """A real block head's q at each position (what propose hands the verifier) and the verifier's own
    rule: over every draft d ~ q_1 x .. x q_k and every coin, the first k + 1 tokens follow the target's
    law, float64 to 1e-12 (test_block_verify.py's proof, with the block's q and a real tiny target)."""
    model = tiny_llama(vocab=V, seed=7)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.2)  # soften: every continuation has real mass
    prompt, sampling = [0, 1, 2, 1, 0, 2], Sampling(temperature=1.3, top_k=2)
    with torch.inference_mode():
        for seed in range(2):
            d = started(model, head_for(model, 4, seed), prompt, sampling=sampling)
            q = d.propose(prompt, k).q.double()
            rows = {}

            def target(prefix, rows=rows):
                if prefix not in rows:
                    ctx = prompt + list(prefix)
                    logits = model(torch.tensor([ctx])).logits[0, -1:]
                    row = Processor(sampling, V, ctx, "cpu").probs(logits)[0].double()
                    rows[prefix] = row / row.sum()  # float64 to the last digit, as the proof's own models
                return rows[prefix]

            drafter = lambda prefix: q[len(prefix)] / q[len(prefix)].sum()  # no position reads the drafts
            outcomes = token_outcomes if rule == "token" else block_outcomes
            assert gap(law(target, drafter, k, outcomes), target_law(target, k)) < 1e-12


def test_each_sampled_draft_is_a_draw_from_its_own_positions_q():
    """What the proof above assumes of propose: d_j ~ q_j, the very row it hands the verifier, whatever
    was drawn before j (chi-square per position and on pairs, over 900 seeded proposes)."""
    from scipy.stats import chisquare

    model = tiny_llama(vocab=V, seed=7)
    prompt, sampling = [0, 1, 2, 1, 0, 2], Sampling(temperature=1.0)
    with torch.inference_mode():
        d = started(model, head_for(model, 4, 1), prompt, sampling=sampling)
        q = d.propose(prompt, 3).q.double()
        q = q / q.sum(-1, keepdim=True)
        draws = torch.stack([(d.generator.manual_seed(seed), d.propose(prompt, 3).tokens)[1] for seed in range(900)])
    for j in range(3):
        observed = torch.bincount(draws[:, j], minlength=V).double()
        assert chisquare(observed, q[j] * len(draws)).pvalue > 1e-3
    pairs = torch.bincount(draws[:, 0] * V + draws[:, 1], minlength=V * V).double()  # independent given the context
    assert chisquare(pairs, torch.outer(q[0], q[1]).reshape(-1) * len(draws)).pvalue > 1e-3


def test_a_block_longer_than_the_files_is_refused_in_a_sentence(target):
    d = BlockDrafter(target, head_for(target, 8))
    check_length(d, 8)
    with pytest.raises(SpecvizError, match=r"trained for blocks of up to 8 tokens and k = 9") as e:
        check_length(d, 9)
    assert "\n" not in str(e.value)


# --- training ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tiny, data, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("block")
    cfg = TrainConfig(steps=12, batch=4, lr=3e-3, held_out=4, eval_tokens=6, checkpoint_every=5)
    card = train(TINY_BLOCK, tiny, load_data(tiny, data[1]), out, cfg, progress=False)
    return out, card, cfg


def test_a_few_steps_lower_the_loss_at_every_position(target):
    from types import SimpleNamespace

    from test_heads import corpus_of, fit

    loaded = SimpleNamespace(model=target, name="tiny", eos_token_ids=(), device=torch.device("cpu"))
    recipe = BlockRecipe(subset=48, block=4, anchors=4)
    corpus = corpus_of(target)
    torch.manual_seed(0)  # as fit seeds it: the same initial weights and the same first anchors
    before = recipe.loss(recipe.build(loaded, corpus), loaded, corpus.sequences)[0].item()
    module, losses, metrics = fit(recipe, loaded, corpus, 30, 3e-3)
    assert losses[-1] < 0.7 * losses[0] and losses[0] == pytest.approx(before, rel=1e-4)
    assert set(metrics) == {"ce1", "top1_1", "top1_2", "top1_4"}


def test_training_writes_a_card_with_held_out_tau(trained):
    out, card, _ = trained
    text = (out / "block.md").read_text()
    assert "tau (greedy, k=4)" in text and "tau (greedy, tree of 4 nodes)" in text and "block: 4" in text
    assert card["held-out"]["first drafts equal to the teacher-forced ones"].split(" / ")[0] == \
        card["held-out"]["first drafts equal to the teacher-forced ones"].split(" / ")[1]  # training drafts as the engine


def test_resume_continues_to_the_same_result(tiny, data, trained, tmp_path):  # noqa: F811
    """Interrupted at step 7 and resumed: the weights an unbroken run saved, bit for bit (anchors are
    drawn afresh each step from the loop's per-step seed)."""
    from safetensors.torch import load_file

    whole_dir, _, cfg = trained
    corpus = load_data(tiny, data[1])
    assert train(TINY_BLOCK, tiny, corpus, tmp_path, cfg, progress=False, stop_after=7) == {"stopped_at": 7}
    torch.randn(5)  # whatever else this process draws in between
    train(TINY_BLOCK, tiny, corpus, tmp_path, cfg, progress=False, resume=True)
    whole, split = load_file(whole_dir / "block.safetensors"), load_file(tmp_path / "block.safetensors")
    assert whole.keys() == split.keys() and all(torch.equal(whole[k], split[k]) for k in whole)


def test_the_saved_file_loads_by_path_and_drafts_exactly(tiny, trained):  # noqa: F811
    drafter = make_drafter(f"block:{trained[0] / 'block.safetensors'}", tiny)
    assert isinstance(drafter, BlockDrafter) and drafter.max_draft == 4
    assert parse(f"block:{trained[0] / 'block.safetensors'}").label == "block drafter (block.safetensors)"
    ids = tiny.tokenizer("the cat sat on the mat")["input_ids"]
    cfg = GenerationConfig(max_new_tokens=12, k=4)
    _, base = collect(baseline_generate(tiny.model, ids, cfg))
    assert collect(speculative_generate(tiny.model, drafter, ids, cfg))[1].token_ids == base.token_ids


def test_a_file_for_another_target_or_truncated_is_refused_in_a_sentence(tiny, trained, tmp_path):  # noqa: F811
    from dataclasses import replace

    path = trained[0] / "block.safetensors"
    other = replace(tiny, model=tiny_llama(vocab=tiny.model.config.vocab_size, hidden=32), name="other")
    with pytest.raises(SpecvizError, match="cannot draft for this target: it was trained for") as e:
        load_drafter(path, other)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(SpecvizError, match="is not a drafter file") as f:
        make_drafter(f"block:{cut}", tiny)
    assert "\n" not in str(e.value) and "\n" not in str(f.value)


# --- shown from the inside ---------------------------------------------------------------------

def block_step(n, accepted, k=4):
    """A hand-made block step: positions 1..k drafted token 10 + j, each with its three candidates."""
    from test_render import step

    q_top = tuple(((10 + j, 0.6), (20 + j, 0.3), (30 + j, 0.1)) for j in range(k))
    return step(n, [10 + j for j in range(k)], accepted, 99, parallel=True, q=tuple(0.6 for _ in range(k)), q_top=q_top)


def block_labels(k=4):
    from specviz.render.trace import Labels

    return Labels(draft=tuple(f"d{j}" for j in range(k)), token="t",
                  q_top=tuple((f"d{j}", f"x{j}", f"y{j}") for j in range(k)), top=("t", "z"))


def test_the_inspector_shows_each_positions_candidates_and_where_acceptance_stopped():
    import re

    from specviz.render.inspect import step_html
    from test_render import spec_trace

    html = step_html(spec_trace((block_step(0, 2), block_labels())), 0)
    block = html[html.index('<div class="sv-block"'):]
    assert re.findall(r'<tr data-kind="(\w+)"', block) == ["accepted", "accepted", "rejected", "unchecked"]
    assert block.count("sv-cand-drafted") == 4 and ">x3</code> 0.30" in block  # every position's candidates, q
    assert "Acceptance stopped at position 3 of 4: positions 1-2 were kept" in block and "never checked" in block
    kept = step_html(spec_trace((block_step(0, 4), block_labels())), 0)
    assert "Every position of the block was kept (4 of 4)" in kept
    from test_render import step

    other = step_html(spec_trace((step(0, [1, 2], 1, 3), block_labels(2))), 0)
    assert "sv-block" not in other  # other drafters' steps are shown as before


def test_the_overlay_predicts_the_block_from_its_acceptance_by_position_and_the_verify_curve():
    """Four steps kept 4, 2, 1 and 0 of 4 drafts: alpha by position 3/4, 2/3, 1/2, 1/1; the prediction
    is (1 + 3/4 + 1/2 + 1/4 + 1/4) / (drafting + v(5)), and the same numbers price blocks of 1-4."""
    import html

    from specviz.engine.verify_cost import VerifyCurve
    from specviz.render.charts import position_figure
    from specviz.render.numbers import headline, headline_html
    from test_render import Trace, _ended, spec_trace

    spec = _ended(spec_trace(*[(block_step(n, a), block_labels()) for n, a in enumerate((4, 2, 1, 0))]),
                  tokens=16, steps=4, target_calls=5, drafted=16, accepted=7, draft_time=0.04, verify_time=0.4,
                  elapsed=0.5)
    base = _ended(Trace("baseline", speculative=False), tokens=16, steps=16, target_calls=17, verify_time=1.6,
                  elapsed=1.7, prefill_time=0.0)
    curve = VerifyCurve((1, 2, 4, 8), (0.1, 0.1, 0.12, 0.14), 1)  # v(2) = 1, v(3) = 1.1, v(4) = 1.2, v(5) = 1.25
    h = headline(spec, base, curve)
    assert h.positions == pytest.approx((3 / 4, 2 / 3, 1 / 2, 1.0))
    # drafting 0.01 s a step = 0.1 target steps; tokens a step 1 + 3/4 + 1/2 + 1/4 + 1/4 = 2.75
    assert h.predicted == pytest.approx(2.75 / (0.1 + 1.25))
    assert h.by_block == pytest.approx((1.75 / 1.1, 2.25 / 1.2, 2.5 / 1.3, 2.75 / 1.35))
    text = html.unescape(headline_html(h))
    assert "α by position 0.75 / 0.67 / 0.50 / 1.00" in text and "a block of 4 would give 2.04×" in text
    fig = position_figure(spec)
    assert fig.layout.title.text.startswith("Acceptance by position within the block")
    assert list(fig.data[1].y) == pytest.approx([3 / 4, 2 / 4, 1 / 4, 1 / 4])  # kept through here, of all steps


def test_the_playground_and_compare_run_it_like_every_drafter(app_models):  # noqa: F811
    """Through the app's own runner: a block run's steps are block steps and its inspector opens them;
    Compare runs it beside prompt lookup; a k its file cannot draft is that arm's one-sentence error."""
    from specviz.modeling import models as real_models
    from specviz.render.inspect import step_html
    from specviz.run.settings import Settings
    from specviz.ui import Policy
    from specviz.ui.live import runner
    from specviz.ui.live.compare import compare_drafters

    never = lambda: False  # noqa: E731
    s = Settings(prompt=PROMPT, target=app_models["target"], drafter=app_models["block"], max_new_tokens=12, k=4)
    *_, frame = runner.playground(s, Policy(), real_models, never)
    assert frame.state == "done" and frame.spec.token_ids == frame.base.token_ids
    assert all(e.parallel for e in frame.spec.steps if e.draft)
    assert 'class="sv-block"' in step_html(frame.spec, 0)
    *_, frame = compare_drafters(s, Policy(), real_models, never, rounds=1, drafters=["prompt lookup", app_models["block"]])
    assert frame.state == "done" and all(r.done for r in frame.runs)
    *_, frame = compare_drafters(replace_k(s, 9), Policy(), real_models, never, rounds=1, drafters=[app_models["block"]])
    assert "trained for blocks of up to 8 tokens and k = 9" in frame.runs[0].error


def replace_k(s, k):
    from dataclasses import replace

    return replace(s, k=k)
