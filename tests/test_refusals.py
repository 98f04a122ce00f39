"""A model the engine cannot verify is refused saying what specviz checked and found, then the
library's words; one sentence per cause, whatever the family."""
from __future__ import annotations

import warnings

import pytest
import torch

from specviz import GenerationConfig, PromptLookup, collect, speculative_generate
from specviz.matrix.families import tiny_model
from specviz.core.errors import SpecvizError
from specviz.modeling import probe
from specviz.modeling.forward import RECURRENT


def _tiny(model_type: str):
    from test_architectures import _shrunk

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, why = _shrunk(model_type)
    assert model is not None, why
    return model


@pytest.mark.parametrize("model_type", ["rwkv", "minimax", "qwen3_next"])
def test_every_model_that_keeps_a_recurrent_state_is_refused_in_the_same_sentence(model_type):
    """RWKV takes a `state` and no cache (it met the probe's first forward and failed with a size
    mismatch); MiniMax and Qwen3-Next have linear-attention layers. One cause, one sentence."""
    model = _tiny(model_type)
    with pytest.raises(SpecvizError) as e:
        collect(speculative_generate(model, PromptLookup(), [3, 5, 7, 9, 3, 5, 7], GenerationConfig(max_new_tokens=4)))
    assert str(e.value) == f"{type(model).__name__} cannot be used for speculative decoding: {RECURRENT}"


@pytest.mark.parametrize("check", range(len(probe.CHECKS)))
def test_a_forward_that_fails_the_probe_is_named_by_the_check_it_failed_then_the_librarys_words(check):
    """The probe's forwards, in order: 6 tokens, 6 with the last changed (three ways), 4 then 2 through a
    cache, 2 again after a rollback. The one that raises names its check before the library's message."""
    model = tiny_model("gpt2")  # transformers' forward, which module hooks see
    calls = []

    def fail(module, args, kwargs):
        calls.append(1)
        nth = {0: 1, 1: 2, 2: 5, 3: 7}[check]  # the forward each check starts with
        if len(calls) == nth:
            raise RuntimeError("The size of tensor a (4) must match the size of tensor b (8) at non-singleton "
                               "dimension 1")

    model.register_forward_pre_hook(fail, with_kwargs=True)
    found = probe.problem(model)
    assert found.startswith(f"specviz's probe checks that {probe.CHECKS[check]} (check {check + 1} of 4)")
    assert found.endswith("(RuntimeError: The size of tensor a (4) must match the size of tensor b (8) at "
                          "non-singleton dimension 1)")
    assert "\n" not in found
