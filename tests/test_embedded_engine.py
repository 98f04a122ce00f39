"""The engine on the real embedded model (SmolLM2-135M-Instruct, fp32, CPU).

Greedy speculative output must be the greedy baseline's, and the baseline must be
transformers' own greedy generate, on real chat prompts.
"""
from __future__ import annotations

import pytest
import torch

from specviz import (DraftModel, GenerationConfig, PromptLookup, baseline_generate, collect, speculative_generate)

pytestmark = pytest.mark.embedded

PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Repeat this list exactly: apples, pears, plums, cherries, apples, pears, plums, cherries.",
    "Rewrite with type hints:\ndef area(w, h):\n    return w * h\n",
]


@pytest.fixture(scope="module")
def baselines(smol):
    """Each prompt's ids and greedy baseline, computed once for every test and drafter here."""
    from specviz.modeling.models import encode_prompt

    cfg = GenerationConfig(max_new_tokens=32, eos_token_ids=smol.eos_token_ids)
    out = {}
    for prompt in PROMPTS:
        ids = encode_prompt(smol, prompt)
        out[prompt] = ids, collect(baseline_generate(smol.model, ids, cfg))[1]
    return out


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculative_equals_baseline_equals_transformers(smol, baselines, prompt):
    ids, base = baselines[prompt]
    cfg = GenerationConfig(max_new_tokens=32, k=5, eos_token_ids=smol.eos_token_ids)
    with torch.inference_mode():
        ref = smol.model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                                  eos_token_id=list(smol.eos_token_ids), pad_token_id=smol.eos_token_ids[0])
    assert list(base.token_ids) == ref[0, len(ids):].tolist()
    _, end = collect(speculative_generate(smol.model, PromptLookup(), ids, cfg))
    assert end.token_ids == base.token_ids
    if prompt == PROMPTS[0]:  # a draft model (the target drafting for itself: every cache path)
        _, end = collect(speculative_generate(smol.model, DraftModel(smol.model), ids, cfg))
        assert end.token_ids == base.token_ids


@pytest.mark.parametrize("name", ["eagle", "medusa", "draft"])
def test_shipped_trained_drafters_are_exact_on_the_embedded_model(smol, baselines, name):
    """The weights in assets/drafters load for the embedded target and change nothing in
    greedy output (Medusa drafts trees here: greedy, no repetition penalty)."""
    from specviz.run.spec import make_drafter

    cfg = GenerationConfig(max_new_tokens=32, k=4, eos_token_ids=smol.eos_token_ids)
    accepted = 0
    for prompt in PROMPTS:
        ids, base = baselines[prompt]
        steps, end = collect(speculative_generate(smol.model, make_drafter(name, smol), ids, cfg))
        assert end.token_ids == base.token_ids
        accepted += end.stats.accepted
        if name == "medusa":
            assert any(s.tree is not None for s in steps)
    assert accepted > 0  # trained: they do get drafts accepted


def test_the_shipped_heads_draft_for_the_embedded_model_in_float16():
    """The heads were trained on the fp32 weights; in fp16 the fingerprint's hash differs (double
    rounding) but the weights it keeps match, so they load, and greedy output stays plain decoding's
    or parts only at a near-tie that fp16's rounding explains."""
    from specviz.core.divergence import first_divergence, tie_tolerance
    from specviz.run.spec import make_drafter
    from specviz.modeling.models import encode_prompt, load

    half = load("default", device="cpu", dtype="fp16")
    ids = encode_prompt(half, PROMPTS[0])
    cfg = GenerationConfig(max_new_tokens=16, k=3, eos_token_ids=half.eos_token_ids)
    base_events, base = collect(baseline_generate(half.model, ids, cfg))
    for kind in ("eagle", "medusa"):
        steps, end = collect(speculative_generate(half.model, make_drafter(kind, half), ids, cfg))
        d = first_divergence(steps, base_events, tie_tolerance("float16"))
        assert d is None or d.near_tie, (kind, d)
        assert end.stats.accepted > 0, kind  # the heads really draft for it
