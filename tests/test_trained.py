"""Trained drafters on disk: fingerprints, save/load, refusal of another target, the distilled
drafter's cache and its exactness under the engine, and drafter names in run/spec.py."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from specviz.core.errors import SpecvizError
from specviz.core.sampling import Processor, Sampling
from specviz.drafters import trained as trained_files
from specviz.run.spec import make_drafter, parse
from specviz.drafters.distilled import DistilledDrafter
from specviz.drafters.trained import fingerprint, load_drafter, read_drafter, save_drafter
from specviz.engine.generate import GenerationConfig, baseline_generate, collect, speculative_generate
from specviz.modeling import models
from specviz.train.batches import sample_batch
from specviz.train.data import Corpus, Seq
from specviz.train.draft import DraftRecipe

from tiny_folder import make_tiny_model_dir

RECIPE = DraftRecipe(subset=200, hidden=32, layers=2, heads=2, ffn=64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return models.load(str(make_tiny_model_dir(tmp_path_factory.mktemp("t") / "tiny")), device="cpu")


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    return models.load(str(make_tiny_model_dir(tmp_path_factory.mktemp("o") / "other", seed=5)), device="cpu")


def _corpus(target, n=12, length=40) -> Corpus:
    """Teacher-forced sequences from the target's own greedy text (what data.py records)."""
    from specviz.train.generate import teacher_force

    g = torch.Generator().manual_seed(0)
    seqs = []
    for i in range(n):
        prompt = torch.randint(3, target.vocab_size, (6,), generator=g).tolist()
        _, end = collect(baseline_generate(target.model, prompt, GenerationConfig(max_new_tokens=length)))
        ids = torch.tensor(prompt + list(end.token_ids))
        hidden, top_p, top_ids = teacher_force(target.model, [ids], 8)[0]
        seqs.append(Seq(ids, len(prompt), hidden, top_ids, top_p, f"p{i}", "greedy"))
    return Corpus(seqs, {"vocab": target.vocab_size})


@pytest.fixture(scope="module")
def trained(tiny, tmp_path_factory):
    """A distilled drafter fitted for a few dozen steps: agrees with the target often enough
    that accept, reject and bonus paths all occur."""
    corpus = _corpus(tiny)
    torch.manual_seed(0)
    module = RECIPE.build(tiny, corpus)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    for step in range(60):
        loss, _ = RECIPE.loss(module, tiny, sample_batch(corpus, step, 4, 0, 64))
        opt.zero_grad()
        loss.backward()
        opt.step()
    module.eval()
    path = tmp_path_factory.mktemp("w") / "draft.safetensors"
    save_drafter(path, "draft", module, RECIPE.config(module), tiny, {"steps": 60})
    return path, module, corpus


def test_fingerprint_follows_the_weights_not_the_dtype_or_object(tiny, other):
    assert fingerprint(tiny.model) == fingerprint(tiny.model)
    assert fingerprint(tiny.model) != fingerprint(other.model)
    copy = LlamaForCausalLM(tiny.model.config)
    copy.load_state_dict(tiny.model.state_dict())
    assert fingerprint(copy) == fingerprint(tiny.model)
    assert fingerprint(copy.to(torch.bfloat16)) == fingerprint(tiny.model)
    with torch.no_grad():
        copy.model.layers[1].mlp.down_proj.weight[0, 0] += 1.0
    assert fingerprint(copy) != fingerprint(tiny.model)


def test_saved_file_is_fp16_with_metadata_and_loads_back_fp32(tiny, trained):
    path, module, _ = trained
    from safetensors.torch import load_file

    raw = load_file(path)
    assert all(t.dtype == torch.float16 for k, t in raw.items() if k != "keep")
    assert "embed" not in " ".join(raw)  # the target's embeddings are shared, never saved
    meta, state = read_drafter(path)
    assert meta["kind"] == "draft" and meta["config"]["subset"] == module.keep.numel()
    assert meta["target_fingerprint"] == fingerprint(tiny.model)
    assert all(t.dtype == torch.float32 for k, t in state.items() if k != "keep")
    drafter = load_drafter(path, tiny)
    assert isinstance(drafter, DistilledDrafter)
    for k, v in module.state_dict().items():
        assert torch.allclose(drafter.model.state_dict()[k].float(), v.float(), atol=2e-3, rtol=2e-3), k
    assert path.with_suffix(".md").read_text().startswith("# specviz draft drafter")


