"""Self-speculation by layer skipping: a view of the target that shares its weights."""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_llama
from specviz import GenerationConfig, LayerSkip, SpecvizError, baseline_generate, collect, speculative_generate
from specviz.drafters.layer_skip import default_layers, parse_layers, skip_layers
from specviz.modeling.forward import forward, new_cache


@pytest.fixture(scope="module")
def six():
    return tiny_llama(layers=6, seed=4)


def test_the_view_runs_only_the_kept_layers_and_leaves_the_target_whole(six):
    view = skip_layers(six, [0, 3])
    assert len(view.model.layers) == 2 and len(six.model.layers) == 6
    assert view.lm_head is six.lm_head and view.model.layers[1] is six.model.layers[3]
    ids = torch.arange(2, 12)
    with torch.inference_mode():
        everything = forward(skip_layers(six, range(6)), ids, new_cache(six))
        assert torch.allclose(everything, forward(six, ids, new_cache(six)))
        assert not torch.allclose(forward(view, ids, new_cache(view)), everything)


@pytest.mark.parametrize("keep", [None, [0], [0, 2, 5]])
def test_greedy_output_is_the_targets(six, keep):
    cfg = GenerationConfig(max_new_tokens=30, k=3)
    prompt = list(range(5, 20))
    _, base = collect(baseline_generate(six, prompt, cfg))
    steps, end = collect(speculative_generate(six, LayerSkip(six, keep), prompt, cfg))
    assert end.token_ids == base.token_ids


def test_layer_lists():
    assert parse_layers("0-2,5", 8) == [0, 1, 2, 5]
    assert default_layers(30)[:8] == list(range(8)) and 29 in default_layers(30) and len(default_layers(30)) < 30
    # A 2-layer stack kept both layers (the target drafting for itself at twice the cost): now its first.
    assert default_layers(2) == default_layers(3) == [0] and default_layers(4) == [0, 1, 3]
    with pytest.raises(SpecvizError, match="one decoder layer, so layer skipping has none to drop"):
        LayerSkip(tiny_llama(layers=1))
    with pytest.raises(SpecvizError, match="include 0"):
        skip_layers(tiny_llama(layers=2), [1])
    with pytest.raises(SpecvizError, match="not like"):
        parse_layers("zero-two", 8)


@pytest.mark.parametrize("text", ["0-1000", "0-1000000000000", "5-2"])
def test_a_layer_range_beyond_the_target_is_one_line_and_builds_no_list(text):
    with pytest.raises(SpecvizError) as e:  # '0-10**12' would take minutes and gigabytes to expand
        parse_layers(text, 30)
    assert "30 layers (0-29)" in str(e.value) and len(str(e.value)) < 120
