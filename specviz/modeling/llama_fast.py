"""A compact forward for Llama-layout decoders over a position-indexed KV cache.

transformers' DynamicCache grows by `torch.cat` every step, and its attention copies the
key/value heads for grouped-query attention (`repeat_kv`). On a CPU those two copies are
about a quarter of a decode step. Here the cache is preallocated per layer and indexed by
position (gpt-fast's layout), so appending is a slice write and a rollback is a length
reset. Grouped-query attention runs without copies by folding each key/value head's query
heads into the query-length axis.

It reuses the model's own modules (projections, norms, MLP, rotary embedding): no weights
are copied and the numerics are the model's. Architectures outside the checked layout
fall back to transformers' forward (see `supports`).
"""
from __future__ import annotations

import os
import weakref
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .layers import KVCache, causal_mask, rms_norm, rope_rolled, signed_sin, write
from .packing import joined, linears, pack

MODEL_TYPES = ("llama", "qwen2")  # same decoder layout; qwen2 only adds q/k/v biases (inside the Linear)


def supports(model) -> bool:
    """Can this model take the fast path? (SPECVIZ_FAST=0 turns it off, for comparison.)"""
    if os.environ.get("SPECVIZ_FAST", "1") == "0":
        return False
    cfg = model.config
    if getattr(cfg, "model_type", None) not in MODEL_TYPES or hasattr(model, "hf_device_map"):
        return False
    if getattr(cfg, "use_sliding_window", False) or getattr(cfg, "layer_types", None) and any(
        t != "full_attention" for t in cfg.layer_types
    ):
        return False
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers) or not hasattr(base, "rotary_emb"):
        return False
    attn, mlp = layers[0].self_attn, layers[0].mlp
    return (all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")) and not hasattr(attn, "q_norm")
            and all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")))


def pass_shapes(cfg) -> list[str]:
    """The weight shapes ("960x576") a forward of a model with this config multiplies, in order: what
    packing.pass_costs prices before the model is loaded."""
    hidden, heads = cfg.hidden_size, cfg.num_attention_heads
    kv = cfg.num_key_value_heads or heads
    d = getattr(cfg, "head_dim", None) or hidden // heads
    layer = [f"{(heads + 2 * kv) * d}x{hidden}", f"{hidden}x{heads * d}", f"{2 * cfg.intermediate_size}x{hidden}",
             f"{hidden}x{cfg.intermediate_size}"]
    return layer * cfg.num_hidden_layers + [f"{cfg.vocab_size}x{hidden}"]


def new_cache(model) -> KVCache:
    """An empty cache shaped for `model`'s layers, on its device and in its dtype."""
    cfg = model.config
    p = next(model.parameters())
    return KVCache(len(model.model.layers), cfg.num_key_value_heads or cfg.num_attention_heads,
                   getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
                   dtype=p.dtype, device=p.device)


def head(model, h: torch.Tensor) -> torch.Tensor:
    """The LM head over hidden states `h` (rows, hidden)."""
    return linears((model.get_output_embeddings(),), h, pack(model))[0]


def _attention(attn, x, cos, ssin, k_cache, v_cache, start, mask, groups, scale, table):
    t = x.shape[0]
    kv_heads, d = k_cache.shape[0], k_cache.shape[-1]
    heads = kv_heads * groups
    qkv = joined((attn.q_proj, attn.k_proj, attn.v_proj), x, table)  # (t, (heads + 2 kv_heads) * d)
    # q and k rotated in one pass: (t, heads + kv_heads, d), cos and sin broadcast over the heads
    qk = rope_rolled(qkv[:, :(heads + kv_heads) * d].view(t, heads + kv_heads, d), cos[:, None], ssin[:, None])
    v = qkv[:, (heads + kv_heads) * d:].view(t, kv_heads, d).transpose(0, 1)  # (kv_heads, t, d)
    keys, values = write(k_cache, v_cache, start, qk[:, heads:].transpose(0, 1), v)
    # Grouped-query attention without copying keys: the `groups` query heads that share a
    # key/value head become extra query rows of that head.
    q = qk[:, :heads].transpose(0, 1).reshape(kv_heads, groups * t, d)
    # A leading batch axis: with 4-D inputs the CPU takes its fused (flash) kernel, faster at
    # these sizes than the unfused maths it runs for 3-D ones (docs/performance.md).
    out = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, scale=scale)[0]
    # reshape, not view: CUDA's kernels may hand the output back in another memory layout
    out = out.reshape(kv_heads * groups, t, d).transpose(0, 1).reshape(t, -1)  # (t, heads * d)
    return linears((attn.o_proj,), out, table)[0]


def _mlp(mlp, x, table):
    gate, up = linears((mlp.gate_proj, mlp.up_proj), x, table)
    return linears((mlp.down_proj,), mlp.act_fn(gate) * up, table)[0]


_FUSABLE_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm")  # weight * x / sqrt(mean(x^2) + eps), nothing else


def _norm(norm, x):
    """The model's RMSNorm, as the shared one (layers.rms_norm: fused in fp32, transformers' own maths
    in half precision) where it is plain RMSNorm."""
    if type(norm).__name__ in _FUSABLE_NORMS:
        return rms_norm(x, norm.weight, norm.variance_epsilon)
    return norm(x)


