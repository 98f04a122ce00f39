"""Training: the prompt set, self-distillation data, the loop (loss falls, resume is exact), the CLI."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch

from conftest import tiny_llama
from specviz.cli.main import main as cli_main
from specviz.core.errors import SpecvizError
from specviz.modeling import models
from specviz.train import command
from specviz.train.batches import sample_batch
from specviz.train.config import TrainConfig
from specviz.train.data import PROMPTS, build_data, choose_subset, load_data, read_prompts
from specviz.train.draft import DraftRecipe
from specviz.train.eagle import EagleRecipe
from specviz.train.evaluate import teacher_forced, through_engine
from specviz.train.loop import learning_rate, train
from specviz.train.medusa import MedusaRecipe
from test_heads import corpus_of, fit

from tiny_folder import make_tiny_model_dir

BENCH = PROMPTS.parents[1] / "bench" / "default.jsonl"
TINY_RECIPE = DraftRecipe(subset=96, hidden=32, layers=1, heads=2, ffn=64)
TINY_EAGLE = EagleRecipe(subset=64, unroll=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny")
    return models.load(str(folder), device="cpu")


@pytest.fixture(scope="module")
def data(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    prompts = root / "prompts.jsonl"
    words = "the cat sat on the mat and said hello world to a big red dog".split()
    with open(prompts, "w") as f:
        for i in range(24):
            text = " ".join(words[(i + j) % len(words)] for j in range(4 + i % 9))
            f.write(json.dumps({"id": f"p{i}", "prompt": text}) + "\n")
    folder = build_data(tiny, root / "cache", prompts=prompts, passes=2, max_new_tokens=20, batch=8,
                        progress=False)
    return prompts, folder


# --- the prompt set ---------------------------------------------------------------------

def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def _bench_texts() -> list[str]:
    texts = []
    for line in BENCH.read_text().splitlines():
        row = json.loads(line)
        turns = row.get("turns") or [{"content": row.get("prompt", "")}]
        texts += [t["content"] for t in turns]
    return texts


def test_prompt_set_is_large_varied_and_well_formed():
    rows = read_prompts()
    assert len(rows) >= 400
    assert len({r["id"] for r in rows}) == len(rows)
    assert len({r["prompt"] for r in rows}) == len(rows)
    cats = {r["category"] for r in rows}
    assert {"chat", "code", "reasoning", "summarisation", "translation", "rewriting"} <= cats
    assert all(sum(r["category"] == c for r in rows) >= 40 for c in cats)


def test_prompt_set_shares_no_text_with_the_benchmark():
    """No prompt repeats a benchmark prompt, nor any run of 8 words from one (passages included)."""
    def grams(text, n=8):
        w = _words(text)
        return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}

    bench = set().union(*(grams(t) for t in _bench_texts()))
    bench_exact = {t.strip().lower() for t in _bench_texts()}
    for r in read_prompts():
        assert r["prompt"].strip().lower() not in bench_exact, r["id"]
        assert not grams(r["prompt"]) & bench, r["id"]


def test_bad_prompt_files_are_readable_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(SpecvizError, match="bad.jsonl:2"):
        read_prompts(bad)
    bad.write_text('{"id": "x"}\n')
    with pytest.raises(SpecvizError, match="prompt"):
        read_prompts(bad)
    with pytest.raises(SpecvizError, match="not found"):
        read_prompts(tmp_path / "missing.jsonl")


# --- the data ---------------------------------------------------------------------------

def test_data_holds_the_targets_own_text_hidden_states_and_top_k(tiny, data):
    _, folder = data
    corpus = load_data(tiny, folder)
    assert len(corpus.sequences) == 48  # 24 prompts x 2 passes
    head = tiny.model.get_output_embeddings()
    for s in corpus.sequences[:6]:
        t = len(s.ids)
        assert s.hidden.shape == (t, tiny.model.config.hidden_size) and s.hidden.dtype == torch.float16
        assert s.top_ids.shape == s.top_p.shape == (t, 32)
        assert 0 < s.response_start < t
        # The hidden state is the LM head's input: its argmax is the top-1 token recorded.
        with torch.no_grad():
            assert torch.equal(head(s.hidden.float()).argmax(-1), s.top_ids[:, 0])
        assert bool((s.top_p[:, :-1] >= s.top_p[:, 1:]).all())
    greedy = [s for s in corpus.sequences if s.variant == "greedy"]
    for s in greedy[:4]:  # greedy responses follow the target's argmax token by token
        r = s.response_start
        assert torch.equal(s.ids[r:], s.top_ids[r - 1:-1, 0])


def test_building_again_resumes_and_adds_nothing(tiny, data):
    prompts, folder = data
    before = sorted(p.name for p in folder.glob("shard-*.pt"))
    build_data(tiny, folder, prompts=prompts, passes=2, max_new_tokens=20, batch=8, progress=False)
    assert sorted(p.name for p in folder.glob("shard-*.pt")) == before
    with pytest.raises(SpecvizError, match="other settings"):
        build_data(tiny, folder, prompts=prompts, passes=2, max_new_tokens=21, progress=False)


def test_split_holds_out_whole_prompts_deterministically(tiny, data):
    corpus = load_data(tiny, data[1])
    train_a, held_a = corpus.split(5)
    train_b, held_b = corpus.split(5)
    held_ids = {s.prompt_id for s in held_a.sequences}
    assert len(held_ids) == 5 and [s.prompt_id for s in held_b.sequences] == [s.prompt_id for s in held_a.sequences]
    assert all(s.variant == "greedy" for s in held_a.sequences)
    assert not held_ids & {s.prompt_id for s in train_a.sequences}
    assert len(train_a.sequences) == 48 - 10
    counts = corpus.token_counts(tiny.vocab_size)
    assert int(counts.sum()) == corpus.tokens


def test_missing_data_is_a_readable_error(tiny, tmp_path):
    with pytest.raises(SpecvizError, match="no training data"):
        load_data(tiny, tmp_path)


# --- the loop ---------------------------------------------------------------------------

def test_subset_keeps_the_most_frequent_tokens_and_eos():
    counts = torch.tensor([0, 5, 1, 9, 0, 3])
    assert choose_subset(counts, 2, always=(4,)).tolist() == [1, 3, 4]
    assert choose_subset(counts, 5).tolist() == [0, 1, 2, 3, 5]  # a tie goes to the lower id
    assert choose_subset(counts, 10, unseen=False).tolist() == [1, 2, 3, 5]  # never-seen tokens left out


def test_schedule_and_batches_are_pure_functions_of_the_step(tiny, data):
    corpus = load_data(tiny, data[1])
    a = sample_batch(corpus, 7, 4, seed=3, window=10)
    b = sample_batch(corpus, 7, 4, seed=3, window=10)
    assert [torch.equal(x.ids, y.ids) for x, y in zip(a, b)] == [True] * 4
    assert all(len(x.ids) <= 10 for x in a)
    assert learning_rate(0, 100, 1.0, 10) == pytest.approx(0.1)
    assert learning_rate(10, 100, 1.0, 10) == pytest.approx(1.0)
    assert learning_rate(100, 100, 1.0, 10) == pytest.approx(0.1)


def test_training_goes_over_the_data_in_epochs(tiny, data):
    """Each epoch is a shuffle that visits every sequence once; epochs set the step count."""
    corpus = load_data(tiny, data[1])  # 48 sequences: 12 batches of 4 per epoch
    epoch = [id(s) for step in range(12) for s in sample_batch(corpus, step, 4, seed=3, window=10_000)]
    assert sorted(epoch) == sorted(id(s) for s in corpus.sequences)
    second = [id(s) for step in range(12, 24) for s in sample_batch(corpus, step, 4, seed=3, window=10_000)]
    assert sorted(second) == sorted(epoch) and second != epoch
    assert TrainConfig(steps=5, epochs=2.5, batch=4).for_data(48).steps == 30
    with pytest.raises(SpecvizError, match="epochs"):
        TrainConfig(epochs=0).check()


def test_training_lowers_the_loss_and_writes_weights_and_card(tiny, data, tmp_path):
    corpus = load_data(tiny, data[1])
    cfg = TrainConfig(steps=40, batch=4, lr=1e-2, held_out=4, eval_tokens=12)
    card = train(TINY_RECIPE, tiny, corpus, tmp_path, cfg, progress=False)
    t = card["training"]
    # The floor is the target's own entropy (high for a random tiny target), so ask for a clear drop.
    assert t["train loss (mean of last 10%)"] < t["train loss (first 10 steps)"] - 0.4
    held = card["held-out"]
    assert held["prompts"] == 4
    assert held["loss"] < t["train loss (first 10 steps)"]  # what it learned carries to prompts it never saw
    # Each step emits the target's token plus at most k = 4 drafts, accepted at rate alpha (rounded on the card).
    assert 1.0 <= held["tau (greedy, k=4)"] <= 1.0 + 4 * held["alpha (greedy, k=4)"] + 1e-3
    # Teacher-forced top-1 at depths 1-4 and the engine's acceptance at the same depths; at
    # depth 1 they agree at the steps the engine took, where every first draft is the teacher-forced one.
    assert len(held["top-1 teacher-forced, every position (depth 1-4)"]) == 4
    assert len(held["acceptance in the engine, greedy chain (depth 1-4)"]) == 4
    forced, engine = held["depth 1 at the engine's steps (teacher-forced / engine)"]
    assert forced == pytest.approx(engine, abs=1e-3)
    same, compared = map(int, held["first drafts equal to the teacher-forced ones"].split(" / "))
    assert same == compared > 0
    assert t["epochs"] == 4.0 and card["recipe"]["layers"] == 1  # 40 steps x 4 over 40 training sequences
    assert (tmp_path / "draft.safetensors").is_file() and (tmp_path / "checkpoint.pt").is_file()
    text = (tmp_path / "draft.md").read_text()
    assert "held-out" in text and "alpha" in text and "steps: 40" in text and "depth 1-4" in text


@pytest.mark.parametrize("recipe", [TINY_RECIPE, EagleRecipe(subset=64, unroll=2)], ids=["draft", "eagle"])
def test_resume_continues_to_the_same_result(tiny, data, tmp_path, recipe):
    """Also for EAGLE, whose input noise is drawn afresh each step."""
    from safetensors.torch import load_file

    corpus = load_data(tiny, data[1])
    cfg = TrainConfig(steps=16, batch=4, lr=3e-3, held_out=4, eval_tokens=4, checkpoint_every=5)
    name = f"{recipe.kind}.safetensors"
    train(recipe, tiny, corpus, tmp_path / "whole", cfg, progress=False)
    assert train(recipe, tiny, corpus, tmp_path / "split", cfg, progress=False, stop_after=7) == {"stopped_at": 7}
    assert not (tmp_path / "split" / name).exists()
    torch.randn(5)  # whatever else this process draws in between
    train(recipe, tiny, corpus, tmp_path / "split", cfg, progress=False, resume=True)
    whole = load_file(tmp_path / "whole" / name)
    split = load_file(tmp_path / "split" / name)
    assert whole.keys() == split.keys()
    assert all(torch.equal(whole[k], split[k]) for k in whole)


@pytest.mark.parametrize("recipe", [TINY_RECIPE, MedusaRecipe(heads=2, subset=64), TINY_EAGLE],
                         ids=["draft", "medusa", "eagle"])
def test_init_starts_from_a_saved_drafter(tiny, data, tmp_path, recipe):
    """init=FILE: step 0 starts from the saved weights (fine-tuning), not from new ones."""
    from safetensors.torch import load_file

    corpus = load_data(tiny, data[1])
    name = f"{recipe.kind}.safetensors"
    train(recipe, tiny, corpus, tmp_path / "first", TrainConfig(steps=12, batch=4, lr=1e-2, held_out=4,
                                                                eval_tokens=4), progress=False)
    still = TrainConfig(steps=1, batch=4, lr=1e-9, held_out=4, eval_tokens=4)  # one step that moves nothing
    train(recipe, tiny, corpus, tmp_path / "tuned", still, init=tmp_path / "first" / name, progress=False)
    train(recipe, tiny, corpus, tmp_path / "fresh", still, progress=False)
    first, tuned, fresh = (load_file(tmp_path / run / name) for run in ("first", "tuned", "fresh"))
    assert first.keys() == tuned.keys()
    assert all(torch.allclose(tuned[k].float(), first[k].float(), rtol=1e-3, atol=1e-6) for k in first)
    assert not all(torch.allclose(fresh[k].float(), first[k].float(), rtol=1e-3, atol=1e-6) for k in first)
    other = TINY_EAGLE if recipe.kind == "medusa" else MedusaRecipe(heads=2, subset=64)
    with pytest.raises(SpecvizError, match=f"cannot start a '{other.kind}' run"):
        train(other, tiny, corpus, tmp_path / "wrong", still, init=tmp_path / "first" / name, progress=False)


def test_eagle_without_the_feature_loss_trains_on_the_token_loss_alone(tiny, data):
    """feature-loss 0 (EAGLE-3): the loss is the decayed sum of the token losses and nothing else."""
    corpus = load_data(tiny, data[1])
    recipe = EagleRecipe(subset=64, unroll=3, reg=0.0)
    module = recipe.build(tiny, corpus).eval()  # eval: no input noise
    loss, metrics = recipe.loss(module, tiny, corpus.sequences[:4])
    tokens_only = sum(recipe.decay ** s * recipe.tok * metrics[f"ce{s + 1}"] for s in range(3))
    assert metrics["reg"] > 0 and loss.item() == pytest.approx(tokens_only, rel=1e-5)
    one_step, _ = EagleRecipe(subset=64, unroll=1).loss(module, tiny, corpus.sequences[:4])  # reg 1, tok 0.5
    assert one_step.item() == pytest.approx(metrics["reg"] + 0.5 * metrics["ce1"], rel=1e-5)


def test_fused_eagle_head_reads_recorded_inner_layers_and_starts_as_the_head_it_extends(tiny, data, tmp_path):
    """EAGLE-3's feature fusion (--taps): the data gains each sequence's layer-1 inputs once
    (resumable); a fused head warm-started from an unfused one drafts exactly as it did; after
    training it uses the inner layer, its file loads as a drafter reading (1, L), the engine's
    first drafts are the teacher-forced ones, and its greedy output is plain decoding's."""
    import shutil

    from specviz.drafters.trained import load_drafter
    from specviz.engine.generate import GenerationConfig, baseline_generate, collect, speculative_generate
    from specviz.modeling.forward import forward, new_cache
    from specviz.train.data import record_taps, taps_name

    folder = tmp_path / "data"
    shutil.copytree(data[1], folder)
    record_taps(tiny, folder, (1,), progress=False)
    files = sorted(folder.glob("taps-1-shard-*.pt"))
    assert files and len(files) == len(list(folder.glob("shard-*.pt")))
    stamp = [f.stat().st_mtime_ns for f in files]
    record_taps(tiny, folder, (1,), progress=False)  # done already: nothing is redone
    assert [f.stat().st_mtime_ns for f in files] == stamp
    with pytest.raises(SpecvizError, match="no recorded inputs of layers 0"):
        load_data(tiny, folder, taps=(0,))
    with pytest.raises(SpecvizError, match="taps are distinct decoder layers in increasing order, each in 0-1"):
        record_taps(tiny, folder, (2,), progress=False)  # a 2-layer target: the final state is not a tap
    corpus = load_data(tiny, folder, taps=(1,))
    seq = corpus.sequences[3]
    with torch.no_grad():
        want = forward(tiny.model, seq.ids, new_cache(tiny.model), hidden=(1,))[1]
    torch.testing.assert_close(seq.taps.float(), want, rtol=1e-2, atol=1e-2)
    assert taps_name("shard-00000.pt", (2, 15)) == "taps-2-15-shard-00000.pt"

    cfg = TrainConfig(steps=12, batch=4, lr=1e-2, held_out=4, eval_tokens=8)
    train(TINY_EAGLE, tiny, load_data(tiny, folder), tmp_path / "plain", cfg, progress=False)
    fused_recipe = EagleRecipe(subset=64, unroll=2, taps=(1,))
    still = TrainConfig(steps=1, batch=4, lr=1e-9, held_out=4, eval_tokens=8)
    train(fused_recipe, tiny, corpus, tmp_path / "start", still, init=tmp_path / "plain" / "eagle.safetensors",
          progress=False)
    plain_drafter = load_drafter(tmp_path / "plain" / "eagle.safetensors", tiny)
    start_drafter = load_drafter(tmp_path / "start" / "eagle.safetensors", tiny)
    assert plain_drafter.hidden_layers == () and start_drafter.hidden_layers == (1, 2)
    held = corpus.split(4)[1].sequences
    # identity on the final state: the plain head's drafts, every one (in fp32, as training
    # runs them: a loaded drafter may compute in bf16, packing.draft_dtype)
    assert torch.equal(fused_recipe.drafts(start_drafter.head.float(), tiny, held, 2),
                       TINY_EAGLE.drafts(plain_drafter.head.float(), tiny, held, 2))

    card = train(fused_recipe, tiny, corpus, tmp_path / "fused", cfg, init=tmp_path / "plain" / "eagle.safetensors",
                 progress=False)
    drafter = load_drafter(tmp_path / "fused" / "eagle.safetensors", tiny)
    assert drafter.head.fuse.weight[:, :64].abs().max() > 1e-3  # it learned to read layer 1
    assert card["config"]["hidden_layers"] == [1, 2] and card["recipe"]["taps"] == (1,)
    agree, compared = map(int, card["held-out"]["first drafts equal to the teacher-forced ones"].split(" / "))
    assert agree == compared > 0
    prompt = models.encode_prompt(tiny, "the cat sat on the mat")
    gen = GenerationConfig(max_new_tokens=24, k=3)
    base = collect(baseline_generate(tiny.model, prompt, gen))[1]
    spec = collect(speculative_generate(tiny.model, drafter, prompt, gen))[1]
    assert spec.token_ids == base.token_ids and spec.stats.drafted > 0
    with pytest.raises(SpecvizError, match="fuses layers 1 with the final state; train it with --taps 1"):
        train(TINY_EAGLE, tiny, corpus, tmp_path / "wrong", still, init=tmp_path / "fused" / "eagle.safetensors",
              progress=False)
    # a checkpoint resumes only with the settings it was made with
    assert train(TINY_EAGLE, tiny, corpus, tmp_path / "cut", cfg, progress=False, stop_after=3) == {"stopped_at": 3}
    with pytest.raises(SpecvizError, match="checkpoint.pt was made with other settings"):
        train(fused_recipe, tiny, corpus, tmp_path / "cut", cfg, progress=False, resume=True)


