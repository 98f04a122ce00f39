"""What the three decoders here share: the KV cache, rotary embeddings, RMSNorm, the causal mask.

The target's fast path (llama_fast.py), the distilled draft model and the EAGLE head all
keep keys and values preallocated and indexed by position (gpt-fast's layout): appending
is a slice write, a rollback is a length reset, and a tree's accepted path is a row gather.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_BLOCK = 256  # a cache grows in blocks of this many positions (doubling), never per token


class KVCache:
    """Keys and values per layer, (kv_heads, capacity, head_dim), valid up to `length`."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype=torch.float32, device=None):
        self.n_layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
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


def write(k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, k: torch.Tensor, v: torch.Tensor):
    """Store one layer's new keys and values (kv_heads, t, head_dim) at positions start..start+t;
    return that layer's keys and values up to there (views: what attention reads)."""
    end = start + k.shape[-2]
    k_cache[:, start:end] = k
    v_cache[:, start:end] = v
    return k_cache[:, :end], v_cache[:, :end]


def causal_mask(t: int, start: int, device) -> torch.Tensor | None:
    """Row i (position start+i) sees positions 0..start+i; None for a single new token."""
    if t == 1:
        return None
    cols = torch.arange(start + t, device=device)
    rows = torch.arange(start, start + t, device=device)
    return cols[None, :] <= rows[:, None]


def inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """RoPE's rotation speed per pair of channels: theta^(-2i/head_dim)."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)


def rotary(inv_freq: torch.Tensor, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (t, head_dim) of each position's angles, for `rope`."""
    angles = positions.float()[:, None] * inv_freq[None]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x_i, x_{i+d/2}) of the last axis by its position's angle."""
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated: what `rope_rolled` multiplies the rolled x by."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rope_rolled(x: torch.Tensor, cos: torch.Tensor, ssin: torch.Tensor) -> torch.Tensor:
    """`rope` with the sign folded into sin once per forward (ssin = signed_sin(sin)): the pair swap
    is a roll, so a rotation is four ops instead of six, and bit for bit rope's (and transformers')
    result: (-b) * s and b * (-s) round alike, and the sum is the same sum (addcmul would fuse it)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * ssin


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps). For float32 PyTorch's fused op: the same maths in
    one kernel instead of six (~10 us a call on this project's CPUs instead of ~21)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    # Half precision: square in float32 (a residual stream's largest values overflow fp16 squared).
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(size)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
