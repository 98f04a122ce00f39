"""Every causal-LM architecture transformers ships: it runs exactly, or specviz refuses it before the
run in one sentence. Never a library's traceback.

Each config class gets its defaults shrunk to a tiny shape by attribute name (hidden 32, two
layers, a vocabulary of 64, any window of 8) and is built at random; the ones a generic shrink
cannot build (multimodal towers, per-layer configs) are counted, not hidden, and must stay a
minority. Each built model then decodes a repetitive prompt greedily, plainly and with prompt
lookup: the two outputs must be equal, or the speculative run must have been refused with a
SpecvizError whose message is one sentence naming the model.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from specviz import GenerationConfig, PromptLookup, baseline_generate, collect, speculative_generate
from specviz.core.errors import SpecvizError

SMALL = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
    vocab_size=64, head_dim=16, n_embd=32, n_layer=2, n_head=2, d_model=32, ffn_dim=64, n_inner=64, num_layers=2,
    max_position_embeddings=256, n_positions=256, sliding_window=8, attention_chunk_size=8, num_experts=2,
    num_local_experts=2, num_experts_per_tok=1, moe_intermediate_size=32, n_routed_experts=2,
    shared_expert_intermediate_size=32, decoder_layers=2, decoder_attention_heads=2, decoder_ffn_dim=64,
    word_embed_proj_dim=32, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    pad_token_id=0, bos_token_id=0, eos_token_id=1,
)
PARTS = 4
PROMPT = ([3, 5, 7, 9, 11, 13] * 5)[:24]  # longer than any shrunk window


def _architectures() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _shrunk(model_type: str):
    """A tiny random model of this architecture, or the reason a generic shrink could not build one."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        config = CONFIG_MAPPING[model_type]()
        for part in {id(c): c for c in (config, config.get_text_config())}.values():
            for key, value in SMALL.items():
                if hasattr(part, key) and not isinstance(getattr(part, key), (list, dict)):
                    try:
                        setattr(part, key, value)
                    except (AttributeError, TypeError, ValueError):
                        pass  # a derived property: left as the config computes it
            if isinstance(getattr(part, "layer_types", None), list):
                part.layer_types = part.layer_types[:2]
        with torch.device("meta"):
            size = sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(config).parameters())
        if size > 10_000_000:
            return None, f"still {size / 1e6:.0f}M parameters"
        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(config).eval(), ""
    except Exception as e:  # noqa: BLE001 - a config the generic shrink does not fit
        return None, f"{type(e).__name__}"


def _outcome(model) -> tuple[str, str]:
    cfg = GenerationConfig(max_new_tokens=8, k=3, raw_top=0)
    try:
        _, plain = collect(baseline_generate(model, PROMPT, cfg))
        _, spec = collect(speculative_generate(model, PromptLookup(), PROMPT, cfg))
    except SpecvizError as e:
        return "refused", str(e)
    except Exception as e:  # noqa: BLE001 - exactly what must never happen
        return "raw", f"{type(e).__name__}: {e}"
    return ("identical" if spec.token_ids == plain.token_ids else "differs"), ""


@pytest.mark.parametrize("part", range(PARTS))
def test_every_architecture_runs_exactly_or_is_refused_in_one_sentence(part):
    names = _architectures()[part::PARTS]
    outcomes, unbuilt = {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            model, why = _shrunk(name)
            if model is None:
                unbuilt[name] = why
                continue
            outcomes[name] = _outcome(model)
    assert len(outcomes) >= 0.6 * len(names), f"only {len(outcomes)} of {len(names)} built: {unbuilt}"
    bad = {n: o for n, o in outcomes.items() if o[0] in ("raw", "differs")}
    assert not bad, bad
    for name, (kind, message) in outcomes.items():
        if kind == "refused":
            assert "\n" not in message and len(message) <= 400, (name, message)
            assert "cannot be used for speculative decoding" in message, (name, message)
    assert sum(kind == "identical" for kind, _ in outcomes.values()) >= 0.5 * len(outcomes)


def test_a_model_that_needs_its_own_code_is_refused_saying_how_to_allow_it(tmp_path, capsys):
    import json

    from specviz.cli.main import main as cli_main

    folder = tmp_path / "mystery"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "mystery", "architectures": ["MysteryForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_mystery.MysteryConfig",
                     "AutoModelForCausalLM": "modeling_mystery.MysteryForCausalLM"}}))
    (folder / "configuration_mystery.py").write_text("raise SystemExit('remote code ran without permission')\n")
    assert cli_main(["generate", "--prompt", "hi", "--target", str(folder), "--no-baseline"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]  # after "loading ..."
    assert len(errors) == 1 and "needs code from its own repository" in errors[0], errors
    assert "--trust-remote-code" in errors[0] and "Traceback" not in errors[0]