@pytest.mark.parametrize("recipe", [DraftRecipe(subset=32, hidden=32, layers=1, heads=2, ffn=64),
                                    MedusaRecipe(heads=3, subset=0), EagleRecipe(subset=0)],
                         ids=["draft", "medusa", "eagle"])
def test_teacher_forced_depth_1_is_what_the_engine_accepts(recipe):
    """After a few steps, on held-out text: every first draft the engine makes is the one the
    teacher-forced pass predicts at that context, so the rate at which the engine keeps its
    first draft is the teacher-forced depth-1 top-1 at those steps. (Over every position of
    the text the rate differs: kept drafts skip easy positions, see train/evaluate.py.)"""
    target = tiny_llama(vocab=32, seed=1)  # a small vocabulary: its greedy text is learnable
    loaded = SimpleNamespace(model=target, eos_token_ids=(0,), device=torch.device("cpu"), name="tiny")
    train_c, held = corpus_of(target, 24, 8, seed=0, tokens=24), corpus_of(target, 8, 8, seed=1, tokens=24)
    module, _, _ = fit(recipe, loaded, train_c, 30, 1e-2, batch=4)
    top1, first = teacher_forced(recipe, module, loaded, held.sequences, 4, 24, 8)
    engine = through_engine(recipe, module, loaded, held.sequences, 4, 24, first)
    same, compared = engine["first drafts as teacher-forced"]
    assert engine["same text"] == 8 and compared > 50 and same == compared
    forced1, engine1 = engine["depth 1 at these steps"]
    assert 0.1 < engine1 < 0.9  # sometimes right, sometimes wrong: the comparison can fail
    assert forced1 == pytest.approx(engine1, abs=0.02)
    assert len(top1) == 4 and 0 < top1[0] < 1


