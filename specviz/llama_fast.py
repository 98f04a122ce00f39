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

import torch
import torch.nn.functional as F
from torch import nn

MODEL_TYPES = ("llama", "qwen2")  # same decoder layout; qwen2 only adds q/k/v biases (inside the Linear)
_BLOCK = 256  # cache grows in blocks of this many positions (doubling), never per token


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


class KVCache:
    """Keys and values per layer, (kv_heads, capacity, head_dim), valid up to `length`."""

    def __init__(self, model):
        cfg = model.config
        self.n_layers = len(model.model.layers)
        self.kv_heads = cfg.num_key_value_heads or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        self.length = 0
        self.capacity = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    def get_seq_length(self) -> int:
        return self.length

    def reserve(self, needed: int) -> None:
        """Make room for `needed` positions; grows by doubling so copies stay rare."""
        if needed <= self.capacity:
            return
        cap = max(_BLOCK, self.capacity)
        while cap < needed:
            cap *= 2
        shape = (self.kv_heads, cap, self.head_dim)
        new_k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.n_layers)]
        new_v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.n_layers)]
        for old, new in ((self.k, new_k), (self.v, new_v)):
            for o, n in zip(old, new):
                n[:, : self.length] = o[:, : self.length]
        self.k, self.v, self.capacity = new_k, new_v, cap

    def crop(self, length: int) -> None:
        self.length = min(self.length, length)

    def keep_rows(self, start: int, rows: list[int]) -> None:
        """Keep positions start+rows[j] at start+j and drop everything after (a tree's
        accepted path moves next to the context; rows are ascending, so moves go left)."""
        src = torch.tensor(rows, device=self.device) + start
        end = start + len(rows)
        for t in (*self.k, *self.v):
            t[:, start:end] = t[:, src]  # the gather copies first: overlapping is safe
        self.length = end


# --- Pre-packed weights for the CPU's few-row matrix multiplies -------------------------
# A verify step multiplies 2-17 rows by every weight matrix. From 4 rows up MKL's sgemm
# takes a kernel that, by all appearances, repacks the weight on every call: a step costs
# 1.5-2x a one-token step on this project's CPUs. Packing each weight once (MKL's
# packed-GEMM API, the one inductor uses when it freezes a CPU model) drops that to ~1.3x:
# the verify cost is what decides whether a draft pays. The packed copy is ~3x the
# weight's size, so only models whose packed copies fit PACK_BUDGET (and a quarter of the
# RAM) are packed; SPECVIZ_PACK=0 turns packing off.

PACK_BUDGET = 4 << 30  # bytes of packed copies at most (SmolLM2-135M needs ~1.6 GB)
_PACK_MIN = 4  # fewer rows take MKL's unpacked kernels, which are as fast there (measured)
_PACK_ROWS = 16  # the row count MKL is told to pack for; any count works (checked below)
_packed: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


def _memory() -> int:
    """Bytes of RAM on this machine (a large number where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def _pack_wanted(model) -> bool:
    if os.environ.get("SPECVIZ_PACK", "1") == "0" or not torch.backends.mkl.is_available():
        return False
    p = model.get_output_embeddings().weight
    return p.device.type == "cpu" and p.dtype == torch.float32 and hasattr(torch.ops.mkl, "_mkl_linear")


def _pack_one(weight: torch.Tensor) -> torch.Tensor | None:
    """MKL's packed form of `weight`, or None if it does not reproduce F.linear here."""
    try:
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, _PACK_ROWS)
        for rows in (1, 5, 17):  # packed for one count, called with others: check it holds
            x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows))
            got = torch.ops.mkl._mkl_linear(x, packed, weight, None, rows)
            if not torch.allclose(got, F.linear(x, weight), rtol=1e-4, atol=1e-4):
                return None
        return packed
    except (RuntimeError, AttributeError):
        return None


class _Packed:
    """Linear layers that read the same input, packed as one stacked weight (q/k/v, or gate/up)."""

    def __init__(self, modules: tuple, packed: torch.Tensor):
        self.modules, self.packed = modules, packed
        self.sizes = [m.weight.shape[0] for m in modules]
        # MKL's op wants the unpacked weight too, only for its shape when called as we call it.
        w = modules[0].weight
        self.shape = w.new_zeros(()).expand(sum(self.sizes), w.shape[1])
        biases = [m.bias for m in modules]
        self.bias = None if all(b is None for b in biases) else torch.cat(
            [b.detach() if b is not None else w.new_zeros(n) for b, n in zip(biases, self.sizes)])
        self.stamps = self._stamps()

    def _stamps(self):
        return tuple((m.weight.data_ptr(), m.weight._version) for m in self.modules)

    def fresh(self) -> bool:
        """False once any weight was replaced or changed in place after packing."""
        return self._stamps() == self.stamps

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        y = torch.ops.mkl._mkl_linear(x, self.packed, self.shape, self.bias, x.shape[0])
        return list(y.split(self.sizes, dim=-1))


def _groups(model) -> list[tuple]:
    """The linears to pack, grouped by shared input: one multiply per group."""
    groups = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        groups += [(attn.q_proj, attn.k_proj, attn.v_proj), (attn.o_proj,),
                   (mlp.gate_proj, mlp.up_proj), (mlp.down_proj,)]
    groups.append((model.get_output_embeddings(),))
    return groups