def _stack(layers, x, cos, sin, ks, vs, start: int, mask, groups: int, table, taps=()):
    """The decoder layers over x; returns their output and the inputs of the layers in `taps`."""
    inputs = []
    for i, (layer, k_cache, v_cache) in enumerate(zip(layers, ks, vs)):
        if i in taps:
            inputs.append(x)
        attn = layer.self_attn
        h = _norm(layer.input_layernorm, x)
        x = x + _attention(attn, h, cos, sin, k_cache, v_cache, start, mask, groups, attn.scaling, table)
        x = x + _mlp(layer.mlp, _norm(layer.post_attention_layernorm, x), table)
    return x, inputs


# The torch.compile'd decoder stack of each model prepared with compile (models.load(compile=True)).
_compiled: "weakref.WeakKeyDictionary[nn.Module, object]" = weakref.WeakKeyDictionary()


def compile_stack(model, backend: str = "inductor"):
    """Run `model`'s decoder stack through torch.compile (dynamic shapes: draft lengths and
    the cache length vary). Each new shape family compiles once, seconds on a CPU;
    afterwards a step saves the Python and small-op overhead. Measure before adopting.
    A compiled stack reads the modules' own weights: packing (packing.py) is left out."""
    compiled = _compiled[model] = torch.compile(_stack, dynamic=True, backend=backend)
    return compiled


def hidden_states(model, ids: torch.Tensor, cache: KVCache, mask: torch.Tensor | None = None,
                  positions: torch.Tensor | None = None) -> torch.Tensor:
    """Final hidden states (after the last norm) for `ids` (1-D) appended after the cache.

    `mask` (t, length+t) bool and `positions` (t,) override the causal chain (tree drafts).
    """
    return states(model, ids, cache, mask, positions)[0]


def states(model, ids: torch.Tensor, cache: KVCache, mask: torch.Tensor | None = None,
           positions: torch.Tensor | None = None, layers: Sequence[int] = (),
           final: bool = True) -> tuple[torch.Tensor | None, list]:
    """`hidden_states`, and the inputs of the decoder layers numbered in `layers` (layer i's
    input is transformers' hidden_states[i]; EAGLE-3 reads three), in layer order.
    final=False stops before the last layer in `layers` and returns (None, inputs): the
    inner states alone cost only the layers below them (training data, train/data.py); the
    cache then holds only those layers' keys and values, so it serves no later call."""
    if not final and not layers:
        raise ValueError("final=False needs the layers to return")
    base = model.model
    cfg = model.config
    t, start = ids.numel(), cache.length
    cache.reserve(start + t)
    if positions is None:
        positions = torch.arange(start, start + t, device=ids.device)
    if mask is None:
        mask = causal_mask(t, start, ids.device)
    heads = cfg.num_attention_heads
    groups = heads // cache.kv_heads
    if mask is not None:
        mask = mask.repeat(groups, 1)  # one row block per folded query head
    x = base.embed_tokens(ids)  # (t, hidden)
    cos, sin = base.rotary_emb(x[None], positions[None])
    cos, sin = cos[0].to(x.dtype), signed_sin(sin[0].to(x.dtype))  # (t, d), broadcast over heads
    compiled = _compiled.get(model)
    run, table = (compiled, None) if compiled and final else (_stack, pack(model))
    n = len(base.layers) if final else max(layers)  # the last tap's input is the output of the layers below it
    blocks = base.layers if final else base.layers[:n]
    x, inputs = run(blocks, x, cos, sin, cache.k[:n], cache.v[:n], start, mask, groups, table, tuple(layers))
    cache.length = start + t
    if not final:
        return None, inputs + [x]
    return base.norm(x), inputs


def decode_rows(model, tokens: torch.Tensor, ks: Sequence[torch.Tensor], vs: Sequence[torch.Tensor], col: int,
                visible: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One new token for each of B independent sequences: final hidden states (B, hidden).

    The sequences' caches share columns (left padding, as in batched generation): layer i's
    keys and values are ks[i], vs[i] (B, kv_heads, capacity, head_dim); the new ones go to
    column `col`. visible (B, col + 1) bool says which columns each row attends to (its own
    tokens, not the padding); positions (B,) is each row's rotary position."""
    base = model.model
    b = tokens.shape[0]
    kv_heads, d = ks[0].shape[1], ks[0].shape[-1]
    groups = model.config.num_attention_heads // kv_heads
    x = base.embed_tokens(tokens)  # (B, hidden)
    cos, sin = base.rotary_emb(x[:, None], positions[:, None])  # (B, 1, d)
    cos, sin = cos[:, None].to(x.dtype), signed_sin(sin[:, None].to(x.dtype))  # (B, 1, 1, d): over heads
    mask = visible[:, None, None, :]  # (B, 1, 1, col + 1): over heads and folded query rows
    table = pack(model)
    for layer, k_cache, v_cache in zip(base.layers, ks, vs):
        attn = layer.self_attn
        q, k, v = linears((attn.q_proj, attn.k_proj, attn.v_proj), _norm(layer.input_layernorm, x), table)
        k_cache[:, :, col] = rope_rolled(k.view(b, kv_heads, 1, d), cos, sin)[:, :, 0]
        v_cache[:, :, col] = v.view(b, kv_heads, d)
        # grouped-query attention as in _attention: a key/value head's query heads are its query rows
        q = rope_rolled(q.view(b, kv_heads * groups, 1, d), cos, sin).view(b, kv_heads, groups, d)
        out = F.scaled_dot_product_attention(q, k_cache[:, :, :col + 1], v_cache[:, :, :col + 1], attn_mask=mask,
                                             scale=attn.scaling)
        x = x + linears((attn.o_proj,), out.reshape(b, -1), table)[0]
        x = x + _mlp(layer.mlp, _norm(layer.post_attention_layernorm, x), table)
    return base.norm(x)
