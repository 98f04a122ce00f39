"""One way to find a model's decoder stack, on every layout the families use, and what reads it:
training's target passes, layer skip, EAGLE's and Medusa's features."""
from __future__ import annotations

import pytest
import torch

from specviz import GenerationConfig, LayerSkip, SpecvizError, baseline_generate, collect, speculative_generate
from specviz.drafters.layer_skip import default_layers, skip_layers
from specviz.matrix import cells as matrix
from specviz.matrix.families import tiny_model
from specviz.modeling.forward import forward, new_cache
from specviz.modeling.stack import find
from specviz.train.generate import generate, teacher_force

LAYOUTS = {
    "llama": "model.layers", "gpt2": "transformer.h", "bloom": "transformer.h", "gpt-j": "transformer.h",
    "gpt-neo": "transformer.h", "codegen": "transformer.h", "gpt-bigcode": "transformer.h", "falcon": "transformer.h",
    "mpt": "transformer.blocks", "dbrx": "transformer.blocks", "opt": "model.decoder.layers",
    "llama4-text": "model.layers",  # its base_model_prefix says `language_model`
}
GPT_STYLE = [f for f, path in LAYOUTS.items() if not path.startswith("model.layers")]


@pytest.mark.parametrize("family", LAYOUTS)
def test_the_stack_is_found_and_its_body_gives_the_heads_input(family):
    model = tiny_model(family)
    found = find(model)
    assert found.path == LAYOUTS[family] and len(found.layers) == 2
    assert found.embed is model.get_input_embeddings() and found.head is model.get_output_embeddings()
    assert found.norm is not None
    ids = torch.tensor([matrix.prompt()[:12]])
    with torch.inference_mode():
        out = found.body(input_ids=ids)
        torch.testing.assert_close(found.head(out[0]), model(input_ids=ids).logits)


@pytest.mark.parametrize("family", ["gpt2", "bloom", "mpt", "opt", "llama4-text"])
def test_training_writes_the_targets_greedy_text_and_forces_its_features(family):
    """The training data's two target passes: the batched writer's text is plain greedy decoding's,
    and teacher forcing records the features the engine reads at inference (Llama 4's failed on
    `last_hidden_state`; BLOOM and MPT take no position ids)."""
    model = tiny_model(family)
    prompts = [matrix.prompt()[:9], matrix.prompt(2)[:5]]
    written = generate(model, prompts, max_new_tokens=6, eos=[1], pad=1)
    for p, got in zip(prompts, written):
        _, end = collect(baseline_generate(model, p, GenerationConfig(max_new_tokens=6, eos_token_ids=(1,))))
        assert got == list(end.token_ids)
    seq = torch.tensor(prompts[0] + written[0])
    (hidden, top_p, top_ids), = teacher_force(model, [seq], top_k=3)
    with torch.inference_mode():
        logits, h = forward(model, seq, new_cache(model), hidden=True)
    torch.testing.assert_close(hidden.float(), h, atol=2e-3, rtol=2e-3)  # recorded in half precision
    assert top_ids[:, 0].tolist() == logits.argmax(-1).tolist()


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_specviz_train_runs_on_llama_4s_text_model(kind, tmp_path, capsys):
    """`specviz train` ended in a traceback on Llama 4 text (`get_decoder()` gave the whole model back)."""
    import json

    from specviz.cli.main import main as cli_main
    from tiny_folder import make_family_dir

    folder = make_family_dir(tmp_path / "llama4", "llama4-text")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": text}) + "\n" for i, text in enumerate(
        ["the cat sat on the mat", "hello world said the dog", "one two three four", "what is a good book"])))
    argv = ["train", kind, "--target", str(folder), "--prompts", str(prompts), "--data", str(tmp_path / "data"),
            "--out", str(tmp_path / "out"), "--steps", "2", "--batch", "2", "--held-out", "1", "--eval-tokens", "4",
            "--passes", "1", "--max-new-tokens", "6", "--device", "cpu"]
    assert cli_main(argv) == 0, capsys.readouterr().err
    assert (tmp_path / "out" / f"{kind}.safetensors").is_file()
    assert "held-out:" in capsys.readouterr().err


@pytest.fixture(scope="module")
def deep():
    return {family: _four_layers(family) for family in GPT_STYLE}


def _four_layers(family):
    config = tiny_model(family).config
    for name in ("num_hidden_layers", "n_layer", "n_layers", "num_layers"):
        if name in config.to_dict() or hasattr(type(config), name):
            try:
                setattr(config, name, 4)
            except (AttributeError, TypeError):
                pass
    if family == "gpt-neo":
        config.attention_layers = ["global", "local"] * 2
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval().requires_grad_(False)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    assert len(find(model).layers) == 4, family
    return model


@pytest.mark.parametrize("family", GPT_STYLE)
def test_layer_skip_runs_gpt_style_stacks_exactly_and_only_the_kept_layers(family, deep):
    model = deep[family]
    ran = []
    hooks = [layer.register_forward_hook(lambda m, a, o, i=i: ran.append(i))
             for i, layer in enumerate(find(model).layers)]
    try:
        view = skip_layers(model, [0, 3])
        assert len(find(view).layers) == 2 and len(find(model).layers) == 4  # the target keeps its stack
        with torch.inference_mode():
            forward(view, torch.tensor(matrix.prompt()[:8]), new_cache(view))
        assert ran == [0, 3]
    finally:
        for h in hooks:
            h.remove()
    ids, cfg = matrix.prompt(), GenerationConfig(max_new_tokens=16, k=3)
    _, plain = collect(baseline_generate(model, ids, cfg))
    for keep in (None, [0, 3]):
        _, spec = collect(speculative_generate(model, LayerSkip(model, keep), ids, cfg))
        assert spec.token_ids == plain.token_ids, (family, keep)


def test_layer_skip_keeps_each_layers_kind_in_place_or_says_which_would_move():
    """Llama 4 alternates chunked and full layers and hands each the mask of the kind at its place:
    a kept layer must land where its kind is, and the default keeps only such layers."""
    from transformers import AutoModelForCausalLM

    config = tiny_model("llama4-text").config
    config.num_hidden_layers, config.layer_types = 4, ["chunked_attention", "full_attention"] * 2
    config.no_rope_layers = [1, 1, 1, 0]
    model = AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(SpecvizError) as e:
        skip_layers(model, [0, 2])
    assert "`model.layers`" in str(e.value) and "layer 2 (chunked_attention) would run as layer 1" in str(e.value)
    assert "language_model" not in str(e.value)
    assert default_layers(4, config.layer_types) == [0, 1]
    assert default_layers(8, ["a", "b"] * 4) == [0, 1, 2, 7]
    ids, cfg = matrix.prompt(), GenerationConfig(max_new_tokens=12, k=3)
    _, plain = collect(baseline_generate(model, ids, cfg))
    _, spec = collect(speculative_generate(model, LayerSkip(model, [0, 3]), ids, cfg))
    assert spec.token_ids == plain.token_ids


def test_a_model_without_a_layer_list_is_refused_naming_what_was_looked_for():
    class Flat(torch.nn.Module):
        pass

    with pytest.raises(SpecvizError, match=r"Flat has no list of decoder layers .*\(layers, h, blocks\)"):
        LayerSkip(Flat())
