"""Pre-packed weights for the CPU's few-row matrix multiplies (the fast path's linears).

A verify step multiplies 2-17 rows by every weight matrix. From 4 rows up MKL's sgemm
takes a kernel that, by all appearances, repacks the weight on every call: a step costs
1.5-2x a one-token step on this project's CPUs. Packing each weight once (MKL's
packed-GEMM API, the one inductor uses when it freezes a CPU model) drops that to ~1.3x:
the verify cost is what decides whether a draft pays. The packed copy is ~3x the
weight's size, so only models whose packed copies fit PACK_BUDGET (and a quarter of the
RAM) are packed; SPECVIZ_PACK=0 turns packing off. Below 4 rows a packed model's wide
weights go through transposed copies instead (few_row_linear, at the end of this file).
"""
from __future__ import annotations

import os
import weakref

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

PACK_BUDGET = 4 << 30  # bytes of packed copies at most (SmolLM2-135M needs ~1.6 GB)
_PACK_MIN = 4  # fewer rows take few_row_linear (below): MKL runs them as per-row GEMVs, packed or not
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
        # MKL reserves up to 3x the weights for packed copies (~1.3x resident, measured); the
        # few-row transposed copies of the wide weights (~0.8x) fit in what it leaves.
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
    """[m(x) for m in modules]: as one packed multiply from _PACK_MIN rows when there is a
    current packed copy; below that, for a packed model, through few_row_linear."""
    entry = table.get(modules) if table else None
    if entry is not None and x.shape[0] < _PACK_MIN:  # packed models only: they passed the memory check
        return [few_row_linear(x, m.weight, m.bias) for m in modules]
    if entry is None or not entry.fresh():
        return [m(x) for m in modules]  # not packed, or a weight changed since: the modules' own path
    return entry(x)


# One to three rows: MKL runs a multiply by a (out, in) weight as one GEMV per row, and
# for a wide weight (out >= in: LM heads, gate/up) that GEMV streams the weight at about
# half the speed it streams the weight's transpose: measured on this project's CPUs, a
# 49152 x 576 LM head takes 11 ms a row through F.linear and 5.5 ms through x @ W.T held
# contiguous (an 8192-row draft vocabulary: 2.0 vs 0.95 ms). From 4 rows MKL switches to
# a GEMM kernel whose cost barely grows with rows, and F.linear (or the packed copy) wins.
FEW_ROWS_BUDGET = 512 << 20  # bytes a transposed copy may take
_transposed = WeakIdKeyDictionary()  # weight -> (stamp, transposed copy); tensors compare by identity


def few_row_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """A contiguous transposed copy of a wide CPU fp32 `weight` (made once, remade if the
    weight changes in place), or None where F.linear is the better path."""
    if (weight.requires_grad and torch.is_grad_enabled()  # training: gradients go through the weight
            or weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.dim() != 2
            or weight.shape[0] < weight.shape[1] or 4 * weight.numel() > FEW_ROWS_BUDGET
            or os.environ.get("SPECVIZ_PACK", "1") == "0"):
        return None
    # (inference tensors keep no version counter; nothing outside inference mode may change them)
    stamp = (weight.data_ptr(), 0 if weight.is_inference() else weight._version)
    entry = _transposed.get(weight)
    if entry is None or entry[0] != stamp:
        with torch.no_grad():
            entry = (stamp, weight.detach().t().contiguous())
        _transposed[weight] = entry
    return entry[1]


def few_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), through the weight's transposed copy for 1-3 rows."""
    if x.numel() < _PACK_MIN * x.shape[-1]:
        t = few_row_weight(weight)
        if t is not None:
            out = x @ t
            return out if bias is None else out + bias
    return F.linear(x, weight, bias)


def linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """module(x), through few_row_linear: for drafters' layers, which run 1-3 rows a call."""
    return few_row_linear(x, module.weight, module.bias)
