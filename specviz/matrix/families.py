"""Tiny random models of the popular decoder families, built offline from transformers' configs.

"Any model" is a promise about architectures: sliding windows, mixed full and windowed layers,
mixtures of experts, fused or biased projections, learned or rotary positions, logit
soft-capping. Each family here is a 2-layer, 64-wide model that transformers builds from its
config class in a fraction of a second, with the family's defining features switched on and
any window shorter than a test prompt, so the engine meets every cache layout a real checkpoint
of that family would give it. The matrix (cells.py) and the tests share these builders.
"""
from __future__ import annotations

from typing import Callable

import torch

WINDOW = 16  # sliding / chunked attention span: shorter than the matrix's prompts
HIDDEN, LAYERS, HEADS, KV_HEADS = 64, 2, 4, 2


def _common(vocab: int, **extra) -> dict:
    shape = dict(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                 num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=512,
                 tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    shape.update(extra)
    return shape


def _mixed(**extra) -> dict:
    """One sliding layer, then a full one (Gemma 3, Cohere 2, GPT-OSS alternate them)."""
    return dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"], **extra)


def _gpt(vocab: int, **shape) -> dict:
    """GPT-style configs name their sizes their own way: `shape` gives them; the tokens are shared."""
    return dict(vocab_size=vocab, bos_token_id=0, eos_token_id=1, pad_token_id=1, tie_word_embeddings=False, **shape)


def _dbrx(config):
    # transformers 5.25's DBRX attention reads rope_theta from attn_config, which a config built in
    # code lacks (a checkpoint's config.json carries it)
    config.attn_config.rope_theta = config.rope_parameters["rope_theta"]
    return config


def _configs() -> dict[str, Callable[[int], object]]:
    import transformers as tf

    return {
        "llama": lambda v: tf.LlamaConfig(**_common(v)),
        "llama-rope-scaling": lambda v: tf.LlamaConfig(**_common(v, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
        "qwen2": lambda v: tf.Qwen2Config(**_common(v)),
        "qwen3": lambda v: tf.Qwen3Config(**_common(v, head_dim=16)),
        "qwen3-moe": lambda v: tf.Qwen3MoeConfig(**_common(v, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                                           moe_intermediate_size=HIDDEN)),
        "phi3": lambda v: tf.Phi3Config(**_common(v)),
        "olmo2": lambda v: tf.Olmo2Config(**_common(v)),
        "granite": lambda v: tf.GraniteConfig(**_common(v, logits_scaling=2.0, embedding_multiplier=4.0)),
        "gpt2": lambda v: tf.GPT2Config(vocab_size=v, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=512,
                                        bos_token_id=0, eos_token_id=1),
        "gpt-neox": lambda v: tf.GPTNeoXConfig(**_common(v)),
        "falcon": lambda v: tf.FalconConfig(vocab_size=v, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                            num_attention_heads=HEADS, bos_token_id=0, eos_token_id=1),
        "opt": lambda v: tf.OPTConfig(vocab_size=v, hidden_size=HIDDEN, ffn_dim=2 * HIDDEN, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, word_embed_proj_dim=HIDDEN,
                                      max_position_embeddings=512, bos_token_id=0, eos_token_id=1, pad_token_id=1),
        "mistral": lambda v: tf.MistralConfig(**_common(v, sliding_window=WINDOW)),
        "mixtral": lambda v: tf.MixtralConfig(**_common(v, sliding_window=WINDOW, num_local_experts=4,
                                                        num_experts_per_tok=2)),
        "gemma2": lambda v: tf.Gemma2Config(**_common(v, head_dim=16, sliding_window=WINDOW)),
        "gemma3": lambda v: tf.Gemma3TextConfig(**_common(v, head_dim=16, **_mixed())),
        "cohere2": lambda v: tf.Cohere2Config(**_common(v, logit_scale=0.5, **_mixed())),
        "gpt-oss": lambda v: tf.GptOssConfig(**_common(v, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                                       **_mixed())),
        "starcoder2": lambda v: tf.Starcoder2Config(**_common(v, sliding_window=WINDOW)),
        # GPT-style stacks (`transformer.h`, `transformer.blocks`): learned, rotary or ALiBi positions
        "bloom": lambda v: tf.BloomConfig(**_gpt(v, hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS)),
        "gpt-j": lambda v: tf.GPTJConfig(**_gpt(v, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, rotary_dim=8,
                                                n_positions=512)),
        "gpt-neo": lambda v: tf.GPTNeoConfig(**_gpt(v, hidden_size=HIDDEN, num_layers=LAYERS, num_heads=HEADS,
                                                    attention_types=[[["global", "local"], LAYERS // 2]],
                                                    window_size=WINDOW, max_position_embeddings=512)),
        "codegen": lambda v: tf.CodeGenConfig(**_gpt(v, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, rotary_dim=8,
                                                     n_positions=512, n_ctx=512)),
        "gpt-bigcode": lambda v: tf.GPTBigCodeConfig(**_gpt(v, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                                            n_positions=512)),
        "mpt": lambda v: tf.MptConfig(**_gpt(v, d_model=HIDDEN, n_layers=LAYERS, n_heads=HEADS, max_seq_len=512)),
        "dbrx": lambda v: _dbrx(tf.DbrxConfig(**_gpt(v, d_model=HIDDEN, n_layers=LAYERS, n_heads=HEADS,
                                                     max_seq_len=512,
                                                     attn_config={"kv_n_heads": KV_HEADS, "clip_qkv": 8.0},
                                                     ffn_config={"ffn_hidden_size": 2 * HIDDEN,
                                                                 "moe_num_experts": 4, "moe_top_k": 2}))),
        # Llama 4's text model: chunked and full layers, experts, and its base at `.model`, not the
        # `language_model` its base_model_prefix names
        "llama4-text": lambda v: tf.Llama4TextConfig(**_common(v, head_dim=16, intermediate_size_mlp=2 * HIDDEN,
                                                               num_local_experts=4, num_experts_per_tok=1,
                                                               attention_chunk_size=WINDOW)),
    }


FAMILIES = tuple(_configs())  # names only; the config classes are imported when a model is built
SLIDING = ("mistral", "mixtral", "gemma2", "gemma3", "cohere2", "gpt-oss", "starcoder2")


def tiny_config(family: str, vocab: int = 128):
    try:
        return _configs()[family](vocab)
    except KeyError:
        raise ValueError(f"unknown family {family!r}: one of {', '.join(FAMILIES)}") from None


def tiny_model(family: str, vocab: int = 128, seed: int = 0, dtype: torch.dtype = torch.float32):
    """A random `family` model in eval mode, its LM head sharpened so greedy choices have margins
    and sampled distributions are far from uniform, like a trained model's."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(tiny_config(family, vocab)).eval().requires_grad_(False)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return model.to(dtype)