def test_a_time_cap_saves_what_there_is(tiny, data, tmp_path):
    corpus = load_data(tiny, data[1])
    card = train(TINY_RECIPE, tiny, corpus, tmp_path, TrainConfig(steps=50, batch=2, held_out=2, eval_tokens=4,
                                                                  max_seconds=0.0), progress=False)
    assert card["training"]["steps"] == "1 of 50 (time cap)"
    assert (tmp_path / "draft.safetensors").is_file()
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=False)["step"] == 1


# --- the command line -------------------------------------------------------------------

@pytest.mark.parametrize("recipe", [TINY_RECIPE, TINY_EAGLE], ids=["draft", "eagle"])
def test_average_init_saves_the_mean_of_the_trained_and_the_starting_weights(tiny, data, tmp_path, recipe):
    """average_init=w: the saved file is (1 - w) x what training reached + w x the init file,
    the held-out block measures that mean, and it drafts exactly like any other drafter."""
    import dataclasses

    from safetensors.torch import load_file

    from specviz.drafters.trained import load_drafter
    from specviz.engine.generate import GenerationConfig, baseline_generate, collect, speculative_generate

    corpus = load_data(tiny, data[1])
    name = f"{recipe.kind}.safetensors"
    train(recipe, tiny, corpus, tmp_path / "first", TrainConfig(steps=8, batch=4, lr=1e-2, held_out=4,
                                                                eval_tokens=4), progress=False)
    init = tmp_path / "first" / name
    tune = TrainConfig(steps=6, batch=4, lr=1e-2, held_out=4, eval_tokens=4, seed=1)
    train(recipe, tiny, corpus, tmp_path / "tuned", tune, init=init, progress=False)
    card = train(recipe, tiny, corpus, tmp_path / "mean", dataclasses.replace(tune, average_init=0.5), init=init,
                 progress=False)
    first, tuned, mean = (load_file(tmp_path / run / name) for run in ("first", "tuned", "mean"))
    assert mean.keys() == first.keys()
    moved = 0
    for k in first:
        if not first[k].is_floating_point():
            assert torch.equal(mean[k], first[k])
            continue
        want = (first[k].float() + tuned[k].float()) / 2
        torch.testing.assert_close(mean[k].float(), want, rtol=2e-3, atol=1e-4)
        moved += not torch.allclose(tuned[k].float(), mean[k].float(), rtol=1e-3, atol=1e-5)
    assert moved > 0  # the fine-tune moved the weights, and the mean sits between
    assert "0.5 x trained + 0.5 x the --init weights" in card["training"]["saved weights"]
    drafter = load_drafter(tmp_path / "mean" / name, tiny)
    prompt = models.encode_prompt(tiny, "the cat sat on the mat")
    gen = GenerationConfig(max_new_tokens=16, k=3)
    base = collect(baseline_generate(tiny.model, prompt, gen))[1]
    assert collect(speculative_generate(tiny.model, drafter, prompt, gen))[1].token_ids == base.token_ids
    with pytest.raises(SpecvizError, match="needs an init file"):
        train(recipe, tiny, corpus, tmp_path / "none", dataclasses.replace(tune, average_init=0.5), progress=False)
    with pytest.raises(SpecvizError, match=r"share of the averaged weights must be in \[0, 1\)"):
        train(recipe, tiny, corpus, tmp_path / "none", dataclasses.replace(tune, average_init=1.0), init=init,
              progress=False)


