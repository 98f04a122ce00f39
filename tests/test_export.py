"""The distilled drafter exported as a plain transformers LlamaForCausalLM (drafters/export.py)
drafts what the drafter drafts: the same logits on the tokens the drafter scores (its subset,
learned bias included), probability 0 elsewhere, through every way the export is run."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from specviz.drafters.distilled import DistilledConfig, DistilledDrafter, DistilledLM
from specviz.drafters.export import to_transformers
from specviz.modeling.forward import forward, new_cache


def _full(lm: DistilledLM, subset_logits: torch.Tensor) -> torch.Tensor:
    """The drafter's logits over the whole vocabulary: -inf off its subset (q = 0 there)."""
    full = torch.full((subset_logits.shape[0], lm.config.vocab), float("-inf"))
    full[:, lm.keep] = subset_logits
    return full


def _assert_drafts_as(lm: DistilledLM, logits: torch.Tensor, ref: torch.Tensor, atol: float) -> None:
    """`logits` (positions, vocab) from the export against the drafter's subset logits `ref`."""
    torch.testing.assert_close(logits[:, lm.keep], ref, rtol=1e-5, atol=atol)
    off = torch.ones(logits.shape[1], dtype=torch.bool)
    off[lm.keep] = False
    assert torch.softmax(logits, dim=-1)[:, off].sum() == 0  # never drafted, as by the drafter
    assert torch.equal(logits.argmax(-1), _full(lm, ref).argmax(-1))


@pytest.fixture(scope="module")
def drafter(target):
    """A small distilled drafter on the tiny target, with a learned-looking subset bias and norm
    weights (all-zero bias and unit norms would hide a missing bias or a misplaced norm)."""
    torch.manual_seed(0)
    vocab, width = target.lm_head.weight.shape
    keep = torch.randperm(vocab)[: vocab // 2].sort().values
    lm = DistilledLM(DistilledConfig(vocab=vocab, target_hidden=width, subset=keep.numel(), hidden=32, layers=2,
                                     heads=4, ffn=48), keep).eval()
    with torch.no_grad():
        lm.bias.copy_(torch.randn(keep.numel()) * 3 - 6)
        for name, p in lm.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return DistilledDrafter(lm.attach(target))


def test_the_export_computes_the_drafters_logits_with_its_bias(target, drafter, tmp_path):
    lm = drafter.model
    ids = torch.randint(0, lm.config.vocab, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = lm(ids)[0]
        # what the drafter drafts from (its cached inference step) is what its forward computes
        torch.testing.assert_close(lm.step(ids[0], lm.new_cache("cpu")), ref, rtol=1e-5, atol=1e-5)
        hf = to_transformers(drafter, target)
        _assert_drafts_as(lm, hf(input_ids=ids).logits[0], ref, atol=1e-4)

        # specviz's own forward over a cache (how the bench's draft-hf arm runs it): a chunk, then token by token
        cache = new_cache(hf)
        rows = [forward(hf, ids[0, :5], cache)]
        rows += [forward(hf, t[None], cache) for t in ids[0, 5:]]
        _assert_drafts_as(lm, torch.cat(rows), ref, atol=1e-4)

        # a user's transformers code: saved, then loaded with nothing of specviz's
        hf.save_pretrained(tmp_path)
        back = AutoModelForCausalLM.from_pretrained(tmp_path)
        assert type(back).__name__ == "LlamaForCausalLM"
        _assert_drafts_as(lm, back(input_ids=ids).logits[0], ref, atol=1e-4)


# A conversation written by hand (not the target's output): real text for the real drafter.
CHAT = [
    {"role": "user", "content": "What should I pack for a weekend of hiking in the mountains in autumn?"},
    {"role": "assistant", "content": "Here is a short list.\n1. Layers: a warm fleece, a waterproof jacket and a "
                                     "hat, because mountain weather changes quickly.\n2. Good boots that you have "
                                     "already worn in.\n3. A map, a charged phone and a small first aid kit.\n4. "
                                     "Water, snacks and a thermos of tea.\nCheck the forecast the evening before "
                                     "and tell someone where you are going."},
]


@pytest.mark.embedded
def test_the_shipped_drafters_export_drafts_what_it_drafts(smol):
    """On the embedded model with the shipped distilled drafter: the same greedy next token at
    (at least) 95% of the positions of a real conversation, and the same logits on the subset."""
    from specviz.run.spec import make_drafter

    drafter = make_drafter("draft", smol)
    lm = drafter.model
    ids = smol.tokenizer.apply_chat_template(CHAT, return_tensors="pt", return_dict=True)["input_ids"]
    assert ids.shape[1] > 100
    with torch.no_grad():
        ref = lm(ids)[0]
        logits = to_transformers(drafter, smol.model)(input_ids=ids).logits[0]
    same = (logits.argmax(-1) == _full(lm, ref).argmax(-1)).float().mean().item()
    assert same >= 0.95
    torch.testing.assert_close(logits[:, lm.keep], ref, rtol=1e-5, atol=1e-3)
