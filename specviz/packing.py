"""Pre-packed weights for the CPU's few-row matrix multiplies (the fast path's linears).

A verify step multiplies 2-17 rows by every weight matrix. From 4 rows up MKL's sgemm
takes a kernel that, by all appearances, repacks the weight on every call: a step costs
1.5-2x a one-token step on this project's CPUs. Packing each weight once (MKL's
packed-GEMM API, the one inductor uses when it freezes a CPU model) drops that to ~1.3x:
the verify cost is what decides whether a draft pays. The packed copy is ~3x the
weight's size, so only models whose packed copies fit PACK_BUDGET (and a quarter of the
RAM) are packed; SPECVIZ_PACK=0 turns packing off.
"""
from __future__ import annotations

import os
import weakref

import torch
import torch.nn.functional as F
from torch import nn

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