def test_a_widened_eagle_head_starts_as_the_head_it_grows_then_learns_and_drafts_exactly(tiny, data, tmp_path):
    """--mlp-width from an --init head: the new MLP units start silent (the head's output is the
    init's), the same every time (so --average-init can average with it); training uses them, the
    file records the width and loads as a drafter whose greedy output is plain decoding's; a head
    never narrows."""
    import dataclasses

    from specviz.drafters.eagle import widened
    from specviz.drafters.trained import load_drafter, read_drafter
    from specviz.engine.generate import GenerationConfig, baseline_generate, collect, speculative_generate

    corpus = load_data(tiny, data[1])
    cfg = TrainConfig(steps=8, batch=4, lr=1e-2, held_out=4, eval_tokens=4)
    train(TINY_EAGLE, tiny, corpus, tmp_path / "narrow", cfg, progress=False)
    init = tmp_path / "narrow" / "eagle.safetensors"
    wide = dataclasses.replace(TINY_EAGLE, width=2 * tiny.model.config.intermediate_size)
    narrow_head = TINY_EAGLE.rebuild(read_drafter(init)[0]["config"], read_drafter(init)[1], tiny).eval()
    grown = wide.rebuild(read_drafter(init)[0]["config"], read_drafter(init)[1], tiny).eval()
    again = wide.rebuild(read_drafter(init)[0]["config"], read_drafter(init)[1], tiny)
    assert grown.up.weight.shape[0] == wide.width and torch.equal(grown.up.weight, again.up.weight)
    assert grown.up.weight[wide.width // 2:].abs().max() > 0  # new units are live, their output silent
    held = corpus.split(4)[1].sequences
    assert torch.equal(wide.drafts(grown, tiny, held, 2), TINY_EAGLE.drafts(narrow_head, tiny, held, 2))

    card = train(wide, tiny, corpus, tmp_path / "wide", dataclasses.replace(cfg, seed=1), init=init, progress=False)
    assert card["config"]["intermediate_size"] == wide.width and card["recipe"]["width"] == wide.width
    drafter = load_drafter(tmp_path / "wide" / "eagle.safetensors", tiny)
    assert drafter.head.down.weight[:, wide.width // 2:].abs().max() > 1e-4  # it learned to use them
    prompt = models.encode_prompt(tiny, "the cat sat on the mat")
    gen = GenerationConfig(max_new_tokens=16, k=3)
    base = collect(baseline_generate(tiny.model, prompt, gen))[1]
    assert collect(speculative_generate(tiny.model, drafter, prompt, gen))[1].token_ids == base.token_ids
    mean = train(wide, tiny, corpus, tmp_path / "mean", dataclasses.replace(cfg, seed=1, average_init=0.5), init=init,
                 progress=False)  # averages with the grown init
    assert mean["config"]["intermediate_size"] == wide.width
    with pytest.raises(ValueError, match="cannot narrow"):
        widened(grown, 8)
    with pytest.raises(SpecvizError, match="it can grow, not shrink"):
        train(dataclasses.replace(TINY_EAGLE, width=8), tiny, corpus, tmp_path / "shrink", cfg,
              init=tmp_path / "wide" / "eagle.safetensors", progress=False)


def test_a_deepened_eagle_head_starts_as_the_head_it_grows_then_learns_and_drafts_exactly(tiny, data, tmp_path):
    """--head-layers from an --init head: the new decoder layer starts silent (the head drafts as
    the init did), the same every time; training uses it, the file records the depth and loads
    as a drafter whose greedy output (chains and trees) is plain decoding's; a head never loses
    layers."""
    import dataclasses

    from specviz.drafters.eagle import deepened
    from specviz.drafters.trained import load_drafter, read_drafter
    from specviz.engine.generate import GenerationConfig, baseline_generate, collect, speculative_generate

    corpus = load_data(tiny, data[1])
    cfg = TrainConfig(steps=8, batch=4, lr=1e-2, held_out=4, eval_tokens=4)
    train(TINY_EAGLE, tiny, corpus, tmp_path / "one", cfg, progress=False)
    init = tmp_path / "one" / "eagle.safetensors"
    deep = dataclasses.replace(TINY_EAGLE, depth=2)
    one = TINY_EAGLE.rebuild(read_drafter(init)[0]["config"], read_drafter(init)[1], tiny).eval()
    grown = deep.rebuild(read_drafter(init)[0]["config"], read_drafter(init)[1], tiny).eval()
    again = deep.rebuild(read_drafter(init)[0]["config"], read_drafter(init)[1], tiny)
    assert grown.depth == 2 and torch.equal(grown.blocks[0].q.weight, again.blocks[0].q.weight)
    assert grown.blocks[0].q.weight.abs().max() > 0 and grown.blocks[0].o.weight.abs().max() == 0
    held = corpus.split(4)[1].sequences
    assert torch.equal(deep.drafts(grown, tiny, held, 3), TINY_EAGLE.drafts(one, tiny, held, 3))

    card = train(deep, tiny, corpus, tmp_path / "deep", dataclasses.replace(cfg, seed=1), init=init, progress=False)
    assert card["config"]["layers"] == 2 and card["recipe"]["depth"] == 2
    drafter = load_drafter(tmp_path / "deep" / "eagle.safetensors", tiny)
    assert drafter.head.depth == 2 and drafter.head.blocks[0].o.weight.abs().max() > 1e-4  # it learned to use it
    prompt = models.encode_prompt(tiny, "the cat sat on the mat")
    gen = GenerationConfig(max_new_tokens=16, k=4)
    base = collect(baseline_generate(tiny.model, prompt, gen))[1]
    for width in (3, 0):  # trees (greedy drafts them by default), then chains
        drafter.tree_width = width
        steps, end = collect(speculative_generate(tiny.model, drafter, prompt, gen))
        assert end.token_ids == base.token_ids and all((s.tree is not None) == (width > 1 and bool(s.draft)) for s in steps)
    with pytest.raises(ValueError, match="shallower"):
        deepened(grown, 1)
    with pytest.raises(SpecvizError, match="it can grow, not shrink"):
        train(dataclasses.replace(TINY_EAGLE, depth=1), tiny, corpus, tmp_path / "shrink", cfg,
              init=tmp_path / "deep" / "eagle.safetensors", progress=False)


@pytest.mark.parametrize("argv, message", [
    (["train", "draft", "--steps", "0"], "argument --steps: must be a positive integer, got 0"),
    (["train", "draft", "--lr", "2"], "argument --lr: must be in (0, 1), got 2"),
    (["train", "draft", "--threads", "0"], "--threads"),
    (["train", "draft", "--epochs", "0"], "argument --epochs: must be positive, got 0"),
    (["train", "draft", "--epochs", "nan"], "argument --epochs: must be positive, got nan"),
    (["train", "draft", "--batch", "x"], "argument --batch: must be a positive integer, got x"),
    (["train", "draft", "--unroll", "2"], "--unroll is for eagle"),
    (["train", "medusa", "--feature-loss", "0"], "--feature-loss is for eagle"),
    (["train", "eagle", "--feature-loss", "-1"], "argument --feature-loss: must be a weight in [0, 1000)"),
    (["train", "eagle", "--init", "/no/such/eagle.safetensors"], "--init: drafter file /no/such/eagle.safetensors not found"),
    (["train", "eagle", "--average-init", "1"], "argument --average-init: must be the init's share in [0, 1)"),
    (["train", "eagle", "--average-init", "0.5"], "--average-init averages with the weights a run started from"),
    (["train", "medusa", "--taps", "2"], "--taps is for eagle"),
    (["train", "draft", "--mlp-width", "64"], "--mlp-width is for eagle"),
    (["train", "eagle", "--mlp-width", "0"], "argument --mlp-width: must be a number of units from 1 to 65536, got 0"),
    (["train", "medusa", "--head-layers", "2"], "--head-layers is for eagle"),
    (["train", "eagle", "--head-layers", "0"], "argument --head-layers: must be a number of layers from 1 to 16, got 0"),
    (["train", "eagle", "--taps", "2,x"], "argument --taps: takes decoder layer numbers separated by commas, e.g. 2,15; "
                                          "got '2,x'"),
    (["train", "eagle", "--taps", "15,2"], "--taps: taps are distinct decoder layers in increasing order, e.g. 2,15"),
    (["train", "eagle", "--taps", "2,2"], "got 2, 2"),
    (["train", "draft", "--target", "/no/such/folder"], ""),
])
def test_cli_bad_input_prints_an_error_not_a_traceback(argv, message, capsys):
    # A malformed value is argparse's (its usage line, then the sentence, exit status 2); flags
    # that do not go together, or a file that is not there, are the command's own sentence.
    try:
        code = cli_main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and "error: " in err and message in err and "Traceback" not in err


def test_cli_trains_from_existing_data(tiny, data, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    argv = ["train", "draft", "--target", tiny.source, "--data", str(data[1]), "--out", str(out),
            "--epochs", "0.5", "--batch", "2", "--held-out", "2", "--eval-tokens", "4", "--device", "cpu"]
    monkeypatch.setitem(command.KINDS, "draft", ("test_train", "TINY_RECIPE"))
    assert cli_main(argv) == 0
    assert (out / "draft.safetensors").is_file() and (out / "draft.md").is_file()
    assert "--drafter draft:" in capsys.readouterr().err
    card = (out / "draft.md").read_text()
    assert "--epochs 0.5" in card and "steps: 11" in card  # half of the 44 training sequences, 2 a step


def test_cli_fine_tunes_a_saved_eagle_head_on_the_token_loss(tiny, data, tmp_path, capsys, monkeypatch):
    corpus = load_data(tiny, data[1])
    cfg = TrainConfig(steps=4, batch=4, lr=1e-2, held_out=2, eval_tokens=4)
    train(TINY_EAGLE, tiny, corpus, tmp_path / "first", cfg, progress=False)
    out = tmp_path / "tuned"
    argv = ["train", "eagle", "--target", tiny.source, "--data", str(data[1]), "--out", str(out), "--steps", "2",
            "--batch", "2", "--held-out", "2", "--eval-tokens", "4", "--device", "cpu", "--feature-loss", "0",
            "--init", str(tmp_path / "first" / "eagle.safetensors")]
    monkeypatch.setitem(command.KINDS, "eagle", ("test_train", "TINY_EAGLE"))
    assert cli_main(argv) == 0
    assert "starting from the weights in" in capsys.readouterr().err
    card = (out / "eagle.md").read_text()
    assert "  - reg: 0\n" in card and "--feature-loss 0 --init " in card


def test_cli_fuses_inner_layers_into_a_saved_eagle_head(tiny, data, tmp_path, capsys, monkeypatch):
    """--taps 1 --init plain: records layer 1's inputs beside the data, then fine-tunes a fused head;
    a fused --init without --taps keeps its taps; a layer the target lacks is an error."""
    import shutil

    folder = tmp_path / "data"
    shutil.copytree(data[1], folder)
    train(TINY_EAGLE, tiny, load_data(tiny, folder), tmp_path / "plain",
          TrainConfig(steps=4, batch=4, lr=1e-2, held_out=2, eval_tokens=4), progress=False)
    monkeypatch.setitem(command.KINDS, "eagle", ("test_train", "TINY_EAGLE"))
    base = ["train", "eagle", "--target", tiny.source, "--data", str(folder), "--steps", "2", "--batch", "2",
            "--held-out", "2", "--eval-tokens", "4", "--device", "cpu"]
    argv = base + ["--out", str(tmp_path / "fused"), "--taps", "1", "--init", str(tmp_path / "plain" / "eagle.safetensors")]
    assert cli_main(argv) == 0
    assert "recording the inputs of layers 1" in capsys.readouterr().err
    card = (tmp_path / "fused" / "eagle.md").read_text()
    assert "--taps 1 --init " in card and "  - hidden_layers: 1 / 2\n" in card and "  - taps: 1\n" in card
    again = base + ["--out", str(tmp_path / "again"), "--init", str(tmp_path / "fused" / "eagle.safetensors")]
    assert cli_main(again) == 0
    assert "recording" not in capsys.readouterr().err and "--taps 1 --init " in (tmp_path / "again" / "eagle.md").read_text()
    assert cli_main(base + ["--out", str(tmp_path / "bad"), "--taps", "2"]) == 2
    assert "--taps: taps are distinct decoder layers in increasing order, each in 0-1" in capsys.readouterr().err
    # refused before any slow part: a fused --init with other taps; --taps on an unfused checkpoint
    assert cli_main(base + ["--out", str(tmp_path / "bad"), "--taps", "0",
                            "--init", str(tmp_path / "fused" / "eagle.safetensors")]) == 2
    assert "fuses layers 1: --taps 0 cannot change that" in capsys.readouterr().err
    assert cli_main(base + ["--out", str(tmp_path / "plain"), "--taps", "1", "--resume"]) == 2
    assert "reads the final state alone: --taps 1 cannot change that" in capsys.readouterr().err
    # --data-only records them too (a data folder prepared for a later run)
    other = tmp_path / "data-only"
    shutil.copytree(data[1], other)
    assert cli_main(["train", "eagle", "--target", tiny.source, "--data", str(other), "--data-only", "--taps", "0",
                     "--device", "cpu"]) == 0
    assert len(list(other.glob("taps-0-shard-*.pt"))) == len(list(other.glob("shard-*.pt")))
    # a taps file that does not match its shard (an older build) is a sentence
    first = sorted(other.glob("taps-0-shard-*.pt"))[0]
    torch.save(torch.load(first, weights_only=True)[1:], first)
    with pytest.raises(SpecvizError, match="does not match shard-00000.pt .*record the layer inputs again"):
        load_data(tiny, other, taps=(0,))


def test_bf16_autocast_trains_eagle_as_well_as_fp32_and_the_card_says_so(tiny, data, tmp_path):
    corpus = load_data(tiny, data[1])
    cards = {}
    for autocast in (False, True):
        cfg = TrainConfig(steps=30, batch=4, lr=1e-2, held_out=4, eval_tokens=4, autocast=autocast)
        cards[autocast] = train(EagleRecipe(subset=64, unroll=2), tiny, corpus, tmp_path / str(autocast), cfg,
                                progress=False)["training"]
    fp32, bf16 = cards[False], cards[True]
    assert (fp32["precision"], bf16["precision"]) == ("fp32", "fp32 weights, bf16 autocast")
    last, first = "train loss (mean of last 10%)", "train loss (first 10 steps)"
    assert bf16[last] < bf16[first] - 0.2  # it learns
    assert bf16[last] == pytest.approx(fp32[last], abs=0.1)  # and as well as in fp32
    assert "bf16 autocast" in (tmp_path / "True" / "eagle.md").read_text()


@pytest.mark.parametrize("choice, kind, device, native, on", [
    ("on", "medusa", "cpu", False, True), ("off", "eagle", "cuda", True, False),
    ("auto", "eagle", "cuda", False, True), ("auto", "draft", "cpu", True, True),
    ("auto", "eagle", "cpu", False, False),  # emulated bf16 is slower than fp32: never assumed
    ("auto", "medusa", "cpu", True, False),  # not measured faster: stays fp32
])
def test_autocast_auto_is_on_only_where_it_was_measured_faster(choice, kind, device, native, on, monkeypatch):
    from specviz.modeling import packing

    monkeypatch.setattr(packing, "native_bf16", lambda: native)
    assert command.use_autocast(choice, kind, torch.device(device)) is on


def test_the_card_counts_the_prompts_the_data_answers_not_the_last_pool():
    """A folder grown over several builds: the card names every source its sequences came from
    (meta["prompts"] names only the last build's pool)."""
    from specviz.train.card import describe_data
    from specviz.train.data import Corpus, Seq

    def seq(pid, source, variant="greedy"):
        z = torch.zeros(4, 1)
        return Seq(torch.arange(4), 2, z.half(), z.long(), z.half(), pid, variant, source)

    seqs = [seq("w1", "written"), seq("w1", "written", "sample1"), seq("s1", "self"), seq("s2", "self"),
            seq("c1", "code"), seq("d1", "docs"), seq("d2", "docs"), seq("d3", "docs")]
    corpus = Corpus(seqs, {"prompts": "3 prompts (written 1, self 2)", "settings": {"temperature": 0.8}})
    source = describe_data(corpus, corpus, Corpus([]))["source"]
    assert "7 prompts (docs 3, self 2, code 1, written 1)" in source and "sampled at T=0.8" in source
    greedy = Corpus([s for s in seqs if s.variant == "greedy"], corpus.meta)  # a --passes 1 build
    source = describe_data(greedy, greedy, Corpus([]))["source"]
    assert "(greedy only)" in source and "sampled" not in source


def test_a_card_whose_held_out_prompts_were_never_answered_says_so():
    """A small data build (--data-tokens 2000) answers 64 prompts and none of the 2 held out: the card
    said "none (no prompts held out)" though --held-out 2 asked for them."""
    from types import SimpleNamespace

    from specviz.train.data import Corpus
    from specviz.train.evaluate import evaluate

    def block(held_out: int) -> str:
        return evaluate(None, None, None, Corpus([]), SimpleNamespace(held_out=held_out), print)["held-out"]

    assert block(0) == "none (no prompts held out)"
    assert block(2).startswith("none: the 2 prompts held out were not among those the data answered")