def test_a_drafter_refuses_another_target(other, trained):
    with pytest.raises(SpecvizError, match="cannot draft for this target: it was trained for") as e:
        load_drafter(trained[0], other)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_drafter_loads_on_its_target_in_half_precision(tiny, trained, dtype):
    """fp32 -> fp16 -> bf16 is not fp32 -> bf16, so the fp16 copy's fingerprint differs; the weights
    the file keeps say it is the same model, and the drafter drafts for it."""
    from dataclasses import replace

    half = replace(tiny, model=LlamaForCausalLM(tiny.model.config).eval(), dtype=dtype)
    half.model.load_state_dict(tiny.model.state_dict())
    half.model.to(dtype)
    if dtype is torch.float16:
        assert fingerprint(half.model) != fingerprint(tiny.model)  # the case the probe is for
    assert isinstance(load_drafter(trained[0], half), DistilledDrafter)
    with torch.no_grad():  # the same name with other weights: refused, saying so, not naming one model twice
        half.model.model.layers[0].mlp.down_proj.weight.add_(0.05)
    with pytest.raises(SpecvizError, match=f"the {tiny.name!r} loaded here .* has other weights"):
        load_drafter(trained[0], half)


def test_unreadable_files_are_readable_errors(tiny, tmp_path):
    with pytest.raises(SpecvizError, match="not found"):
        load_drafter(tmp_path / "none.safetensors", tiny)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")  # draft:/etc/passwd, say
    with pytest.raises(SpecvizError, match="is not a drafter file: specviz reads") as refused:
        load_drafter(junk, tiny)
    assert "header" not in str(refused.value)  # the library's words ("header too large") are not said
    from safetensors.torch import save_file

    plain = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(plain))
    with pytest.raises(SpecvizError, match="not a specviz drafter"):
        load_drafter(plain, tiny)


def test_cached_steps_match_the_training_forward(tiny, trained):
    """Feeding tokens through the cache (several at once, then one by one, after a rollback)
    gives the logits of one full causal forward."""
    _, module, corpus = trained
    ids = corpus.sequences[0].ids[:20]
    with torch.no_grad():
        full = module(ids[None])[0]
    module.fused = None
    cache = module.new_cache("cpu")
    a = module.step(ids[:12], cache)
    module.step(torch.tensor([5, 6, 7]), cache)  # a draft that gets rejected
    cache.crop(12)
    b = torch.cat([module.step(ids[i:i + 1], cache) for i in range(12, 20)])
    assert torch.allclose(torch.cat([a, b]), full, atol=1e-4)


def test_q_is_zero_off_the_subset_and_sums_to_one(tiny, trained):
    path, _, corpus = trained
    drafter = load_drafter(path, tiny)
    prompt = corpus.sequences[1].ids[:8].tolist()
    processor = Processor(Sampling(temperature=0.7, top_k=50), tiny.vocab_size, prompt, "cpu")
    drafter.begin(prompt, processor, torch.Generator().manual_seed(0), "cpu")
    draft = drafter.propose(prompt, 3)
    assert draft.q.shape == (3, tiny.vocab_size)
    assert torch.allclose(draft.q.sum(-1), torch.ones(3))
    off = torch.ones(tiny.vocab_size, dtype=torch.bool)
    off[drafter.model.keep] = False
    assert float(draft.q[:, off].sum()) == 0.0


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_greedy_output_identical_to_baseline(tiny, trained, k, penalty):
    path, _, corpus = trained
    sampling = Sampling(repetition_penalty=penalty)
    drafted = accepted = 0
    for s in corpus.sequences[:4] + [Seq(torch.tensor([7]), 1, None, None, None)]:
        prompt = s.ids[:s.response_start].tolist()
        cfg = GenerationConfig(max_new_tokens=30, k=k, sampling=sampling)
        _, base = collect(baseline_generate(tiny.model, prompt, cfg))
        _, spec = collect(speculative_generate(tiny.model, load_drafter(path, tiny), prompt, cfg))
        assert spec.token_ids == base.token_ids
        drafted, accepted = drafted + spec.stats.drafted, accepted + spec.stats.accepted
    assert 0 < accepted < drafted  # both accept and reject paths were exercised


def test_choose_names_trained_drafters(tiny, other, trained, tmp_path, monkeypatch):
    path = trained[0]
    assert not parse("draft").needs_model and not parse(f"eagle:{path}").needs_model
    assert parse("HuggingFaceTB/SmolLM2-135M-Instruct").needs_model
    assert parse("medusa").label == "Medusa"
    assert parse(f"draft:{path}").label == "distilled draft model (draft.safetensors)"
    assert isinstance(make_drafter(f"draft:{path}", tiny), DistilledDrafter)
    with pytest.raises(SpecvizError, match="not a 'medusa' one"):
        make_drafter(f"medusa:{path}", tiny)
    with pytest.raises(SpecvizError, match="cannot draft for this target"):
        make_drafter(f"draft:{path}", other)

    monkeypatch.setattr(trained_files, "SHIPPED", tmp_path)
    with pytest.raises(SpecvizError, match="no shipped 'eagle' drafter"):
        make_drafter("eagle", tiny)
    (tmp_path / "draft.safetensors").write_bytes(path.read_bytes())
    assert isinstance(make_drafter("draft", tiny), DistilledDrafter)
    with pytest.raises(SpecvizError, match="embedded SmolLM2"):
        make_drafter("draft", other)