def pack(model) -> dict:
    """Pack the decoder's and LM head's weights for few-row CPU multiplies, once per model;
    returns {tuple of linears: _Packed}, empty when the model is not packed."""
    if model in _packed:
        return _packed[model]
    table: dict = {}
    if _pack_wanted(model):
        groups = _groups(model)
        if 3 * 4 * sum(m.weight.numel() for g in groups for m in g) <= min(PACK_BUDGET, _memory() // 4):
            with torch.no_grad():
                for g in groups:
                    w = g[0].weight.detach() if len(g) == 1 else torch.cat([m.weight.detach() for m in g])
                    packed = _pack_one(w)
                    if packed is None:  # this MKL packs differently: use none of it
                        table = {}
                        break
                    table[g] = _Packed(g, packed)
    _packed[model] = table
    return table


def linears(modules: tuple, x: torch.Tensor, table: dict | None) -> list[torch.Tensor]:
    """[m(x) for m in modules], as one packed multiply when there is a current packed copy."""
    entry = table.get(modules) if table else None
    if entry is None or x.shape[0] < _PACK_MIN or not entry.fresh():
        return [m(x) for m in modules]  # not packed, or a weight changed since: the modules' own path
    return entry(x)


def head(model, h: torch.Tensor) -> torch.Tensor:
    """The LM head over hidden states `h` (rows, hidden)."""
    return linears((model.get_output_embeddings(),), h, pack(model))[0]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _attention(attn, x, cos, sin, k_cache, v_cache, start, mask, groups, scale, table):
    t = x.shape[0]
    d = k_cache.shape[-1]
    q, k, v = linears((attn.q_proj, attn.k_proj, attn.v_proj), x, table)
    q = q.reshape(t, -1, d).transpose(0, 1)  # (heads, t, d)
    k = k.reshape(t, -1, d).transpose(0, 1)  # (kv_heads, t, d)
    v = v.reshape(t, -1, d).transpose(0, 1)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    end = start + t
    k_cache[:, start:end] = k
    v_cache[:, start:end] = v
    kv_heads, d = k_cache.shape[0], k_cache.shape[-1]
    # Grouped-query attention without copying keys: the `groups` query heads that share a
    # key/value head become extra query rows of that head.
    q = q.reshape(kv_heads, groups * t, d)
    # A leading batch axis: with 4-D inputs the CPU takes its fused (flash) kernel, 2x
    # faster at these sizes than the unfused maths it runs for 3-D ones.
    out = F.scaled_dot_product_attention(
        q[None], k_cache[None, :, :end], v_cache[None, :, :end], attn_mask=mask, scale=scale
    )[0]  # (kv_heads, groups*t, d)
    out = out.view(kv_heads * groups, t, d).transpose(0, 1).reshape(t, -1)
    return linears((attn.o_proj,), out, table)[0]


def _mlp(mlp, x, table):
    gate, up = linears((mlp.gate_proj, mlp.up_proj), x, table)
    return linears((mlp.down_proj,), mlp.act_fn(gate) * up, table)[0]


def causal_mask(t: int, start: int, device) -> torch.Tensor | None:
    """Row i (position start+i) sees positions 0..start+i; None for a single new token."""
    if t == 1:
        return None
    cols = torch.arange(start + t, device=device)
    rows = torch.arange(start, start + t, device=device)
    return cols[None, :] <= rows[:, None]


_compiled = None  # torch.compile'd decoder stack, when enable_compile() was called


def enable_compile(on: bool = True, backend: str = "inductor") -> None:
    """Run the decoder stack through torch.compile (dynamic shapes: draft lengths and the
    cache length vary). Each new shape family compiles once, seconds on a CPU; afterwards a
    step saves the Python and small-op overhead. Off by default: measure before adopting."""
    global _compiled
    _compiled = torch.compile(_stack, dynamic=True, backend=backend) if on else None


_FUSABLE_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm")  # weight * x / sqrt(mean(x^2) + eps), nothing else


def _norm(norm, x):
    """The model's RMSNorm; for float32 PyTorch's fused op (the same maths in one kernel
    instead of six: ~10 us a call here instead of ~21)."""
    if x.dtype == torch.float32 and type(norm).__name__ in _FUSABLE_NORMS:
        return F.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)
    return norm(x)


def _stack(layers, x, cos, sin, ks, vs, start: int, mask, groups: int, table):
    for layer, k_cache, v_cache in zip(layers, ks, vs):
        attn = layer.self_attn
        h = _norm(layer.input_layernorm, x)
        x = x + _attention(attn, h, cos, sin, k_cache, v_cache, start, mask, groups, attn.scaling, table)
        x = x + _mlp(layer.mlp, _norm(layer.post_attention_layernorm, x), table)
    return x


def hidden_states(model, ids: torch.Tensor, cache: KVCache, mask: torch.Tensor | None = None,
                  positions: torch.Tensor | None = None) -> torch.Tensor:
    """Final hidden states (after the last norm) for `ids` (1-D) appended after the cache.

    `mask` (t, length+t) bool and `positions` (t,) override the causal chain (tree drafts).
    """
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
    cos, sin = cos[0].to(x.dtype), sin[0].to(x.dtype)  # (t, d), broadcast over heads
    run = _compiled or _stack
    table = None if _compiled else pack(model)
    x = run(base.layers, x, cos, sin, cache.k, cache.v, start, mask, groups, table)
    cache.length = start + t
    return base.norm(x)
