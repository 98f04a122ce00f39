"""The distilled draft model: a small causal LM trained to match the target's distributions.

It reads and writes through the target's own token embeddings (shared, never copied), so
the file holds only what is new: a projection in (target width -> 256), a few small
decoder layers, and a projection out. Its output covers a frequent-token subset of the
vocabulary: the head is the target's output embedding rows for those tokens, folded with
the projection into one (subset, 256) matrix at load time, so a draft step costs a
fraction of the target's 49k-row head. Off the subset its q is 0, which verification
handles exactly (those tokens are simply never drafted).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import SpecvizError
from ..modeling.layers import KVCache, RMSNorm, causal_mask, inverse_frequencies, rope, rotary, write
from ..modeling.packing import dense, linear
from .base import Autoregressive


@dataclass(frozen=True)
class DistilledConfig:
    vocab: int  # the target's vocabulary (full-width q rows)
    target_hidden: int  # width of the target's embeddings
    subset: int  # how many frequent tokens the head covers
    hidden: int = 256
    layers: int = 3
    heads: int = 4
    ffn: int = 768
    rope_theta: float = 10000.0


class Block(nn.Module):
    def __init__(self, c: DistilledConfig):
        super().__init__()
        self.heads, self.head_dim = c.heads, c.hidden // c.heads
        self.norm1 = RMSNorm(c.hidden, 1e-6)
        self.qkv = nn.Linear(c.hidden, 3 * c.hidden, bias=False)
        self.out = nn.Linear(c.hidden, c.hidden, bias=False)
        self.norm2 = RMSNorm(c.hidden, 1e-6)
        self.gate_up = nn.Linear(c.hidden, 2 * c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.hidden, bias=False)

    def forward(self, x, cos, sin, cache=None, layer=0, mask=None):
        """x (B, T, hidden). With `cache` (B = 1), keys/values are written at its length."""
        b, t, _ = x.shape
        q, k, v = linear(self.qkv, self.norm1(x)).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if cache is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            keys, values = write(cache.k[layer], cache.v[layer], cache.length, k[0], v[0])
            a = F.scaled_dot_product_attention(q, keys[None], values[None], attn_mask=mask)
        x = x + linear(self.out, a.transpose(1, 2).reshape(b, t, -1))
        gate, up = linear(self.gate_up, self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class DistilledLM(nn.Module):
    """Logits over the token subset `keep` for each input position.

    The target's input embedding and output-embedding rows are plain attributes (`attach`),
    not parameters: they are neither trained nor saved.
    """

    def __init__(self, config: DistilledConfig, keep: torch.Tensor):
        super().__init__()
        c = self.config = config
        if c.hidden % c.heads or (c.hidden // c.heads) % 2:
            raise SpecvizError("hidden size must split into an even head size per head")
        self.inp = nn.Linear(c.target_hidden, c.hidden, bias=False)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden, 1e-6)
        self.up = nn.Linear(c.hidden, c.target_hidden, bias=False)
        self.bias = nn.Parameter(torch.zeros(c.subset))
        self.register_buffer("keep", keep.long().clone())  # saved: which tokens the head covers
        self.register_buffer("inv_freq", inverse_frequencies(c.hidden // c.heads, c.rope_theta), persistent=False)
        self.embed = self.head_rows = self.fused = None

    def attach(self, target_model) -> "DistilledLM":
        """Share the target's embeddings (its input table; its output rows for `keep`)."""
        inp = target_model.get_input_embeddings().weight
        head = target_model.get_output_embeddings().weight
        if inp.shape[1] != self.config.target_hidden or head.shape[0] < int(self.keep.max()) + 1:
            raise SpecvizError("this distilled draft model does not fit the target's embeddings")
        self.embed = inp.detach()
        self.head_rows = head.detach()[self.keep.to(head.device)].float()
        self.fused = None
        return self

    def new_cache(self, device) -> KVCache:
        c = self.config
        return KVCache(c.layers, c.heads, c.hidden // c.heads, device=device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Training: ids (B, T) -> subset logits (B, T, subset), causal, no cache."""
        x = self.inp(F.embedding(ids, self.embed).float())
        cos, sin = rotary(self.inv_freq, torch.arange(ids.shape[1], device=ids.device), x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        head = self.head_rows @ self.up.weight  # (subset, hidden): cheaper than per-token up-projection
        return self.norm(x) @ head.T + self.bias

    @torch.no_grad()
    def step(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Inference: ids (t,) after what `cache` holds -> subset logits (t, subset)."""
        if self.fused is None:
            self.fused = self.head_rows @ self.up.weight
        t, start = ids.numel(), cache.length
        cache.reserve(start + t)
        x = self.inp(F.embedding(ids, self.embed).float())[None]
        cos, sin = rotary(self.inv_freq, torch.arange(start, start + t, device=ids.device), x.dtype)
        mask = causal_mask(t, start, ids.device)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, cache, i, mask)
        cache.length = start + t
        return dense(self.norm(x[0]), self.fused, self.bias)


class DistilledDrafter(Autoregressive):
    """Drafts over its token subset from its own cache (base.Autoregressive)."""

    name = "distilled draft"

    def _start(self) -> None:
        self.cache = self.model.new_cache(self.device)
        self.keep = self.model.keep.to(self.device)

    def _step(self, tokens: torch.Tensor) -> torch.Tensor:
        """The next token's subset logits as a full-vocabulary row (-inf off the subset: q = 0 there)."""
        logits = self.model.step(tokens, self.cache)[-1:]
        full = torch.full((logits.shape[0], self.processor.vocab_size), float("-inf"), device=logits.device)
        full[:, self.keep] = logits
        return full

    def _length(self) -> int:
        return self.cache.length

    def _crop(self, n: int) -> None:
        self.cache.crop(n)


def build(config: dict, keep: torch.Tensor) -> DistilledLM:
    try:
        return DistilledLM(DistilledConfig(**config), keep)
    except TypeError as e:
        raise SpecvizError(f"distilled draft model config is not understood: {e}") from None


def config_of(model: DistilledLM) -> dict:
    return asdict(model.config)


def drafter_from(config: dict, state_dict: dict, target_loaded) -> DistilledDrafter:
    """A drafter from a saved config and weights, attached to `target_loaded`'s embeddings."""
    if "keep" not in state_dict:
        raise SpecvizError("distilled draft model file has no 'keep' token subset")
    model = build(config, state_dict["keep"])
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise SpecvizError(f"distilled draft model weights do not match its config "
                           f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    model = model.float().eval().requires_grad_(False).to(target_loaded.device)
    return DistilledDrafter(model.attach(target_loaded.model))
